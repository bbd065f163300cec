"""`LLMDeployment.status`: what the operator planned, predicted, observed and decided.

No `phase`: the state is told by typed conditions (Kubernetes API conventions), each with a
CamelCase reason and the generation it was computed for. Field docs become the CRD's descriptions.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, ConfigDict, Field

from kvscale.api.base import ApiModel

# metav1.Condition's own limits and patterns (k8s.io/apimachinery/pkg/apis/meta/v1/types.go).
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
CONDITION_MESSAGE_MAX_CHARS = 32768


def _check_rfc3339(value: str) -> str:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(f"not an RFC 3339 time: {value!r}") from exc
    if parsed.tzinfo is None or "T" not in value:
        raise ValueError(f"not an RFC 3339 time (needs a date, a 'T' and a zone): {value!r}")
    return value


Rfc3339 = Annotated[str, AfterValidator(_check_rfc3339), Field(json_schema_extra={"format": "date-time"})]
"""A timestamp as Kubernetes writes it, e.g. 2025-01-31T12:00:00Z."""


class StatusModel(ApiModel):
    """Status values ignore unknown fields: a status written by a newer operator (or kopf's own
    `status.kopf` bookkeeping) must still be readable."""

    model_config = ApiModel.model_config | ConfigDict(extra="ignore")


class SpeedFitSource(StrEnum):
    """What the calibrated speed factors were last fitted from."""

    ENGINE_COUNTERS = "engine-counters"  # vLLM's work counters (--enable-mfu-metrics) over step times
    LATENCIES = "latencies"  # the mean TPOT and prefill time against the model's


class ConditionStatus(StrEnum):
    """Whether a condition holds: True, False or Unknown."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(StatusModel):
    """One aspect of the resource's state, following the Kubernetes condition conventions."""

    type: Annotated[
        str,
        Field(
            min_length=1,
            max_length=316,
            pattern=CONDITION_TYPE_PATTERN,
            description="Condition type in CamelCase: Planned, Ready, Infeasible, InsufficientCapacity, "
            "MetricsUnavailable, InvalidSpec or WriteFailed.",
        ),
    ]
    status: Annotated[ConditionStatus, Field(description="True, False or Unknown.")]
    reason: Annotated[
        str,
        Field(
            min_length=1,
            max_length=1024,
            pattern=CONDITION_REASON_PATTERN,
            description="Machine-readable CamelCase cause of the last transition.",
        ),
    ]
    message: Annotated[
        str, Field(max_length=CONDITION_MESSAGE_MAX_CHARS, description="Human-readable details.")
    ] = ""
    last_transition_time: Annotated[
        Rfc3339, Field(description="When the status last changed (RFC 3339); unchanged while it holds.")
    ]
    observed_generation: Annotated[
        int | None,
        Field(ge=0, description="metadata.generation of the spec this condition was computed from."),
    ] = None


class PlanStatus(StatusModel):
    """The planner's choice for the current spec (empty GPU fields when no plan is feasible)."""

    feasible: Annotated[bool, Field(description="True when a configuration meets both SLOs within maxReplicas.")]
    gpu_type: Annotated[str | None, Field(description="Chosen GPU type from the catalog, e.g. H100-SXM.")] = None
    tensor_parallel: Annotated[
        int | None, Field(ge=1, description="GPUs per replica within one node (vLLM --tensor-parallel-size).")
    ] = None
    pipeline_parallel: Annotated[
        int | None,
        Field(ge=1, description="Nodes per replica: pipeline stages across nodes (vLLM --pipeline-parallel-size)."),
    ] = None
    data_parallel: Annotated[
        int | None,
        Field(ge=1, description="Data-parallel engines per replica of an MoE model, experts split over all their "
              "GPUs (vLLM --data-parallel-size with --enable-expert-parallel); 1: none."),
    ] = None
    max_num_seqs: Annotated[
        int | None, Field(ge=1, description="Concurrent sequences per engine (vLLM --max-num-seqs; a replica with "
                          "dataParallel engines runs that many times it).")
    ] = None
    max_model_len: Annotated[
        int | None, Field(ge=1, description="Longest prompt+output per request, tokens (vLLM --max-model-len).")
    ] = None
    gpu_memory_utilization: Annotated[
        float | None, Field(gt=0, le=1, description="Fraction of GPU memory the engine may use.")
    ] = None
    replicas: Annotated[int, Field(ge=0, description="Replicas the plan needs for the workload's rate.")] = 0
    gpus: Annotated[int, Field(ge=0, description="GPUs in total: replicas x tensorParallel x pipelineParallel x "
                               "dataParallel.")] = 0
    cost_per_hour: Annotated[
        float | None, Field(ge=0, description="Price of the planned fleet, USD per hour.")
    ] = None
    tokens_per_dollar: Annotated[
        float | None, Field(ge=0, description="SLO-compliant output tokens per dollar at each replica's goodput.")
    ] = None
    binding_constraint: Annotated[
        str,
        Field(
            description="What limits the plan: tpot, ttft, memory, throughput, cost, or replicas "
            "(infeasible within maxReplicas)."
        ),
    ] = ""
    explanation: Annotated[str, Field(description="Why this configuration, or why none works.")] = ""


