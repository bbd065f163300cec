"""Plain-language explanations of plans: why this configuration, and why not the others."""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvscale.api.spec import LLMDeploymentSpec
from kvscale.planner.plan import Candidate

_BINDING_WORDS = {
    "tpot": "TPOT reaches its SLO",
    "ttft": "TTFT (queueing + prefill) reaches its SLO",
    "memory": "the KV cache is full",
    "throughput": "the batch is saturated",
    "cost": "price",
}


def _load_words(spec: LLMDeploymentSpec) -> str:
    """The load the replicas are sized for: the mean, or the stated peak beside it."""
    workload = spec.workload
    if workload.peak_requests_per_second is None or workload.peak_requests_per_second <= workload.requests_per_second:
        return f"{workload.requests_per_second:g} req/s"
    return f"a peak of {workload.peak_requests_per_second:g} req/s (mean {workload.requests_per_second:g})"


def _money(value: float) -> str:
    return f"${value:,.2f}/h"


def _replicas_words(c: Candidate) -> str:
    """'2 x 8 H100-SXM (TP8' or, for replicas over nodes, '1 x [2 nodes x 8 H100-SXM] (TP 8 within a
    node, PP 2 across nodes over 400 Gb/s' (the caller closes the parenthesis)."""
    if c.data_parallel > 1:
        where = (f"over {c.nodes_per_replica} nodes at {c.inter_node_gbit_per_s:g} Gb/s per GPU" if c.multi_node
                 else "within a node")
        return (f"{c.replicas} x [{c.layout}] ({c.data_parallel} data-parallel engines of TP {c.tensor_parallel}, "
                f"experts split over all {c.gpus_per_replica} GPUs {where}")
    if c.pipeline_parallel <= 1:
        return f"{c.replicas} x {c.tensor_parallel} {c.gpu_type} (TP{c.tensor_parallel}"
    return (f"{c.replicas} x [{c.layout}] (TP {c.tensor_parallel} within a node, PP {c.pipeline_parallel} "
            f"across nodes over {c.inter_node_gbit_per_s:g} Gb/s per GPU")


def _boundaries(count: int) -> str:
    return f"{count} node boundary" if count == 1 else f"{count} node boundaries"


def _why_this_many_nodes(chosen: Candidate, runners_up: Sequence[Candidate], rejected: Sequence[Candidate]) -> str:
    """Why a replica spans nodes (or does not), when the other kind was on the table; and why data-parallel
    engines (or not), when both were."""
    engines = _why_data_parallel(chosen, runners_up)
    nodes = _why_nodes(chosen, runners_up, rejected)
    return " ".join(part for part in (nodes, engines) if part)


def _why_data_parallel(chosen: Candidate, runners_up: Sequence[Candidate]) -> str:
    if chosen.data_parallel > 1:
        plain = [c for c in runners_up if c.data_parallel == 1]
        per_step = (f"each engine runs its own batch of up to {chosen.max_num_seqs} sequences and KV cache, and "
                    f"each GPU reads only its 1/{chosen.gpus_per_replica} of the experts once for all "
                    f"{chosen.data_parallel} engines' tokens (two all-to-alls per MoE layer, included above)")
        if plain:
            best = plain[0]
            return (f"Data-parallel engines with expert parallel win on cost ({per_step}); without them the best is "
                    f"{best.replicas} x {best.layout} ({best.parallelism}) at {_money(best.cost_per_hour)}.")
        return f"Data-parallel engines with expert parallel: {per_step}."
    return _best_of_the_other_kind(
        [c for c in runners_up if c.data_parallel > 1], runners_up,
        "Data-parallel engines with expert parallel cost more here (the next best).",
        "Best with data-parallel engines (expert parallel)", "")


def _best_of_the_other_kind(others: Sequence[Candidate], runners_up: Sequence[Candidate], when_next_best: str,
                            words: str, why: str) -> str:
    """The cheapest runner-up of the kind not chosen: named, unless it is the next best anyway."""
    if not others:
        return ""
    best = others[0]
    if best is runners_up[0]:
        return when_next_best
    return f"{words}: {best.replicas} x [{best.layout}] ({best.parallelism}) at {_money(best.cost_per_hour)}{why}."


def _why_nodes(chosen: Candidate, runners_up: Sequence[Candidate], rejected: Sequence[Candidate]) -> str:
    if chosen.data_parallel > 1:
        return ""
    if chosen.pipeline_parallel > 1:
        single = [c for c in runners_up if not c.multi_node]
        if single:
            best = single[0]
            if best is runners_up[0]:
                return "Spanning nodes wins on cost over the best single-node plan (the next best)."
            return (f"Spanning nodes wins on cost: the best single-node plan, {best.replicas} x {best.layout} "
                    f"({best.parallelism}), costs {_money(best.cost_per_hour)}.")
        reasons = [c.rejection for c in rejected if c.nodes_per_replica == 1 and c.data_parallel == 1]
        why = (f"because no single node serves the model: {reasons[-1]}" if reasons
               else "as spec.serving.pipelineParallel pins it")
        return (f"A replica spans {chosen.pipeline_parallel} nodes {why}. "
                f"Layers are split across the nodes (pipeline parallel); each token crosses "
                f"{_boundaries(chosen.pipeline_parallel - 1)}, which the latencies above include.")
    return _best_of_the_other_kind(
        [c for c in runners_up if c.pipeline_parallel > 1 and c.data_parallel == 1], runners_up,
        "Replicas over several nodes cost more here: pipeline parallel adds memory, not speed per token (the next "
        "best).", "Best replica over several nodes", "; pipeline parallel adds memory, not speed per token")


