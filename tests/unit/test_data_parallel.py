"""Data-parallel attention with expert parallelism (MoE): memory, step times, the planner's choice, the launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from kvscale.api.spec import Precision, parse_spec
from kvscale.catalog import find_gpu, resolve_architecture
from kvscale.kube.builders import Owner, build_deployment
from kvscale.kube.engines import DATA_PARALLEL_RPC_PORT
from kvscale.kube.leaderworkerset import build_leader_worker_set
from kvscale.perfmodel.communication import estimate_all_to_all_s
from kvscale.perfmodel.efficiency import DEFAULT_EFFICIENCY
from kvscale.perfmodel.memory import compute_weight_bytes, weights_bytes_per_gpu
from kvscale.perfmodel.replica import ServingSetup, build_replica_model, compute_replica_kv_capacity
from kvscale.planner import build_plan_inputs, chosen_setup, plan_deployment

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "deepseek-r1-h100-expert-parallel.yaml"
R1 = resolve_architecture("deepseek-ai/DeepSeek-R1", None)
H100 = find_gpu("H100-SXM")


def _spec(path: Path = EXAMPLE, **serving: Any) -> Any:
    document: dict[str, Any] = yaml.safe_load(path.read_text())["spec"]
    document.setdefault("serving", {}).update(serving)
    return parse_spec(document)


def test_routed_experts_are_split_whole_over_every_gpu_of_the_engines() -> None:
    weights = compute_weight_bytes(R1, Precision.FP8)
    routed = weights.routed_expert * R1.num_moe_layers * R1.num_experts
    rest = weights.total(R1) - routed
    assert weights_bytes_per_gpu(R1, Precision.FP8, 8, data_parallel=4) == pytest.approx(rest / 8 + routed / 32)
    # TP alone shards everything (the experts too) over its ranks
    assert weights_bytes_per_gpu(R1, Precision.FP8, 8) == pytest.approx((rest + routed) / 8)


def test_each_engine_has_its_own_cache_and_max_num_seqs() -> None:
    one = ServingSetup(arch=R1, gpu=H100, tensor_parallel=2, precision=Precision.FP8, data_parallel=8)
    capacity = compute_replica_kv_capacity(one, 64, 3000)
    assert capacity.tokens > 0 and capacity.tokens % 8 == 0  # eight engines' caches
    assert one.replica_max_num_seqs(64) == 512
    assert one.gpus == 16 and one.expert_parallel == 16
    assert one.token_budget == 8 * one.engine_token_budget


def test_an_all_to_all_across_nodes_costs_more_than_within_one() -> None:
    tokens = np.array([16.0])
    within = estimate_all_to_all_s(H100, 8, 8, tokens, 8 * 7168 * 2, DEFAULT_EFFICIENCY)
    across = estimate_all_to_all_s(H100, 32, 8, tokens, 8 * 7168 * 2, DEFAULT_EFFICIENCY)
    assert 0 < within[0] < across[0]
    assert estimate_all_to_all_s(H100, 1, 8, tokens, 1e5, DEFAULT_EFFICIENCY)[0] == 0


def test_engines_share_the_expert_reads_and_the_busiest_paces_the_step() -> None:
    tp8 = build_replica_model(ServingSetup(arch=R1, gpu=H100, tensor_parallel=8, precision=Precision.FP8))
    dp4 = build_replica_model(ServingSetup(arch=R1, gpu=H100, tensor_parallel=8, precision=Precision.FP8,
                                           data_parallel=4))
    assert dp4.routed_expert_bytes == pytest.approx(tp8.routed_expert_bytes * 8 / 4 / 8)  # whole experts over 32
    # 4 engines of 64 decode together in about the time one engine of 64 takes, far less than 4 of them in turn
    step_tp8 = float(tp8.step_s(64, 3000))
    step_dp4 = float(dp4.step_s(256, 3000))
    assert step_dp4 < 2 * step_tp8
    # One prompt runs on one engine, which the others wait for; several spread over the engines
    alone = float(dp4.step_s(0, 0, 4096, 4096**2 / 2, 1))
    spread = float(dp4.step_s(0, 0, 4096, 4 * 1024**2 / 2, 4))
    assert alone > spread


def test_the_planner_picks_expert_parallel_engines_where_they_are_cheapest() -> None:
    inputs = build_plan_inputs(_spec())
    plan = plan_deployment(inputs)
    chosen = plan.chosen
    assert chosen is not None
    assert (chosen.tensor_parallel, chosen.pipeline_parallel, chosen.data_parallel) == (8, 1, 4)
    assert chosen.nodes_per_replica == 4 and chosen.gpus_per_pod == 8 and chosen.gpus_per_replica == 32
    assert chosen_setup(inputs, chosen).replica_max_num_seqs(chosen.max_num_seqs) == 4 * chosen.max_num_seqs
    assert "data-parallel engines" in plan.explanation and "win on cost" in plan.explanation
    # it competed: the pipeline-parallel layouts were priced too, and cost more
    pipelined = [c for c in plan.alternatives if c.pipeline_parallel > 1]
    assert pipelined and all(c.cost_per_hour > chosen.cost_per_hour for c in pipelined)
    assert plan.to_dict()["data_parallel"] == 4


def test_dense_models_and_sglang_get_no_data_parallel_engines() -> None:
    dense = plan_deployment(build_plan_inputs(_spec(ROOT / "examples" / "llama-3.1-70b-h100.yaml")))
    assert all(c.data_parallel == 1 for c in (*dense.alternatives, *dense.rejected))
    sglang = plan_deployment(build_plan_inputs(_spec(engine="sglang")))
    assert all(c.data_parallel == 1 for c in (*sglang.alternatives, *sglang.rejected))
    pinned = plan_deployment(build_plan_inputs(_spec(ROOT / "examples" / "llama-3.1-70b-h100.yaml",
                                                     dataParallel=4)))
    assert not pinned.feasible
    assert any("MoE models only" in c.rejection for c in pinned.rejected)


def test_a_multi_node_expert_parallel_replica_launches_as_leader_and_headless_workers() -> None:
    spec = _spec()
    inputs = build_plan_inputs(spec)
    chosen = plan_deployment(inputs).chosen
    assert chosen is not None
    lws = build_leader_worker_set(Owner(name="deepseek-r1-ep", namespace="a", uid="u"), spec, chosen, 1,
                                  gpu=H100, native_precision=inputs.arch.native_precision)
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 4
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    worker = template["workerTemplate"]["spec"]["containers"][0]
    args = leader["args"]

    def flag(values: list[str], name: str) -> str:
        return values[values.index(name) + 1]

    assert flag(args, "--data-parallel-size") == "4" and flag(args, "--data-parallel-size-local") == "1"
    assert flag(args, "--tensor-parallel-size") == "8" and "--enable-expert-parallel" in args
    assert flag(args, "--data-parallel-address") == "$(LWS_LEADER_ADDRESS)"
    assert flag(args, "--data-parallel-rpc-port") == str(DATA_PARALLEL_RPC_PORT)
    assert flag(args, "--max-num-seqs") == str(chosen.max_num_seqs)  # per engine, as vLLM takes it
    assert "--pipeline-parallel-size" not in args and "--headless" not in args
    assert "--headless" in worker["args"] and "ports" not in worker
    # a worker's first rank is its index times its engines, which only a shell can compute
    assert worker["command"][:2] == ["/bin/sh", "-c"]
    assert "--data-parallel-start-rank $((LWS_WORKER_INDEX * 1))" in worker["command"][2]
    assert worker["command"][2].startswith('exec vllm serve "$@"')
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == "8" == worker["resources"]["limits"]["nvidia.com/gpu"]


def test_a_single_node_expert_parallel_replica_is_one_pod_with_all_its_gpus() -> None:
    spec = parse_spec({
        "model": {"name": "Qwen/Qwen3-30B-A3B"}, "gpu": {"types": ["H100-SXM"]},
        "slo": {"ttftMs": 2000, "tpotMs": 60}, "workload": {"requestsPerSecond": 20, "inputTokens": 1000,
                                                             "outputTokens": 300},
        "serving": {"tensorParallel": 1, "dataParallel": 4}})
    inputs = build_plan_inputs(spec)
    chosen = plan_deployment(inputs).chosen
    assert chosen is not None and chosen.data_parallel == 4 and not chosen.multi_node
    deployment = build_deployment(Owner(name="qwen", namespace="a", uid="u"), spec, chosen, 1, gpu=H100,
                                  native_precision=inputs.arch.native_precision)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--data-parallel-size") + 1] == "4" and "--enable-expert-parallel" in args
    assert "--data-parallel-address" not in args and "--headless" not in args
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
