"""The search: evaluate every (GPU type, TP, PP, max-num-seqs), keep the cheapest SLO-compliant plan.

A replica is one node (TP within it) or, for models bigger than a node, whole nodes joined by
pipeline parallel (TP within each node, PP across nodes); for MoE models also D data-parallel engines
whose experts are split over all their GPUs (expert parallel), within a node or over whole nodes. All
kinds compete on cost.

Pure: the architecture and GPU specs are resolved by the caller (catalog lookups, config.json files).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from kvscale.api.spec import Engine, LLMDeploymentSpec, Precision
from kvscale.catalog import GpuSpec, ModelArchitecture, find_gpu, resolve_architecture
from kvscale.errors import PlanningError
from kvscale.perfmodel.efficiency import DEFAULT_EFFICIENCY, EfficiencyFactors
from kvscale.perfmodel.memory import max_model_len_that_fits
from kvscale.perfmodel.precision import check_loadable
from kvscale.perfmodel.queueing import normal_quantile
from kvscale.perfmodel.replica import (
    ReplicaModel,
    ServingSetup,
    build_replica_model,
    compute_replica_kv_capacity,
)
from kvscale.perfmodel.serving import (
    RequestShape,
    computed_prompt_tokens,
    concurrency_limit,
    estimate_at_concurrency,
    estimate_at_rate,
    estimate_goodput,
    prompt_strata,
)
from kvscale.planner.candidates import data_parallel_layouts, max_num_seqs_options, parallel_layouts
from kvscale.planner.explain import explain_feasible, explain_infeasible
from kvscale.planner.plan import Candidate, CandidateCurve, Plan, Predicted, replica_layout
from kvscale.units import GIB, S_PER_HOUR, gbit_per_s_to_bytes_per_s, ms_to_s, s_to_ms

DEFAULT_GPU_MEMORY_UTILIZATION = 0.90
_CURVE_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass(frozen=True)
class PlanInputs:
    """Everything the search needs, resolved: the spec, the architecture and the candidate GPUs."""

    spec: LLMDeploymentSpec
    arch: ModelArchitecture
    gpus: tuple[GpuSpec, ...]
    efficiency: EfficiencyFactors = DEFAULT_EFFICIENCY
    # The request shape to plan for; None: the one the spec states (planned_shape). Re-planning passes
    # the calibrated one, whose prompt tail was measured rather than assumed.
    shape: RequestShape | None = None


def build_plan_inputs(spec: LLMDeploymentSpec, config_json: dict[str, Any] | None = None,
                      efficiency: EfficiencyFactors = DEFAULT_EFFICIENCY,
                      default_prices_usd_per_hour: Mapping[str, float] | None = None) -> PlanInputs:
    """Resolve names against the shipped catalog. `config_json` (already read by the caller) or the
    spec's inline architecture override the catalog's architecture. GPU prices: the spec's, else the
    operator's defaults (`default_prices_usd_per_hour`), else the catalog's."""
    config = spec.model.architecture if spec.model.architecture is not None else config_json
    arch = resolve_architecture(spec.model.name, config)
    check_loadable(spec.model.precision or arch.native_precision, arch.native_precision, spec.model.name)
    prices = {k.lower(): v for k, v in (default_prices_usd_per_hour or {}).items()}
    prices.update({k.lower(): v for k, v in spec.gpu.price_usd_per_hour.items()})
    gpus = []
    for name in dict.fromkeys(spec.gpu.types):
        gpu = find_gpu(name)
        override = prices.get(name.lower()) or prices.get(gpu.name.lower())
        gpu = replace(gpu, usd_per_hour=override) if override else gpu
        if spec.gpu.inter_node_gbit_per_s is not None:
            gpu = replace(gpu, inter_node_bytes_per_s=gbit_per_s_to_bytes_per_s(spec.gpu.inter_node_gbit_per_s))
        gpus.append(gpu)
    return PlanInputs(spec=spec, arch=arch, gpus=tuple(gpus), efficiency=efficiency)


def _precision(inputs: PlanInputs) -> Precision:
    return inputs.spec.model.precision or inputs.arch.native_precision


def gpus_per_node(spec: LLMDeploymentSpec, gpu: GpuSpec) -> int:
    return min(spec.gpu.per_node, gpu.max_gpus_per_node)


def build_serving_setup(inputs: PlanInputs, gpu: GpuSpec, tensor_parallel: int,
                        pipeline_parallel: int = 1, data_parallel: int = 1) -> ServingSetup:
    """The replica configuration the planner evaluates for `gpu` at `tensor_parallel` x `pipeline_parallel`
    x `data_parallel` (and the operator and simulator reuse for the chosen candidate)."""
    spec = inputs.spec
    return ServingSetup(arch=inputs.arch, gpu=gpu, tensor_parallel=tensor_parallel, precision=_precision(inputs),
                        kv_cache_dtype=spec.model.kv_cache_dtype,
                        gpu_memory_utilization=spec.serving.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION,
                        efficiency=inputs.efficiency, pipeline_parallel=pipeline_parallel,
                        data_parallel=data_parallel, gpus_per_node=gpus_per_node(spec, gpu))


def chosen_setup(inputs: PlanInputs, chosen: Candidate) -> ServingSetup:
    gpu = next(g for g in inputs.gpus if g.name == chosen.gpu_type)
    return build_serving_setup(inputs, gpu, chosen.tensor_parallel, chosen.pipeline_parallel, chosen.data_parallel)


def _nodes(setup: ServingSetup) -> int:
    """Nodes a replica fills: its PP stages, or the nodes its data-parallel engines fill."""
    return setup.pipeline_parallel * max(1, math.ceil(setup.gpus / setup.pipeline_parallel / setup.gpus_per_node))


def replica_words(setup: ServingSetup) -> str:
    """How a replica is laid out: '2 x H100-SXM', '2 nodes x 8 H100-SXM (TP8 PP2)' or
    '2 nodes x 8 H100-SXM (TP1 DP16 EP16)'."""
    nodes = _nodes(setup)
    layout = replica_layout(setup.gpu.name, setup.gpus // nodes, nodes)
    tp, pp, dp = setup.tensor_parallel, setup.pipeline_parallel, setup.data_parallel
    if dp > 1:
        return f"{layout} (TP{tp} DP{dp} EP{tp * dp})"
    return layout if pp <= 1 else f"{layout} (TP{tp} PP{pp})"


@dataclass(frozen=True)
class _Evaluation:
    """Best candidate of one GPU type and TP degree, or why none works there."""

    best: Candidate | None
    rejection: Candidate | None
    curve: CandidateCurve | None
    best_tpot_ms: float  # lowest p-th percentile TPOT seen at a trickle of load (for explanations)
    best_ttft_ms: float


def _reject(gpu: GpuSpec, tp: int, reason: str, weights: float = 0.0, pp: int = 1, dp: int = 1,
            dp_nodes: int = 1) -> Candidate:
    return Candidate(
        gpu_type=gpu.name, tensor_parallel=tp, max_num_seqs=0, max_model_len=0, gpu_memory_utilization=0.0,
        kv_cache_tokens=0, weights_bytes_per_gpu=weights, usd_per_gpu_hour=gpu.usd_per_hour,
        goodput_requests_per_s=0.0, goodput_output_tokens_per_s=0.0, binding="", replicas=0, gpus=0,
        cost_per_hour=0.0, tokens_per_dollar=0.0, predicted=None, rejection=reason, pipeline_parallel=pp,
        data_parallel=dp, data_parallel_nodes=dp_nodes,
    )


# How sure the cap must be that the running sequences' KV fits: 99% (a collapse is not a tail).
KV_FIT_QUANTILE = 0.99
# Batch caps whose goodput is within this share of the best are ties. Past the batch an SLO allows, the
# goodput is flat in the cap, and what is left is the model's own ripple (0.1-0.3%) and the KV capacity
# each cap leaves, not a reason to pick one cap over another.
GOODPUT_TIE_TOLERANCE = 0.005


def _batch_cap_choice(batches: list[int], goodput_requests_per_s: ArrayLike) -> int:
    """Index of the batch cap to plan: the smallest one within GOODPUT_TIE_TOLERANCE of the best goodput
    (less memory pressure, and a burst beyond it waits for a slot instead of slowing every decode)."""
    rates = np.asarray(goodput_requests_per_s, dtype=np.float64)
    best = float(np.max(rates))
    tied = [i for i in range(len(batches)) if rates[i] >= best * (1.0 - GOODPUT_TIE_TOLERANCE)]
    return min(tied, key=lambda i: batches[i])


def sequences_the_cache_holds(shape: RequestShape, kv_cache_tokens: float) -> int:
    """The most sequences whose full-length KV (computed prompt + output, lengths as the shape's
    mix) fits in the cache at KV_FIT_QUANTILE: n·mean + z·sqrt(n)·sd <= tokens."""
    prompts, weights = prompt_strata(shape)
    computed = computed_prompt_tokens(shape, prompts)
    mean = float(np.dot(computed, weights)) + shape.output_tokens
    # Outputs as the model takes them (geometric when nothing else is known: variance ~ mean²).
    variance = float(np.dot((computed - np.dot(computed, weights)) ** 2, weights)) + shape.output_tokens**2
    z = normal_quantile(KV_FIT_QUANTILE)
    root = (-z * math.sqrt(variance) + math.sqrt(z * z * variance + 4.0 * mean * kv_cache_tokens)) / (2.0 * mean)
    return max(int(root * root), 1)


def planned_shape(spec: LLMDeploymentSpec) -> RequestShape:
    """The request shape the spec states, with the percentile prompt assumed (exponential lengths):
    a workload's longest prompts set its TTFT percentile, and the spec gives only the mean."""
    workload = spec.workload
    longest = None if workload.max_context_tokens is None else workload.max_context_tokens - workload.output_tokens
    shape = RequestShape.with_assumed_tail(workload.input_tokens, workload.output_tokens,
                                           spec.slo.percentile / 100.0, longest)
    return replace(shape, prefix_cache_hit_rate=workload.prefix_cache_hit_rate,
                   input_percentiles=workload.percentile_points(workload.input_tokens_percentiles),
                   output_percentiles=workload.percentile_points(workload.output_tokens_percentiles))


