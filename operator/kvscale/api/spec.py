"""`LLMDeployment.spec`: what a platform team asks for. Field docs become the CRD's descriptions."""

from __future__ import annotations

import itertools
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from kvscale.api.base import ApiModel
from kvscale.errors import InvalidSpecError

PERCENTILE_KEY = re.compile(r"p[0-9]+(\.[0-9]+)?")
API_GROUP = "kvscale.dev"
API_VERSION = "v1alpha1"
KIND = "LLMDeployment"


class Precision(StrEnum):
    """Weight precision. Quantized formats include their scale overhead in the memory model."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"
    MXFP4 = "mxfp4"


class KvCacheDtype(StrEnum):
    """KV-cache element type: `auto` follows the activations (16-bit), `fp8` halves KV memory."""

    AUTO = "auto"
    FP8 = "fp8"


class ScalingMode(StrEnum):
    """Auto acts on replicas; Recommend only writes the decision to status; Off does nothing."""

    AUTO = "Auto"
    RECOMMEND = "Recommend"
    OFF = "Off"


class ReplanMode(StrEnum):
    """Re-planning on the served traffic: Recommend re-runs the planner on the observed workload and
    reports a cheaper configuration in status.recommendation; Auto also moves to it (a second Deployment);
    Off never re-plans."""

    RECOMMEND = "Recommend"
    AUTO = "Auto"
    OFF = "Off"


class ForecastMode(StrEnum):
    """Which arrival-rate forecast the scaler sizes for: Auto picks, per deployment, the one with the
    lowest rolling backtest loss on its own history; the others pin one."""

    AUTO = "Auto"
    LAST_VALUE = "LastValue"
    HOLT_WINTERS = "HoltWinters"
    BURST_ENVELOPE = "BurstEnvelope"


class Engine(StrEnum):
    """Serving engine that runs the model: vLLM or SGLang."""

    VLLM = "vllm"
    SGLANG = "sglang"


class ConfigMapKeyRef(ApiModel):
    """A Hugging Face config.json stored in a ConfigMap of the resource's namespace."""

    name: Annotated[str, Field(min_length=1, description="ConfigMap name.")]
    key: Annotated[str, Field(min_length=1, description="Key holding the config.json text.")] = "config.json"


class ModelSection(ApiModel):
    """Which model to serve, where its architecture comes from, and at what precision."""

    name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=256,
            description="Catalog id or Hugging Face repo id (case-insensitive), e.g. "
            "meta-llama/Llama-3.1-70B-Instruct. Served under this name.",
        ),
    ]
    architecture: Annotated[
        dict[str, Any] | None,
        Field(
            description="Inline Hugging Face config.json contents; overrides the catalog. "
            "Use for models the catalog lacks.",
            json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
        ),
    ] = None
    config_path: Annotated[
        str | None,
        Field(description="Path to a config.json on the planner's machine (CLI use)."),
    ] = None
    config_map_ref: Annotated[
        ConfigMapKeyRef | None,
        Field(description="ConfigMap holding the model's config.json (operator use)."),
    ] = None
    precision: Annotated[
        Precision | None,
        Field(description="Weight precision; defaults to the checkpoint's native precision."),
    ] = None
    kv_cache_dtype: Annotated[
        KvCacheDtype, Field(description="KV-cache dtype: auto (16-bit) or fp8.")
    ] = KvCacheDtype.AUTO

    @model_validator(mode="after")
    def _one_architecture_source(self) -> ModelSection:
        given = [n for n, v in (("architecture", self.architecture), ("configPath", self.config_path),
                                ("configMapRef", self.config_map_ref)) if v is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of architecture, configPath, configMapRef (got {given})")
        return self


class GpuSection(ApiModel):
    """Which accelerators the planner may choose from, and their prices."""

    types: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=64)]],
        Field(
            min_length=1,
            max_length=16,
            description="Candidate GPU types from the catalog (e.g. H100-SXM, L4); the planner "
            "picks the cheapest one that meets the SLOs.",
        ),
    ]
    per_node: Annotated[
        int,
        Field(ge=1, le=16, description="GPUs per node: the largest tensor-parallel degree allowed; a replica "
              "larger than one node spans whole nodes (tensor parallel within, pipeline parallel across)."),
    ] = 8
    inter_node_gbit_per_s: Annotated[
        float | None,
        Field(gt=0, le=10000, description="Network bandwidth between nodes per GPU, one direction, in "
              "gigabits/s (e.g. 400 for one 400 Gb/s InfiniBand NIC per GPU), overriding the catalog's "
              "figure for every candidate type. Used for replicas that span nodes."),
    ] = None
    price_usd_per_hour: Annotated[
        dict[str, Annotated[float, Field(gt=0)]],
        Field(description="Hourly price per GPU by type, overriding the catalog's default price."),
    ] = Field(default_factory=dict)