class PredictedStatus(StatusModel):
    """The performance model's forecast for the plan at the workload's rate (at spec.slo.percentile)."""

    ttft_ms: Annotated[float, Field(ge=0, description="Predicted time to first token, ms.")]
    tpot_ms: Annotated[float, Field(ge=0, description="Predicted time per output token, ms.")]
    output_tokens_per_s: Annotated[float, Field(ge=0, description="Predicted fleet output rate, tokens/s.")]
    output_tokens_per_s_per_gpu: Annotated[
        float, Field(ge=0, description="Predicted output rate per GPU, tokens/s.")
    ]


class ObservedStatus(StatusModel):
    """What the serving pods reported to Prometheus in the last sample (absent metrics stay empty)."""

    ttft_at_slo_percentile_ms: Annotated[
        float | None, Field(ge=0, description="Observed time to first token at spec.slo.percentile, ms.")
    ] = None
    tpot_at_slo_percentile_ms: Annotated[
        float | None, Field(ge=0, description="Observed time per output token at spec.slo.percentile, ms.")
    ] = None
    # The names say p95 from when the SLO percentile was fixed at 95; readers of them keep working for a
    # release, with the value the new fields hold.
    ttft_p95_ms: Annotated[float | None, Field(ge=0, description=(
        "Deprecated: use ttftAtSloPercentileMs, which holds the same value. Observed time to first token at "
        "spec.slo.percentile (p95 only where that is 95), ms."))] = None
    tpot_p95_ms: Annotated[float | None, Field(ge=0, description=(
        "Deprecated: use tpotAtSloPercentileMs, which holds the same value. Observed time per output token at "
        "spec.slo.percentile (p95 only where that is 95), ms."))] = None
    requests_per_second: Annotated[
        float | None, Field(ge=0, description="Observed arrival rate over all replicas, requests/s.")
    ] = None
    kv_cache_usage: Annotated[
        float | None, Field(ge=0, le=1, description="Mean KV-cache fill over replicas, 0 to 1.")
    ] = None
    running_requests: Annotated[
        float | None, Field(ge=0, description="Requests being decoded, summed over replicas.")
    ] = None
    waiting_requests: Annotated[
        float | None, Field(ge=0, description="Requests queued, summed over replicas.")
    ] = None
    aborted_per_second: Annotated[
        float | None, Field(ge=0, description="Requests the clients abandoned (vLLM finished_reason abort), "
                                              "requests/s over all replicas; not counted as served.")
    ] = None
    failed_per_second: Annotated[
        float | None, Field(ge=0, description="Requests the engine failed (finished_reason error), requests/s "
                                              "over all replicas; not counted as served.")
    ] = None
    tpot_mean_ms: Annotated[
        float | None, Field(ge=0, description="Observed mean time per output token, ms (exact: the histogram's "
                                              "sum over its count).")
    ] = None
    prefix_cache_hit_rate: Annotated[
        float | None, Field(ge=0, le=1, description="Share of prompt tokens served from the prefix cache (vLLM's "
                                                    "prefix_cache_hits over prefix_cache_queries), 0 to 1.")
    ] = None
    within_slo_pct: Annotated[
        float | None,
        Field(ge=0, le=100, description="Share of the window's requests that met both SLOs, %: the error budget's "
                                        "view. Read from the TTFT and per-request TPOT histograms, linear inside "
                                        "the bucket that holds each SLO; a request that missed both counts twice, "
                                        "so it errs low. Empty where either histogram is absent.")
    ] = None
    below_resolution: Annotated[
        list[str] | None,
        Field(description="Percentiles the engine's histogram buckets cannot resolve (they fell in the first "
                          "bucket), each with the bound that is known; their fields above stay empty and "
                          "neither calibration nor scaling uses them.")
    ] = None
    sampled_at: Annotated[Rfc3339, Field(description="When the metrics were sampled (RFC 3339).")]

    @property
    def ttft_ms(self) -> float | None:
        """TTFT at the SLO percentile, read from a status an older operator wrote too."""
        return self.ttft_at_slo_percentile_ms if self.ttft_at_slo_percentile_ms is not None else self.ttft_p95_ms

    @property
    def tpot_ms(self) -> float | None:
        """TPOT at the SLO percentile, read from a status an older operator wrote too."""
        return self.tpot_at_slo_percentile_ms if self.tpot_at_slo_percentile_ms is not None else self.tpot_p95_ms