def _replicas_for(spec: LLMDeploymentSpec, goodput_rps: float) -> int:
    demand = spec.workload.planned_requests_per_second * (1.0 + spec.scaling.headroom)
    needed = math.ceil(demand / goodput_rps - 1e-9) if demand > 0 else 0
    if spec.workload.requests_per_second > 0:
        needed = max(needed, 1)
    return max(needed, spec.scaling.min_replicas)


def _evaluate(inputs: PlanInputs, gpu: GpuSpec, tp: int, pp: int = 1, dp: int = 1) -> _Evaluation:
    spec = inputs.spec
    arch = inputs.arch
    quantile = spec.slo.percentile / 100.0
    shape = inputs.shape or planned_shape(spec)
    setup = build_serving_setup(inputs, gpu, tp, pp, dp)
    utilization = setup.gpu_memory_utilization
    where = replica_words(setup)
    per_replica = setup.gpus
    dp_nodes = _nodes(setup) // pp
    batches = max_num_seqs_options(setup.engine_token_budget, spec.serving.max_num_seqs)
    if not batches:
        return _Evaluation(None, _reject(gpu, tp, f"max-num-seqs above the token budget {setup.engine_token_budget}",
                                         pp=pp, dp=dp, dp_nodes=dp_nodes), None, math.inf, math.inf)
    model = build_replica_model(setup)
    capacities = [compute_replica_kv_capacity(setup, b, shape.mean_context_tokens) for b in batches]
    if not spec.serving.max_num_seqs:
        # A cap above what the KV cache holds lets vLLM admit sequences it must preempt (and recompute)
        # when they grow together: under a burst of long prompts that is a collapse, not a slowdown.
        # Such caps are lowered to what the cache holds (sequences_the_cache_holds).
        held = sorted({max(1, min(b, sequences_the_cache_holds(shape, c.tokens) // dp))
                       for b, c in zip(batches, capacities, strict=True)})
        if held != batches:
            batches = held
            capacities = [compute_replica_kv_capacity(setup, b, shape.mean_context_tokens) for b in batches]
    fits_len = [max_model_len_that_fits(arch, c, setup.kv_cache_dtype, tp, pp) for c in capacities]
    wanted_len = spec.workload.max_context_tokens or arch.max_context_tokens
    weights = capacities[0].weights_bytes
    usable_gib = (gpu.memory_bytes * utilization - capacities[0].activation_bytes - capacities[0].reserve_bytes) / GIB
    if fits_len[0] < shape.input_tokens + shape.output_tokens:
        return _Evaluation(None, _reject(
            gpu, tp,
            f"does not fit on {where}: {weights / GIB:.1f} GiB of weights per GPU leave no room "
            f"for the KV cache of one {int(shape.input_tokens + shape.output_tokens)}-token request "
            f"({usable_gib:.1f} GiB usable per GPU at gpu-memory-utilization {utilization})", weights, pp, dp,
            dp_nodes), None, math.inf, math.inf)
    if spec.workload.max_context_tokens and fits_len[0] < spec.workload.max_context_tokens:
        return _Evaluation(None, _reject(
            gpu, tp,
            f"maxContextTokens {spec.workload.max_context_tokens} does not fit on {where}: at most "
            f"{fits_len[0]} tokens of KV cache remain after {weights / GIB:.1f} GiB of weights per GPU", weights, pp,
            dp, dp_nodes), None, math.inf, math.inf)

    kv_tokens = np.array([c.tokens for c in capacities], dtype=np.float64)
    slots = concurrency_limit(shape, np.array(batches, dtype=np.float64) * dp, kv_tokens)
    # Sized for the arrivals the autoscaler sizes for (scaling.arrivalBurstiness), so that the plan's replicas and
    # the autoscaler's floor for the stated load agree; a trickle is the same at any burstiness.
    burstiness = spec.scaling.arrival_burstiness
    goodput = estimate_goodput(model, shape, slots, ms_to_s(spec.slo.ttft_ms), ms_to_s(spec.slo.tpot_ms), quantile,
                               burstiness)
    trickle = estimate_at_rate(model, shape, np.full(len(batches), 1e-6), slots, quantile)
    best_tpot_ms = s_to_ms(float(np.min(trickle.tpot_quantile_s)))
    best_ttft_ms = s_to_ms(float(np.min(trickle.ttft_quantile_s)))

    i = _batch_cap_choice(batches, goodput.request_rate)
    curve = _curve(model, shape, setup, int(np.max(slots)))
    rate = float(goodput.request_rate[i])
    if rate <= 0.0:
        reason = (f"SLO unreachable on {where}: best p{spec.slo.percentile:g} TPOT "
                  f"{best_tpot_ms:.1f} ms and TTFT {best_ttft_ms:.0f} ms at a trickle of load")
        return _Evaluation(None, _reject(gpu, tp, reason, weights, pp, dp, dp_nodes), curve, best_tpot_ms, best_ttft_ms)

    binding = str(goodput.binding[i])
    if binding == "capacity":
        binding = "memory" if slots[i] < batches[i] else "throughput"
    replicas = _replicas_for(spec, rate)
    load_rate = spec.workload.requests_per_second / replicas if replicas else 0.0
    at_load = estimate_at_rate(model, shape, max(load_rate, 1e-6), slots[i], quantile, burstiness)
    fleet_tokens = spec.workload.requests_per_second * shape.output_tokens
    gpus_total = replicas * per_replica
    predicted = Predicted(
        ttft_ms=s_to_ms(float(at_load.ttft_quantile_s)),
        tpot_ms=s_to_ms(float(at_load.tpot_quantile_s)),
        output_tokens_per_s=fleet_tokens,
        output_tokens_per_s_per_gpu=fleet_tokens / gpus_total if gpus_total else 0.0,
        requests_per_second_per_replica=load_rate,
        decode_step_ms=s_to_ms(float(at_load.decode_step_s)),
        running_seqs_per_replica=float(at_load.running_seqs),
    )
    goodput_tokens = rate * shape.output_tokens
    best = Candidate(
        gpu_type=gpu.name,
        tensor_parallel=tp,
        max_num_seqs=batches[i],
        max_model_len=int(min(wanted_len, fits_len[i], arch.max_context_tokens)),
        gpu_memory_utilization=utilization,
        kv_cache_tokens=int(kv_tokens[i]),
        weights_bytes_per_gpu=weights,
        usd_per_gpu_hour=gpu.usd_per_hour,
        goodput_requests_per_s=rate,
        goodput_output_tokens_per_s=goodput_tokens,
        binding=binding,
        replicas=replicas,
        gpus=gpus_total,
        cost_per_hour=gpus_total * gpu.usd_per_hour,
        tokens_per_dollar=goodput_tokens * S_PER_HOUR / (per_replica * gpu.usd_per_hour),
        predicted=predicted,
        pipeline_parallel=pp,
        inter_node_gbit_per_s=gpu.inter_node_gbit_per_s if _nodes(setup) > 1 else 0.0,
        data_parallel=dp,
        data_parallel_nodes=dp_nodes,
    )
    return _Evaluation(best, None, curve, best_tpot_ms, best_ttft_ms)


def _evaluate_layouts(inputs: PlanInputs, gpu: GpuSpec, layouts: Sequence[tuple[int, int]],
                      pinned: bool, data_parallel: Sequence[tuple[int, int]] = ()) -> list[_Evaluation]:
    """Single-node layouts first, then more nodes per replica only while they can pay: pipeline
    parallel adds memory, not speed per token (or per GPU), so a replica spans one node more only
    when the best layout so far does not fit or is held back by its KV cache (binding: memory).
    Data-parallel engines (MoE) change the speed per GPU (experts read once for D engines' tokens), so
    each (TP, DP) layout filling one node competes on cost; over several nodes they pass the same gate
    (their all-to-alls cross the network in every MoE layer, so where one node serves they cost more)."""
    per_node = gpus_per_node(inputs.spec, gpu)
    done = [_evaluate(inputs, gpu, tp, pp) for tp, pp in layouts if pp == 1]
    done += [_evaluate(inputs, gpu, tp, 1, dp) for tp, dp in data_parallel if tp * dp <= per_node]
    spanning = [(tp, pp, 1) for tp, pp in layouts if pp > 1]
    spanning += [(tp, 1, dp) for tp, dp in data_parallel if tp * dp > per_node]
    for tp, pp, dp in spanning:
        feasible = sorted((e.best for e in done if e.best is not None and not e.best.multi_node), key=_rank_key)
        if pinned or not feasible or feasible[0].binding == "memory":
            done.append(_evaluate(inputs, gpu, tp, pp, dp))
    return done


def _curve(model: ReplicaModel, shape: RequestShape, setup: ServingSetup, max_slots: int) -> CandidateCurve:
    concurrency = tuple(c for c in _CURVE_CONCURRENCY if c <= max(max_slots, 1))
    est = estimate_at_concurrency(model, shape, np.array(concurrency, dtype=np.float64))
    return CandidateCurve(
        gpu_type=setup.gpu.name,
        tensor_parallel=setup.tensor_parallel,
        concurrency=concurrency,
        tpot_ms=tuple(float(v) * 1e3 for v in est.tpot_mean_s),
        output_tokens_per_s_per_gpu=tuple(float(v) for v in est.output_tokens_per_s / setup.gpus),
        pipeline_parallel=setup.pipeline_parallel,
        data_parallel=setup.data_parallel,
    )


def _rank_key(candidate: Candidate) -> tuple[float, int, float, int]:
    """Cheapest first; at equal cost fewer nodes per replica (no inter-node hops to depend on)."""
    return (candidate.cost_per_hour, candidate.nodes_per_replica, -candidate.tokens_per_dollar, candidate.gpus)


def plan_deployment(inputs: PlanInputs) -> Plan:
    """Choose the cheapest configuration meeting both SLOs for the workload, and explain it."""
    spec = inputs.spec
    if not inputs.gpus:
        raise PlanningError("no candidate GPU types")
    evaluations: list[_Evaluation] = []
    pinned_tp = spec.serving.tensor_parallel
    pinned_pp = spec.serving.pipeline_parallel
    pinned_dp = spec.serving.data_parallel
    for gpu in inputs.gpus:
        per_node = gpus_per_node(spec, gpu)
        # Data-parallel engines beside pipeline stages are not planned; kvscale launches DP + EP with vLLM.
        pinned_data_parallel = pinned_dp is not None and pinned_dp > 1
        layouts = [] if pinned_data_parallel else parallel_layouts(inputs.arch, per_node, pinned_tp, pinned_pp)
        engines = ([] if pinned_pp not in (None, 1) or spec.serving.engine != Engine.VLLM
                   else data_parallel_layouts(inputs.arch, per_node, pinned_tp, pinned_dp))
        if not layouts and not engines:
            if pinned_tp and pinned_tp > per_node:
                reason = (f"tensorParallel {pinned_tp} exceeds {per_node} GPUs per node (a replica larger than "
                          f"a node uses pipeline parallel across nodes: leave tensorParallel unpinned)")
            elif pinned_data_parallel and not inputs.arch.is_moe:
                reason = (f"dataParallel {pinned_dp}: kvscale plans data-parallel engines (with expert parallel) "
                          f"for MoE models only, and {inputs.arch.name} is dense: leave dataParallel unpinned")
            elif pinned_data_parallel and spec.serving.engine != Engine.VLLM:
                reason = f"dataParallel {pinned_dp}: kvscale launches data-parallel engines with vLLM only"
            elif pinned_data_parallel:
                reason = (f"dataParallel {pinned_dp} x TP does not fill one node of {per_node} GPUs or up to "
                          f"4 whole nodes")
            elif pinned_pp and pinned_pp > inputs.arch.num_layers:
                reason = f"pipelineParallel {pinned_pp} exceeds the model's {inputs.arch.num_layers} layers"
            else:
                reason = (f"no legal tensor-parallel degree <= {per_node} for {inputs.arch.num_attention_heads} "
                          f"attention / {inputs.arch.num_kv_heads} KV heads")
            evaluations.append(_Evaluation(None, _reject(gpu, pinned_tp or 0, reason, pp=pinned_pp or 1), None,
                                           math.inf, math.inf))
            continue
        pinned_nodes = pinned_pp is not None or pinned_data_parallel
        evaluations.extend(_evaluate_layouts(inputs, gpu, layouts, pinned_nodes, engines))

    feasible = sorted((e.best for e in evaluations if e.best is not None), key=_rank_key)
    within_bounds = [c for c in feasible if c.replicas <= spec.scaling.max_replicas]
    rejected = tuple(e.rejection for e in evaluations if e.rejection is not None)
    curves = tuple(e.curve for e in evaluations if e.curve is not None)
    chosen: Candidate | None = within_bounds[0] if within_bounds else None
    if chosen is not None:
        binding = _plan_binding(spec, chosen)
        text = explain_feasible(spec, chosen, binding, within_bounds[1:], rejected)
    else:
        best_tpot = min((e.best_tpot_ms for e in evaluations), default=math.inf)
        best_ttft = min((e.best_ttft_ms for e in evaluations), default=math.inf)
        binding, text = explain_infeasible(spec, feasible, rejected, best_tpot, best_ttft,
                                           _where_best(evaluations, "tpot"), _where_best(evaluations, "ttft"))
    return Plan(
        feasible=chosen is not None,
        chosen=chosen,
        binding_constraint=binding,
        explanation=text,
        model=inputs.arch.name,
        workload_requests_per_second=spec.workload.requests_per_second,
        ttft_slo_ms=spec.slo.ttft_ms,
        tpot_slo_ms=spec.slo.tpot_ms,
        percentile=spec.slo.percentile,
        alternatives=tuple(within_bounds if chosen is not None else feasible),
        rejected=rejected,
        curves=curves,
    )


def _where_best(evaluations: Sequence[_Evaluation], which: str) -> str:
    scored = [(e.best_tpot_ms if which == "tpot" else e.best_ttft_ms, e) for e in evaluations]
    scored = [(v, e) for v, e in scored if math.isfinite(v)]
    if not scored:
        return ""
    _, best = min(scored, key=lambda item: item[0])
    source = best.best or best.rejection
    return f"{source.gpu_type} {source.parallelism} batch 1" if source else ""


def _plan_binding(spec: LLMDeploymentSpec, chosen: Candidate) -> str:
    """What decided this plan: the price when the floor of replicas already covers the load,
    otherwise the limit on each replica's goodput."""
    floor = max(spec.scaling.min_replicas, 1 if spec.workload.requests_per_second > 0 else 0)
    if chosen.replicas <= floor:
        return "cost"
    return chosen.binding
