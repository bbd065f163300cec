"""Replicas bigger than one node: TP within a node x PP across nodes (memory, step time, plans, operator)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from kvscale.api.conditions import ConditionType, find_condition
from kvscale.api.spec import KvCacheDtype, LLMDeploymentSpec, Precision, load_resource, parse_spec
from kvscale.api.status import ConditionStatus
from kvscale.catalog import find_gpu, resolve_architecture
from kvscale.catalog.store import load_catalog
from kvscale.cli.render import render_plan
from kvscale.controllers.desire import desire
from kvscale.controllers.world import World
from kvscale.kube.builders import MultiNodeNotSupportedError, Owner, build_deployment
from kvscale.perfmodel import build_replica_model
from kvscale.perfmodel.communication import estimate_stage_transfer_s
from kvscale.perfmodel.memory import (
    compute_kv_capacity,
    kv_bytes_per_token,
    max_model_len_that_fits,
    stage_layer_share,
    weights_bytes_per_gpu,
)
from kvscale.perfmodel.replica import ACTIVATION_BYTES, ServingSetup
from kvscale.planner import build_plan_inputs, plan_deployment
from kvscale.planner.candidates import parallel_layouts
from kvscale.units import GIB, gbit_per_s_to_bytes_per_s

ROOT = Path(__file__).resolve().parents[2]
H100 = find_gpu("H100-SXM")
LLAMA_405B = resolve_architecture("meta-llama/Llama-3.1-405B-Instruct")
LLAMA_70B = resolve_architecture("meta-llama/Llama-3.1-70B-Instruct")


def _example(name: str) -> LLMDeploymentSpec:
    return load_resource(ROOT / "examples" / name).spec


def _setup(pp: int, tp: int = 8, arch: Any = LLAMA_70B) -> ServingSetup:
    return ServingSetup(arch=arch, gpu=H100, tensor_parallel=tp, precision=Precision.BF16, pipeline_parallel=pp)


# ------------------------------------------------------------------ memory


def test_weights_and_kv_split_over_stages() -> None:
    one = weights_bytes_per_gpu(LLAMA_405B, Precision.BF16, 8)
    two = weights_bytes_per_gpu(LLAMA_405B, Precision.BF16, 8, 2)
    # Half the layers per stage, plus the larger of the embedding (first stage) and the LM head (last):
    # the same size untied, so each stage holds exactly half.
    assert two == pytest.approx(one / 2, rel=1e-9)
    tied = replace(LLAMA_405B, tie_word_embeddings=True)
    head_per_rank = tied.vocab_size * tied.hidden_size * 2 / 8
    # Tied, the embedding is both the first stage's lookup table and the last stage's head: on both.
    assert weights_bytes_per_gpu(tied, Precision.BF16, 8, 2) == pytest.approx(
        (weights_bytes_per_gpu(tied, Precision.BF16, 8) - head_per_rank) / 2 + head_per_rank, rel=1e-9)
    assert 94 * GIB < one < 95 * GIB and two < 48 * GIB
    assert stage_layer_share(LLAMA_405B, 1) == 1.0
    assert stage_layer_share(LLAMA_405B, 2) == 0.5
    assert stage_layer_share(resolve_architecture("deepseek-ai/DeepSeek-R1"), 3) == 21 / 61  # ceil(61 / 3)


def test_each_stage_caches_only_its_layers() -> None:
    args = (LLAMA_70B, H100.memory_bytes, Precision.BF16, KvCacheDtype.AUTO, 8, 0.9, 8192, 256)
    single, double = compute_kv_capacity(*args), compute_kv_capacity(*args, None, 2)
    # Each rank of a stage holds half the layers' KV per token and half the weights: > 2x the tokens.
    assert double.weights_bytes < single.weights_bytes / 2 + 2 * GIB
    assert double.tokens > 2 * single.tokens
    per_token = kv_bytes_per_token(LLAMA_70B, KvCacheDtype.AUTO, 8) / 2
    assert double.tokens == pytest.approx(double.usable_bytes / per_token, rel=0.01)
    assert max_model_len_that_fits(LLAMA_70B, double, KvCacheDtype.AUTO, 8, 2) > max_model_len_that_fits(
        LLAMA_70B, single, KvCacheDtype.AUTO, 8)


def test_405b_bf16_fits_two_h100_nodes_not_one() -> None:
    args = (LLAMA_405B, H100.memory_bytes, Precision.BF16, KvCacheDtype.AUTO, 8, 0.9, 8192, 64)
    assert not compute_kv_capacity(*args).fits
    assert compute_kv_capacity(*args, None, 2).fits


# ------------------------------------------------------------------ step time


def test_a_pp_step_is_the_whole_model_pass_of_a_micro_batch_plus_the_hand_offs() -> None:
    pp2 = build_replica_model(_setup(2))
    pp1 = build_replica_model(_setup(1))
    eff = pp2.setup.efficiency
    batch, context = np.array([1.0, 8.0, 64.0]), 1500.0
    micro = np.maximum(batch / 2, 1.0)
    transfers = (estimate_stage_transfer_s(H100, LLAMA_70B.hidden_size, micro, ACTIVATION_BYTES, eff)
                 + eff.stage_transfer_latency_s)
    # Each stage does 1/PP of the layers: the PP stages of a micro-batch sum to the model on TP ranks.
    expected = pp1.step_s(micro, context) + transfers
    assert np.allclose(pp2.step_s(batch, context), expected)
    # More than the stages' compute alone: the transfers (and a lone sequence gains nothing: the bubble).
    assert np.all(pp2.step_s(batch, context) > pp1.step_s(micro, context))
    assert pp2.step_s(1.0, context) > pp1.step_s(1.0, context)


def test_a_prompt_passes_every_stage_in_turn() -> None:
    pp2 = build_replica_model(_setup(2))
    pp1 = build_replica_model(_setup(1))
    # Prefill is not faster with PP: a chunk goes through all stages, and crosses the boundary.
    assert float(pp2.prefill_s(4000.0)) > float(pp1.prefill_s(4000.0))
    assert float(pp2.prefill_s(4000.0)) < float(pp1.prefill_s(4000.0)) * 1.1


def test_the_hand_off_charges_hidden_states_over_the_inter_node_link() -> None:
    eff = build_replica_model(_setup(2)).setup.efficiency
    tokens = 1000.0
    seconds = float(estimate_stage_transfer_s(H100, 8192, tokens, 2, eff))
    expected = eff.stage_transfer_latency_s + tokens * 8192 * 2 * 2 / (gbit_per_s_to_bytes_per_s(400) * eff.inter_node)
    assert seconds == pytest.approx(expected)
    slow = replace(H100, inter_node_bytes_per_s=gbit_per_s_to_bytes_per_s(25))
    assert float(estimate_stage_transfer_s(slow, 8192, tokens, 2, eff)) > 10 * seconds
    assert float(estimate_stage_transfer_s(H100, 8192, 0.0, 2, eff)) == 0.0


def test_single_node_step_times_are_unchanged_by_the_pp_code() -> None:
    model = build_replica_model(_setup(1))
    assert model.setup.gpus == 8
    batch = np.array([1.0, 32.0, 256.0])
    eff = model.setup.efficiency
    assert np.array_equal(model.step_s(batch, 2000.0), model._pass_s(batch, 2000.0, 0.0, 0.0, 0.0)
                          + eff.step_overhead_s)


# ------------------------------------------------------------------ planner


def test_layouts_fill_nodes_before_spanning_them() -> None:
    layouts = parallel_layouts(LLAMA_70B, 8, None, None)
    assert (1, 1) in layouts and (8, 1) in layouts and (8, 2) in layouts and (4, 2) not in layouts
    assert parallel_layouts(LLAMA_70B, 4, None, 2) == [(4, 2)]
    assert parallel_layouts(LLAMA_70B, 8, None, 1) == [(1, 1), (2, 1), (4, 1), (8, 1)]


def test_405b_bf16_on_h100_plans_two_nodes_per_replica() -> None:
    plan = plan_deployment(build_plan_inputs(_example("llama-3.1-405b-h100.yaml")))
    chosen = plan.chosen
    assert chosen is not None
    assert (chosen.tensor_parallel, chosen.pipeline_parallel) == (8, 2)
    assert chosen.gpus == chosen.replicas * 16
    assert chosen.cost_per_hour == pytest.approx(chosen.gpus * H100.usd_per_hour)
    assert "2 nodes x 8 H100-SXM" in plan.explanation
    assert "TP 8 within a node, PP 2 across nodes over 400 Gb/s" in plan.explanation
    assert "no single node serves the model" in plan.explanation
    assert all(c.pipeline_parallel == 1 for c in plan.rejected if "8 x H100-SXM:" in c.rejection)
    body = plan.to_dict()
    assert body["pipeline_parallel"] == 2 and body["nodes_per_replica"] == 2
    assert chosen.predicted is not None and chosen.predicted.tpot_ms <= plan.tpot_slo_ms
    assert " PP" in render_plan("llama-405b", plan)


def test_70b_on_four_gpu_l40s_nodes_is_one_node_and_two_cost_more() -> None:
    spec = _example("llama-3.1-70b-l40s.yaml")
    plan = plan_deployment(build_plan_inputs(spec))
    assert plan.feasible and plan.chosen is not None
    assert (plan.chosen.tensor_parallel, plan.chosen.pipeline_parallel) == (4, 1)
    # TPOT binds on one node; PP adds memory, not speed, so two nodes are not even tried ...
    assert plan.chosen.binding == "tpot"
    assert all(c.pipeline_parallel == 1 for c in (*plan.alternatives, *plan.rejected))
    # ... and pinned, they serve the same load at a higher price.
    pinned = spec.model_copy(update={"serving": spec.serving.model_copy(update={"pipeline_parallel": 2})})
    two = plan_deployment(build_plan_inputs(pinned))
    assert two.chosen is not None and (two.chosen.tensor_parallel, two.chosen.pipeline_parallel) == (4, 2)
    assert two.chosen.cost_per_hour > plan.chosen.cost_per_hour
    assert "2 nodes x 4 L40S" in two.explanation and "over 50 Gb/s" in two.explanation


def test_deepseek_r1_bf16_spans_more_than_two_h100_nodes() -> None:
    plan = plan_deployment(build_plan_inputs(_example("deepseek-r1-h100.yaml")))
    assert plan.chosen is not None and plan.chosen.pipeline_parallel >= 3
    assert any(c.pipeline_parallel == 2 and c.rejection.startswith("does not fit") for c in plan.rejected)


def test_single_node_models_still_plan_on_one_node() -> None:
    for name in ("llama-3.1-70b-h100.yaml", "llama-3.1-8b-l4.yaml", "deepseek-v3-h200.yaml"):
        plan = plan_deployment(build_plan_inputs(_example(name)))
        assert plan.chosen is not None and plan.chosen.pipeline_parallel == 1, name


def test_pinning_pp1_keeps_405b_bf16_off_multi_node_and_says_why() -> None:
    spec = _example("llama-3.1-405b-h100.yaml")
    pinned = spec.model_copy(update={"serving": spec.serving.model_copy(update={"pipeline_parallel": 1})})
    plan = plan_deployment(build_plan_inputs(pinned))
    assert not plan.feasible and plan.binding_constraint == "memory"


def test_the_inter_node_override_reaches_the_model() -> None:
    spec = _example("llama-3.1-405b-h100.yaml")
    slow = spec.model_copy(update={"gpu": spec.gpu.model_copy(update={"inter_node_gbit_per_s": 10.0})})
    fast_plan = plan_deployment(build_plan_inputs(spec))
    slow_inputs = build_plan_inputs(slow)
    assert slow_inputs.gpus[0].inter_node_bytes_per_s == pytest.approx(10e9 / 8)
    slow_plan = plan_deployment(slow_inputs)
    assert "over 10 Gb/s" in slow_plan.explanation
    assert fast_plan.chosen is not None and slow_plan.chosen is not None
    assert fast_plan.chosen.predicted is not None and slow_plan.chosen.predicted is not None
    assert slow_plan.chosen.predicted.ttft_ms > fast_plan.chosen.predicted.ttft_ms


def test_every_catalog_gpu_has_an_inter_node_link() -> None:
    for entry in load_catalog().gpu_entries():
        assert find_gpu(entry.name).inter_node_bytes_per_s > 0, entry.name
        assert entry.inter_node_source, entry.name


# ------------------------------------------------------------------ operator


OWNER = Owner(name="llama-405b", namespace="team-a", uid="0b8e2c6a-0000-4000-8000-000000000405")


def _world(previous_status: dict[str, Any] | None = None) -> World:
    document = yaml.safe_load((ROOT / "examples" / "llama-3.1-405b-h100.yaml").read_text())
    body: dict[str, Any] = {"apiVersion": "kvscale.dev/v1alpha1", "kind": "LLMDeployment",
                            "metadata": {"name": OWNER.name, "namespace": OWNER.namespace, "uid": OWNER.uid,
                                         "generation": 1, "resourceVersion": "7"},
                            "spec": document["spec"]}
    if previous_status is not None:
        body["status"] = previous_status
    return World(body=body, deployment=None, service=None, nodes=(), config_map=None,
                 now=datetime(2026, 1, 5, 9, 0, 0, tzinfo=UTC))


def test_a_multi_node_plan_without_leader_worker_set_is_shown_but_nothing_is_written() -> None:
    intent = desire(_world(), {})
    assert intent.writes == ()
    status = intent.status
    assert status.plan is not None and status.plan.pipeline_parallel == 2 and status.plan.tensor_parallel == 8
    assert status.predicted is not None
    ready = find_condition(status.conditions, ConditionType.READY)
    planned = find_condition(status.conditions, ConditionType.PLANNED)
    assert planned is not None and planned.status == ConditionStatus.TRUE
    assert ready is not None and ready.status == ConditionStatus.FALSE
    assert ready.reason == "LeaderWorkerSetNotInstalled"
    assert "install LeaderWorkerSet" in ready.message and "pipelineParallel: 1" in ready.message
    assert [e.reason for e in intent.events].count("LeaderWorkerSetNotInstalled") == 1
    # The next pass says nothing new.
    again = desire(_world(status.model_dump(by_alias=True, exclude_none=True, mode="json")), {})
    assert "LeaderWorkerSetNotInstalled" not in [e.reason for e in again.events] and again.writes == ()


def test_the_builder_refuses_a_multi_node_replica() -> None:
    spec = parse_spec(yaml.safe_load((ROOT / "examples" / "llama-3.1-405b-h100.yaml").read_text())["spec"])
    inputs = build_plan_inputs(spec)
    plan = plan_deployment(inputs)
    assert plan.chosen is not None
    with pytest.raises(MultiNodeNotSupportedError, match="spans 2 nodes"):
        build_deployment(OWNER, spec, plan.chosen, 1, gpu=inputs.gpus[0], native_precision=Precision.BF16)