class CalibrationStatus(StatusModel):
    """Speed factors fitted from observations, applied to the model's achieved bandwidth and compute."""

    decode_factor: Annotated[
        float, Field(gt=0, description="Decode speed relative to the model's defaults (>1: faster than predicted).")
    ]
    prefill_factor: Annotated[
        float, Field(gt=0, description="Prefill speed relative to the model's defaults (>1: faster than predicted).")
    ]
    tpot_tail_factor: Annotated[
        float | None, Field(gt=0, description="Observed / modelled SLO-percentile TPOT (>1: wider tails).")
    ] = None
    ttft_tail_factor: Annotated[
        float | None, Field(gt=0, description="Observed / modelled SLO-percentile TTFT (>1: wider tails).")
    ] = None
    ttft_error_pct: Annotated[
        float | None, Field(description="Signed prefill-time prediction error before the last update, percent.")
    ] = None
    tpot_error_pct: Annotated[
        float | None, Field(description="Signed TPOT prediction error before the last update, percent.")
    ] = None
    fitted_windows: Annotated[
        int | None, Field(ge=0, description="Metric windows the speed factors were fitted from.")
    ] = None
    # The smoothed request shape is state, not just a report: the next cycle (or the next operator,
    # after a restart) continues smoothing from it instead of from one window.
    input_tokens: Annotated[
        float | None, Field(gt=0, description="Mean prompt tokens, smoothed over windows.")
    ] = None
    output_tokens: Annotated[
        float | None, Field(gt=0, description="Mean output tokens, smoothed over windows.")
    ] = None
    input_tokens_tail: Annotated[
        float | None, Field(gt=0, description="Prompt tokens at the SLO percentile, smoothed over windows.")
    ] = None
    prefix_cache_hit_rate: Annotated[
        float | None, Field(ge=0, le=1, description="Share of prompt tokens served from the prefix cache, "
                                                    "smoothed over windows.")
    ] = None
    shape_requests: Annotated[
        float | None, Field(ge=0, description="Finished requests the request shape above is a mean over "
                                              "(each window weighs by its requests; capped: older ones are "
                                              "forgotten at that rate).")
    ] = None
    speed_fit_from: Annotated[
        SpeedFitSource | None,
        Field(description="What the speed factors were last fitted from: engine-counters (vLLM's work counters, "
                          "--enable-mfu-metrics, over its step times) or latencies (mean TPOT and prefill time).")
    ] = None
    achieved_hbm_bandwidth_gbps: Annotated[
        float | None, Field(ge=0, description="Memory bandwidth a GPU achieved in decode steps, GB/s, from the "
                                              "engine's work counters (smoothed over windows).")
    ] = None
    achieved_tflops: Annotated[
        float | None, Field(ge=0, description="Compute a GPU achieved in prompt-chunk steps, TFLOP/s, from the "
                                              "engine's work counters (smoothed over windows).")
    ] = None


class PodStartupStatus(StatusModel):
    """One serving pod's start-up: creation to its first Ready."""

    pod: Annotated[str, Field(min_length=1, description="Pod name.")]
    seconds: Annotated[float, Field(ge=0, description="Seconds from the pod's creation to its first Ready.")]