def _burstiness_words(spec: LLMDeploymentSpec, chosen: Candidate) -> str:
    """Where the TTFT binds, the arrivals the goodput is for: their burstiness lengthens its prefill queue."""
    burstiness = spec.scaling.arrival_burstiness
    if chosen.binding != "ttft" or burstiness == 1.0:
        return ""
    return f" for arrivals {burstiness:g}x as variable as Poisson's (scaling.arrivalBurstiness)"


def explain_feasible(spec: LLMDeploymentSpec, chosen: Candidate, binding: str,
                     runners_up: Sequence[Candidate], rejected: Sequence[Candidate]) -> str:
    p = f"p{spec.slo.percentile:g}"
    predicted = chosen.predicted
    parts = [
        f"{_replicas_words(chosen)}, "
        f"max-num-seqs {chosen.max_num_seqs}, max-model-len {chosen.max_model_len}) for "
        f"{_load_words(spec)} at {_money(chosen.cost_per_hour)}.",
        f"Each replica sustains {chosen.goodput_requests_per_s:.2f} req/s "
        f"({chosen.goodput_output_tokens_per_s:,.0f} output tok/s) before "
        f"{_BINDING_WORDS.get(chosen.binding, chosen.binding)}{_burstiness_words(spec, chosen)}; "
        f"{chosen.tokens_per_dollar:,.0f} SLO-compliant tokens per dollar.",
    ]
    if predicted is not None:
        parts.append(
            f"At the planned load: {p} TTFT {predicted.ttft_ms:.0f} ms (SLO {spec.slo.ttft_ms:g}), "
            f"{p} TPOT {predicted.tpot_ms:.1f} ms (SLO {spec.slo.tpot_ms:g})."
        )
    if binding == "cost":
        parts.append("Binding constraint: cost: the minimum replica count already meets both SLOs, so "
                     "the cheapest configuration that fits wins.")
    else:
        parts.append(f"Binding constraint: {binding}: the replica count follows from each replica's goodput.")
    nodes = _why_this_many_nodes(chosen, runners_up, rejected)
    if nodes:
        parts.append(nodes)
    if runners_up:
        other = runners_up[0]
        layout = f"[{other.layout}]" if other.multi_node else other.layout
        parts.append(f"Next best: {other.replicas} x {layout} "
                     f"({other.parallelism}) at {_money(other.cost_per_hour)}.")
    if rejected:
        parts.append(f"{len(rejected)} configuration(s) rejected, e.g. {rejected[0].rejection}.")
    return " ".join(parts)


def explain_infeasible(spec: LLMDeploymentSpec, over_bounds: Sequence[Candidate], rejected: Sequence[Candidate],
                       best_tpot_ms: float, best_ttft_ms: float, where_tpot: str, where_ttft: str,
                       ) -> tuple[str, str]:
    """(binding constraint, explanation) when no configuration meets the SLOs within the bounds."""
    p = f"p{spec.slo.percentile:g}"
    if over_bounds:
        best = over_bounds[0]
        return "replicas", (
            f"No plan within maxReplicas {spec.scaling.max_replicas}: the cheapest needs {best.replicas} x "
            f"{best.layout} ({best.parallelism}, {best.goodput_requests_per_s:.2f} "
            f"req/s per replica) for {_load_words(spec)}. Raise maxReplicas or add GPU types."
        )
    memory = [c for c in rejected if c.rejection.startswith(("does not fit", "maxContextTokens"))]
    if memory and len(memory) == len(rejected):
        return "memory", "Nothing fits: " + "; ".join(c.rejection for c in memory) + "."
    if not (math.isfinite(best_tpot_ms) or math.isfinite(best_ttft_ms)):
        # Nothing could even be evaluated: the spec itself rules every configuration out.
        return "configuration", "Infeasible: " + "; ".join(c.rejection for c in rejected) + "."
    reasons = []
    if best_tpot_ms > spec.slo.tpot_ms:
        reasons.append(f"TPOT {spec.slo.tpot_ms:g} ms unreachable: best is {best_tpot_ms:.1f} ms at {where_tpot}")
    if best_ttft_ms > spec.slo.ttft_ms:
        reasons.append(f"TTFT {spec.slo.ttft_ms:g} ms unreachable: best is {best_ttft_ms:.0f} ms at {where_ttft} "
                       f"(prefill of {spec.workload.input_tokens} tokens)")
    binding = "tpot" if best_tpot_ms > spec.slo.tpot_ms else "ttft"
    if not reasons:
        reasons = [c.rejection for c in rejected[:3]] or ["no configuration meets both SLOs together"]
    return binding, f"Infeasible ({p}): " + "; ".join(reasons) + "."