class SloSection(ApiModel):
    """Latency targets the plan and the autoscaler must keep."""

    ttft_ms: Annotated[float, Field(gt=0, le=600_000, description="Time-to-first-token target, ms.")]
    tpot_ms: Annotated[
        float, Field(gt=0, le=60_000, description="Time-per-output-token (inter-token latency) target, ms.")
    ]
    percentile: Annotated[
        float, Field(ge=50, le=99.9, description="Percentile at which both targets must hold.")
    ] = 95.0


class WorkloadSection(ApiModel):
    """The expected traffic: arrival rate and request shape."""

    requests_per_second: Annotated[
        float, Field(ge=0, le=1_000_000, description="Expected mean arrival rate, requests/s.")
    ]
    peak_requests_per_second: Annotated[
        float | None,
        Field(
            ge=0,
            le=1_000_000,
            description="Expected arrival rate of the busiest minute, requests/s (at least the mean). The plan "
            "starts this many replicas' worth of capacity, since a replica takes minutes to start; the "
            "autoscaler then follows the live load.",
        ),
    ] = None
    input_tokens: Annotated[int, Field(ge=1, le=10_000_000, description="Mean prompt length, tokens.")]
    output_tokens: Annotated[int, Field(ge=1, le=1_000_000, description="Mean output length, tokens.")]
    max_context_tokens: Annotated[
        int | None,
        Field(
            ge=16,
            le=10_000_000,
            description="Longest prompt+output to support (vLLM --max-model-len); defaults to the "
            "model's maximum, clamped to what fits in memory.",
        ),
    ] = None

    prefix_cache_hit_rate: Annotated[
        float,
        Field(
            ge=0,
            le=0.99,
            description="Share of prompt tokens served from vLLM's prefix cache (shared system prompts, "
            "multi-turn history, agent scaffolds), 0 to 0.99. It lowers the prefill work and the KV blocks a "
            "request holds of its own. Once vLLM's prefix_cache_hits/queries counters are scraped the "
            "operator uses the measured rate instead and reports it in status.observed.",
        ),
    ] = 0.0
    input_tokens_percentiles: Annotated[
        dict[str, int] | None,
        Field(
            max_length=16,
            description="Known percentiles of the prompt lengths, tokens, keyed p<percentile> (e.g. {p50: "
            "1020, p90: 2730, p99: 4140}, from your request logs). Latency percentiles are computed over "
            "this length mix; without it prompts are taken as exponential around inputTokens.",
        ),
    ] = None
    output_tokens_percentiles: Annotated[
        dict[str, int] | None,
        Field(
            max_length=16,
            description="Known percentiles of the output lengths, tokens, keyed like inputTokensPercentiles. "
            "Short outputs set the TPOT percentile (a prompt chunk divided by few tokens), so state the low "
            "ones too (p1): below the lowest stated percentile the mix is extended along its first segment. "
            "Without it outputs are taken as geometric around outputTokens.",
        ),
    ] = None

    @field_validator("input_tokens_percentiles", "output_tokens_percentiles")
    @classmethod
    def _percentiles_well_formed(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        if value is None:
            return None
        points = []
        for key, tokens in value.items():
            if not PERCENTILE_KEY.fullmatch(key) or not 0 < float(key[1:]) < 100:
                raise ValueError(f"percentile key {key!r}: use p<percentile> between 0 and 100, e.g. p50 or p99.9")
            if tokens < 1:
                raise ValueError(f"{key}: {tokens} tokens; lengths are at least 1")
            points.append((float(key[1:]), tokens, key))
        points.sort()
        for (_, low, low_key), (_, high, high_key) in itertools.pairwise(points):
            if high < low:
                raise ValueError(f"{high_key} ({high}) is below {low_key} ({low}): percentiles must not decrease")
        return value

    @staticmethod
    def percentile_points(value: dict[str, int] | None) -> tuple[tuple[float, float], ...]:
        """(probability, tokens) pairs, in order."""
        return tuple(sorted((float(k[1:]) / 100.0, float(v)) for k, v in (value or {}).items()))

    @property
    def planned_requests_per_second(self) -> float:
        """The rate the plan's replicas are sized for: the peak when known, else the mean."""
        return max(self.requests_per_second, self.peak_requests_per_second or 0.0)

    @model_validator(mode="after")
    def _peak_is_not_below_the_mean(self) -> WorkloadSection:
        if self.peak_requests_per_second is not None and self.peak_requests_per_second < self.requests_per_second:
            raise ValueError(
                f"peakRequestsPerSecond ({self.peak_requests_per_second:g}) must be at least requestsPerSecond "
                f"({self.requests_per_second:g})"
            )
        return self

    @model_validator(mode="after")
    def _context_holds_mean_request(self) -> WorkloadSection:
        if self.max_context_tokens is not None and self.max_context_tokens < self.input_tokens + self.output_tokens:
            raise ValueError(
                f"maxContextTokens ({self.max_context_tokens}) must be at least inputTokens + outputTokens "
                f"({self.input_tokens + self.output_tokens})"
            )
        return self


# Why minReplicas has a floor of 1, said the same way by the CRD (CEL) and by the pydantic validator.
SCALE_TO_ZERO = ("Scale to zero is not supported: with no replica nothing is scraped, so nothing would bring "
                 "the deployment back when requests arrive. Use 1 or more (spec.replicas: 0 with mode Off "
                 "stops it by hand).")


class ScalingSection(ApiModel):
    """Replica bounds and the autoscaler's behaviour."""

    min_replicas: Annotated[
        int,
        Field(ge=1, le=1000, description="Fewest replicas, even when idle: at least 1. " + SCALE_TO_ZERO),
    ] = 1
    max_replicas: Annotated[int, Field(ge=1, le=1000, description="Most replicas the scaler may run.")] = 10
    mode: Annotated[ScalingMode, Field(description="Auto, Recommend or Off.")] = ScalingMode.AUTO
    scale_up_stabilization_seconds: Annotated[
        int, Field(ge=0, le=3600, description="Highest recommendation over this window is used to scale up.")
    ] = 0
    scale_down_stabilization_seconds: Annotated[
        int, Field(ge=0, le=86_400, description="Scale down only to the highest recommendation in this window.")
    ] = 300
    headroom: Annotated[
        float, Field(ge=0, le=1, description="Spare capacity kept above demand, as a fraction (0.2 = 20%).")
    ] = 0.1
    arrival_burstiness: Annotated[
        float, Field(ge=1, le=100, description="The plan and the autoscaler size replicas for arrivals this "
                     "bursty: the squared coefficient of variation of the gaps between requests (1: Poisson). Bursts "
                     "lengthen the prefill queue, and so the TTFT, by Kingman's GI/G/1 factor; a deployment its TPOT "
                     "binds barely feels it. The default is tuned on the autoscaling benchmark's tuning cases "
                     "(docs/benchmarks.md).")
    ] = 1.25
    scale_down_tolerance: Annotated[
        float, Field(ge=0, le=0.5, description="A replica goes only when the fewer left would carry the demand "
                     "(with headroom) below (1 - this) of their goodput: Kubernetes HPA's default tolerance, so that "
                     "a minute's noise in the arrivals or the calibrated goodput does not remove a replica the next "
                     "minutes start again. 0: scale down as soon as the demand fits.")
    ] = 0.1
    scale_down_period_seconds: Annotated[
        int, Field(ge=0, le=3_600, description="At most one scale-down step (a quarter of the replicas, at least "
                   "one) per this many seconds, as Kubernetes HPA's behavior.scaleDown policy periodSeconds: a "
                   "fleet a burst raised leaves over minutes once the window lets it, so a burst that returns "
                   "soon after still finds part of it. 0: a step at every decision.")
    ] = 120
    # At most a day: the policy keeps a day of per-minute arrivals (kvscale.autoscaler.forecast), so a longer
    # window would never be covered and the floor would never lift.
    stated_load_floor_seconds: Annotated[
        int, Field(ge=0, le=86_400, description="Until the arrivals history (per-minute, read back from "
                   "Prometheus after a restart) covers this many seconds (at most a day, the history kept), scale "
                   "down no lower than the replicas planned for the stated workload (its peak where stated, else "
                   "its mean), or for the busiest peak minute seen so far (above 1.5x the median minute) where that is "
                   "busier: the statement and the peaks seen are the only evidence of the peaks that history has "
                   "not shown yet. 0: trust the observed load from the start.")
    ] = 3_600
    forecaster: Annotated[
        ForecastMode,
        Field(description="Arrival-rate forecast sized for one measured replica start-up ahead: Auto (the "
              "lowest rolling backtest loss on this deployment's history), LastValue (purely reactive), "
              "HoltWinters (level, damped trend, daily season) or BurstEnvelope (the recent peak)."),
    ] = ForecastMode.AUTO
    replan: Annotated[
        ReplanMode,
        Field(description="Recommend: re-run the planner on the traffic served (calibrated request shape, "
              "per-minute rates of the last day, measured prefix-cache hits) within spec.gpu.types and the "
              "replica bounds, and report a configuration that costs at least replanMinSavings less, sustained "
              "for replanSustainSeconds, in status.recommendation (not applied). Auto: the same, then move to it: "
              "a second Deployment comes up beside the running one, and the old one drains and goes once the new "
              "one is Ready (at most one move per replanMoveIntervalSeconds). Off: never."),
    ] = ReplanMode.RECOMMEND
    replan_min_savings: Annotated[
        float, Field(ge=0.01, le=0.9, description="Recommend another configuration only when it costs at least "
                     "this fraction less than the running one on the observed traffic (0.15 = 15%).")
    ] = 0.15
    replan_sustain_seconds: Annotated[
        int, Field(ge=0, le=7 * 86_400, description="The saving must hold at every re-plan over this window "
                   "before it is recommended (a passing change of traffic recommends nothing).")
    ] = 1800
    replan_interval_seconds: Annotated[
        int, Field(ge=30, le=86_400, description="Re-plan at most this often, and sooner when the calibrated "
                   "request shape moves more than 20% from the one last planned on.")
    ] = 300
    replan_min_history_seconds: Annotated[
        int, Field(ge=60, le=86_400, description="Recommend only once the per-minute arrivals kept cover this "
                   "much served time (a whole daily cycle by default: priced on part of a day, a configuration "
                   "sized for its quiet hours can lose at its peak). Re-plans before then are reported, not "
                   "recommended.")
    ] = 86_400
    replan_move_interval_seconds: Annotated[
        int, Field(ge=60, le=7 * 86_400, description="Auto: at most one move (or rolled-back attempt) per this "
                   "interval, so a noisy workload cannot make the deployment flap between configurations.")
    ] = 21_600
    replan_move_timeout_seconds: Annotated[
        int, Field(ge=60, le=86_400, description="Auto: a move whose new replicas are not all Ready within this "
                   "is rolled back (the new Deployment deleted, the running one kept).")
    ] = 1_800

    @field_validator("min_replicas", mode="before")
    @classmethod
    def _no_scale_to_zero(cls, value: Any) -> Any:
        if value == 0 and not isinstance(value, bool):
            raise ValueError(f"minReplicas 0: {SCALE_TO_ZERO}")
        return value

    @model_validator(mode="after")
    def _bounds_ordered(self) -> ScalingSection:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"minReplicas ({self.min_replicas}) exceeds maxReplicas ({self.max_replicas})")
        return self