class StartupStatus(StatusModel):
    """Replica start-up measured on this deployment's own pods: the horizon scale-ups look ahead."""

    p90_seconds: Annotated[
        float, Field(ge=0, description="90th percentile of the recent start-ups, s: how far ahead the "
                                       "autoscaler forecasts (plus one decision interval).")
    ]
    recent: Annotated[
        list[PodStartupStatus],
        Field(description="The most recent start-ups (at most 20), oldest first; kept here so that a restarted "
                          "operator keeps them."),
    ]


class ForecasterErrorStatus(StatusModel):
    """One forecaster's rolling backtest on this deployment's arrivals."""

    forecaster: Annotated[str, Field(description="last-value, holt-winters or burst-envelope.")]
    error_pct: Annotated[
        float | None, Field(ge=0, description="Weighted absolute percentage error at the horizon, percent; "
                                              "empty before any of its forecasts was scored.")
    ] = None


class ForecastStatus(StatusModel):
    """The arrival-rate forecast the replicas were sized for, and how each forecaster has fared."""

    forecaster: Annotated[str, Field(description="The forecaster in use: chosen by backtest (Auto) or pinned.")]
    horizon_seconds: Annotated[float, Field(ge=0, description="How far ahead: start-up p90 plus one decision.")]
    requests_per_second: Annotated[float, Field(ge=0, description="Forecast arrivals/s at the horizon.")]
    backtest_error_pct: Annotated[
        float | None, Field(ge=0, description="The forecaster in use: its rolling backtest error, percent.")
    ] = None
    scored_minutes: Annotated[int, Field(ge=0, description="Minutes of history its backtest has scored.")] = 0
    backtest: Annotated[
        list[ForecasterErrorStatus],
        Field(default_factory=list, description="Every forecaster's rolling backtest error."),
    ]


class ScaleDecisionStatus(StatusModel):
    """The autoscaler's most recent change of the replica count (or recommendation, in Recommend mode)."""

    time: Annotated[Rfc3339, Field(description="When the decision was made (RFC 3339).")]
    from_replicas: Annotated[int, Field(ge=0, description="Replicas before the decision.")]
    to_replicas: Annotated[int, Field(ge=0, description="Replicas the decision asked for.")]
    reason: Annotated[str, Field(description="Why, in words (signal, value and threshold).")]


class ServingFlagsStatus(StatusModel):
    """What a configuration's vLLM launch arguments fix (kvscale.planner.plan.ServingConfiguration)."""

    gpu_type: Annotated[str, Field(description="GPU type.")]
    tensor_parallel: Annotated[int, Field(ge=1, description="Tensor-parallel degree (--tensor-parallel-size).")]
    pipeline_parallel: Annotated[int, Field(ge=1, description="Pipeline-parallel degree (nodes per replica).")] = 1
    data_parallel: Annotated[int, Field(ge=1, description="Data-parallel engines (--data-parallel-size).")] = 1
    max_num_seqs: Annotated[int, Field(ge=1, description="--max-num-seqs.")]
    max_model_len: Annotated[int, Field(ge=1, description="--max-model-len.")]


class ConfigurationCostStatus(ServingFlagsStatus):
    """One serving configuration priced on the served traffic, run as the autoscaler would run it."""

    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1, description="--gpu-memory-utilization.")]
    goodput_requests_per_second: Annotated[
        float, Field(ge=0, description="Requests/s one replica sustains with both SLOs held, calibrated model.")
    ]
    mean_replicas: Annotated[float, Field(ge=0, description="Replicas over the served minutes, on average.")]
    peak_replicas: Annotated[int, Field(ge=0, description="Replicas at the busiest served minute.")]
    cost_per_hour: Annotated[float, Field(ge=0, description="Mean cost over the served minutes, $/h.")]
    minutes_short: Annotated[
        int, Field(ge=0, description="Served minutes whose demand needs more replicas than maxReplicas.")
    ] = 0
    ttft_ms: Annotated[
        float | None, Field(ge=0, description="Predicted TTFT at the SLO percentile at the mean served rate, ms.")
    ] = None
    tpot_ms: Annotated[
        float | None, Field(ge=0, description="Predicted TPOT at the SLO percentile at the mean served rate, ms.")
    ] = None