class EnvVar(ApiModel):
    """An environment variable set in the serving container."""

    name: Annotated[
        str, Field(min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$", description="Variable name.")
    ]
    value: Annotated[str, Field(description="Variable value (empty by default).")] = ""


class Toleration(ApiModel):
    """A Kubernetes pod toleration (core/v1 Toleration), copied onto the serving pods."""

    key: Annotated[str | None, Field(description="Taint key to tolerate; empty with Exists matches all.")] = None
    operator: Annotated[
        str | None, Field(pattern=r"^(Exists|Equal)$", description="Exists or Equal (default Equal).")
    ] = None
    value: Annotated[str | None, Field(description="Taint value to match when the operator is Equal.")] = None
    effect: Annotated[
        str | None,
        Field(
            pattern=r"^(NoSchedule|PreferNoSchedule|NoExecute)$",
            description="Taint effect to match: NoSchedule, PreferNoSchedule or NoExecute; empty matches all.",
        ),
    ] = None
    toleration_seconds: Annotated[
        int | None, Field(description="For NoExecute: how long the pod stays bound after the taint appears.")
    ] = None


class ServingSection(ApiModel):
    """How the serving pods are run: engine, image, pinned engine settings and pod overrides."""

    engine: Annotated[Engine, Field(description="Serving engine: vllm or sglang.")] = Engine.VLLM
    image: Annotated[
        str | None,
        Field(min_length=1, description="Container image; defaults to the engine's pinned release image."),
    ] = None
    tensor_parallel: Annotated[
        int | None,
        Field(ge=1, le=64, description="Pin the tensor-parallel degree instead of letting the planner choose."),
    ] = None
    pipeline_parallel: Annotated[
        int | None,
        Field(ge=1, le=16, description="Pin the pipeline-parallel degree (nodes per replica; 1: single-node "
              "replicas only) instead of letting the planner choose."),
    ] = None
    data_parallel: Annotated[
        int | None,
        Field(ge=1, le=256, description="Pin the data-parallel engines per replica of an MoE model (vLLM "
              "--data-parallel-size with --enable-expert-parallel; 1: no data parallel) instead of letting the "
              "planner choose."),
    ] = None
    max_num_seqs: Annotated[
        int | None, Field(ge=1, le=4096, description="Pin max-num-seqs instead of letting the planner choose.")
    ] = None
    gpu_memory_utilization: Annotated[
        float | None, Field(gt=0.1, le=0.99, description="Pin --gpu-memory-utilization (default 0.90).")
    ] = None
    extra_args: Annotated[list[str], Field(description="Extra engine arguments, appended last.")] = Field(
        default_factory=list
    )
    env: Annotated[list[EnvVar], Field(description="Extra environment variables.")] = Field(default_factory=list)
    resources: Annotated[
        dict[str, dict[str, str]],
        Field(description="Extra container requests/limits (cpu, memory); GPUs are set from the plan."),
    ] = Field(default_factory=dict)
    node_selector: Annotated[
        dict[str, str], Field(description="Added to the planned GPU product selector.")
    ] = Field(default_factory=dict)
    tolerations: Annotated[list[Toleration], Field(description="Pod tolerations.")] = Field(default_factory=list)

    @field_validator("resources")
    @classmethod
    def _known_resource_sections(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        unknown = set(value) - {"requests", "limits"}
        if unknown:
            raise ValueError(f"resources allows only 'requests' and 'limits', got {sorted(unknown)}")
        return value


class LLMDeploymentSpec(ApiModel):
    """What a platform team asks for: a model, candidate GPUs, latency targets and the expected load."""

    model: Annotated[ModelSection, Field(description="The model to serve.")]
    gpu: Annotated[GpuSection, Field(description="Candidate GPU types and prices.")]
    slo: Annotated[SloSection, Field(description="Latency targets (TTFT and TPOT at a percentile).")]
    workload: Annotated[WorkloadSection, Field(description="Expected traffic the plan is sized for.")]
    scaling: Annotated[ScalingSection, Field(description="Replica bounds and autoscaling behaviour.")] = Field(
        default_factory=ScalingSection
    )
    serving: Annotated[
        ServingSection, Field(description="Serving engine, image and pod settings.")
    ] = Field(default_factory=ServingSection)
    replicas: Annotated[
        int | None,
        Field(
            ge=0,
            le=1000,
            description="Manual replica count used when scaling.mode is Off, and the target of "
            "kubectl scale / HPA (the scale subresource's spec.replicas; its GET answers once this is set).",
        ),
    ] = None


class ObjectMeta(ApiModel):
    """The parts of Kubernetes object metadata kvscale reads; the rest is kept as given."""

    model_config = ApiModel.model_config | {"extra": "allow"}

    name: Annotated[str, Field(min_length=1, max_length=63, description="Resource name.")]
    namespace: Annotated[str | None, Field(description="Namespace of the resource.")] = None


class LLMDeployment(ApiModel):
    """An LLM served on Kubernetes with SLO-driven capacity planning and autoscaling."""

    api_version: Annotated[
        str, Field(pattern=rf"^{API_GROUP}/{API_VERSION}$", description="Always kvscale.dev/v1alpha1.")
    ] = f"{API_GROUP}/{API_VERSION}"
    kind: Annotated[str, Field(pattern=rf"^{KIND}$", description="Always LLMDeployment.")] = KIND
    metadata: Annotated[ObjectMeta, Field(description="Standard object metadata.")]
    spec: Annotated[LLMDeploymentSpec, Field(description="Desired state: model, GPUs, SLOs and workload.")]


def _describe(error: ValidationError) -> str:
    """One line per problem, the path in the resource's own camelCase words."""
    lines = []
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"])
        lines.append(f"{path}: {item['msg']}")
    return "; ".join(lines)


def parse_resource(document: dict[str, Any]) -> LLMDeployment:
    """Validate a resource dict; errors name each field (e.g. `spec.slo.ttftMs`) and what is allowed."""
    # A live object carries a status the operator writes; the spec is what is validated here.
    desired = {key: value for key, value in document.items() if key != "status"}
    try:
        return LLMDeployment.model_validate(desired)
    except ValidationError as exc:
        raise InvalidSpecError(f"invalid {KIND}: {_describe(exc)}") from exc


def parse_spec(spec: dict[str, Any]) -> LLMDeploymentSpec:
    """Validate only a `spec` mapping (as kopf hands it over); errors are prefixed with `spec.`."""
    try:
        return LLMDeploymentSpec.model_validate(spec)
    except ValidationError as exc:
        lines = [f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise InvalidSpecError(f"invalid {KIND}: {'; '.join(lines)}") from exc


def load_resource(path: Path) -> LLMDeployment:
    """Read one LLMDeployment from a YAML file (the first document of that kind)."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidSpecError(f"cannot read {path}: {exc}") from exc
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == KIND:
            return parse_resource(document)
    raise InvalidSpecError(f"{path} holds no {KIND} resource")