class ServedWorkloadStatus(StatusModel):
    """The traffic a re-plan was computed on."""

    input_tokens: Annotated[float, Field(ge=0, description="Calibrated mean prompt length, tokens.")]
    output_tokens: Annotated[float, Field(ge=0, description="Calibrated mean output length, tokens.")]
    prefix_cache_hit_rate: Annotated[float, Field(ge=0, le=1, description="Share of prompt tokens cached.")] = 0.0
    requests_per_second: Annotated[float, Field(ge=0, description="Mean arrivals/s over the minutes.")]
    peak_requests_per_second: Annotated[float, Field(ge=0, description="Busiest minute's arrivals/s.")]
    minutes: Annotated[int, Field(ge=0, description="Closed minutes of arrivals priced (the last day at most).")]


class RecommendationStatus(StatusModel):
    """The last re-plan on the served traffic (spec.scaling.replan: Recommend): the running configuration and
    the cheapest the spec allows, both priced on the same traffic; recommended once the saving holds."""

    evaluated_at: Annotated[Rfc3339, Field(description="When the re-plan ran (RFC 3339).")]
    served: Annotated[ServedWorkloadStatus, Field(description="The traffic both configurations were priced on.")]
    current: Annotated[
        ConfigurationCostStatus | None,
        Field(description="The running configuration; empty when it holds no SLO on the served traffic."),
    ] = None
    proposed: Annotated[
        ConfigurationCostStatus | None,
        Field(description="The cheapest configuration the spec allows on the served traffic (may be the running one)."),
    ] = None
    savings_pct: Annotated[float, Field(description="Cost saved by the proposed configuration, % of the current; 0 "
                                        "when the running one holds no SLO on the served traffic (see current).")]
    cheaper_since: Annotated[
        Rfc3339 | None,
        Field(description="Since when every re-plan found a configuration at least replanMinSavings cheaper "
              "than the running one (or the running one holding no SLO on the served traffic)."),
    ] = None
    recommended: Annotated[
        bool, Field(description="The proposal has been at least replanMinSavings cheaper for replanSustainSeconds.")
    ] = False
    reason: Annotated[str, Field(description="Why, in words.")]
    move_blocked: Annotated[
        str | None, Field(description="Auto: why a recommended configuration is not being moved to (no room for "
                          "both fleets, the move interval, a multi-node configuration).")
    ] = None


class MovePhase(StrEnum):
    """Where a move between configurations is (spec.scaling.replan: Auto)."""

    STARTING = "Starting"  # the new Deployment comes up beside the running one
    DRAINING = "Draining"  # the new one is Ready; the old one is scaled to 0 (its pods drain) and then deleted


class ServingConfigurationStatus(ServingFlagsStatus):
    """A configuration re-planning moved to, and the Deployment that runs it."""

    deployment: Annotated[str, Field(description="The Deployment that runs it.")]
    label: Annotated[str, Field(description="Its pods' kvscale.dev/configuration label (in its selector).")]
    generation: Annotated[int, Field(ge=0, description="The spec generation it was chosen under: after a spec "
                                     "edit kvscale plans from the spec again (on the same Deployment).")]


class MoveStatus(StatusModel):
    """A move to a re-planned configuration in progress (spec.scaling.replan: Auto)."""

    phase: Annotated[MovePhase, Field(description="Starting or Draining.")]
    to: Annotated[ServingConfigurationStatus, Field(description="The configuration moved to.")]
    from_deployment: Annotated[str, Field(description="The Deployment being replaced.")]
    replicas: Annotated[int, Field(ge=1, description="The new Deployment's replicas: the demand when the move "
                                   "began (raised if it grows), in replicas of the new configuration.")]
    started_at: Annotated[Rfc3339, Field(description="When the move began (RFC 3339).")]
    message: Annotated[str, Field(description="What the move is doing, in words.")]


class LLMDeploymentStatus(StatusModel):
    """Observed state of an LLMDeployment, written only by the operator."""

    observed_generation: Annotated[
        int | None, Field(ge=0, description="metadata.generation of the spec the status reflects.")
    ] = None
    plan: Annotated[PlanStatus | None, Field(description="The planned configuration.")] = None
    predicted: Annotated[
        PredictedStatus | None, Field(description="Predicted latency and throughput of the plan.")
    ] = None
    observed: Annotated[ObservedStatus | None, Field(description="Latest metrics from the serving pods.")] = None
    calibration: Annotated[
        CalibrationStatus | None, Field(description="Performance-model corrections fitted from metrics.")
    ] = None
    replicas: Annotated[
        int, Field(ge=0, description="Serving pods that exist now (the scale subresource's status.replicas).")
    ] = 0
    ready_replicas: Annotated[int, Field(ge=0, description="Serving pods that pass their readiness probe.")] = 0
    desired_replicas: Annotated[
        int | None, Field(ge=0, description="Replicas the operator wants now (plan, autoscaler or spec.replicas).")
    ] = None
    selector: Annotated[
        str | None,
        Field(description="Label selector of the serving pods, in string form, for the scale subresource (HPA)."),
    ] = None
    ttft_at_slo_percentile_ms: Annotated[
        float | None,
        Field(
            ge=0,
            description="Headline TTFT at spec.slo.percentile, ms: observed when metrics are available, else "
            "the planner's prediction (the TTFT printer column).",
        ),
    ] = None
    tpot_at_slo_percentile_ms: Annotated[
        float | None,
        Field(
            ge=0,
            description="Headline TPOT at spec.slo.percentile, ms: observed when metrics are available, else "
            "the planner's prediction (the TPOT printer column).",
        ),
    ] = None
    ttft_p95_ms: Annotated[
        float | None,
        Field(
            ge=0,
            description="Deprecated: use ttftAtSloPercentileMs, which holds the same value (at "
            "spec.slo.percentile, p95 only where that is 95), ms.",
        ),
    ] = None
    tpot_p95_ms: Annotated[
        float | None,
        Field(
            ge=0,
            description="Deprecated: use tpotAtSloPercentileMs, which holds the same value (at "
            "spec.slo.percentile, p95 only where that is 95), ms.",
        ),
    ] = None
    slo_met: Annotated[
        bool | None, Field(description="Whether the observed latencies meet the SLOs; empty before metrics.")
    ] = None
    last_scale_decision: Annotated[
        ScaleDecisionStatus | None, Field(description="The autoscaler's latest decision.")
    ] = None
    startup: Annotated[
        StartupStatus | None, Field(description="Replica start-up times measured on this deployment's pods.")
    ] = None
    forecast: Annotated[
        ForecastStatus | None, Field(description="The arrival-rate forecast the autoscaler sized for.")
    ] = None
    recommendation: Annotated[
        RecommendationStatus | None,
        Field(description="Re-planning on the served traffic: a cheaper configuration, when one holds the SLOs."),
    ] = None
    serving: Annotated[
        ServingConfigurationStatus | None,
        Field(description="Where the last completed move put the deployment (spec.scaling.replan: Auto); empty "
              "while it runs as planned from the spec on the Deployment named after the resource."),
    ] = None
    move: Annotated[MoveStatus | None, Field(description="A move between configurations in progress.")] = None
    last_move_at: Annotated[
        Rfc3339 | None, Field(description="When the last move ended, completed or rolled back (RFC 3339).")
    ] = None
    conditions: Annotated[
        list[Condition],
        Field(
            description="Planned, Ready, Infeasible, InsufficientCapacity, MetricsUnavailable, InvalidSpec and "
            "WriteFailed (a write of the Deployment or Service the API server refused, with its cause), one entry "
            "per type; only the types the resource's state evaluates are present.",
            json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        ),
    ] = Field(default_factory=list)


def headline_latencies_ms(
    observed: ObservedStatus | None, predicted: PredictedStatus | None
) -> tuple[float | None, float | None]:
    """(TTFT, TPOT) for the printer columns: each observed value when present, else the prediction."""
    ttft = observed.ttft_ms if observed is not None else None
    tpot = observed.tpot_ms if observed is not None else None
    if ttft is None and predicted is not None:
        ttft = predicted.ttft_ms
    if tpot is None and predicted is not None:
        tpot = predicted.tpot_ms
    return ttft, tpot


def headline_latency_fields(ttft_ms: float | None, tpot_ms: float | None) -> dict[str, float | None]:
    """The status update that sets the headline latencies, under their names and their deprecated ones."""
    return {"ttft_at_slo_percentile_ms": ttft_ms, "tpot_at_slo_percentile_ms": tpot_ms,
            "ttft_p95_ms": ttft_ms, "tpot_p95_ms": tpot_ms}
