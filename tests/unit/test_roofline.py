"""Step-time roofline and serving model: monotonicity and regime checks."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvscale.api.spec import Precision
from kvscale.catalog import find_gpu, resolve_architecture
from kvscale.perfmodel import (
    DEFAULT_EFFICIENCY,
    ReplicaModel,
    RequestShape,
    ServingSetup,
    build_replica_model,
    estimate_at_concurrency,
)
from kvscale.perfmodel.prediction import decode_bound
from kvscale.perfmodel.replica import gemm_calls_per_pass
from kvscale.perfmodel.serving import estimate_at_rate


def _model(name: str = "llama-3.1-8b", gpu: str = "H100-SXM", tp: int = 1, precision: Precision = Precision.BF16
           ) -> ReplicaModel:
    return build_replica_model(ServingSetup(resolve_architecture(name), find_gpu(gpu), tp, precision))


def test_small_batch_decode_is_memory_bound_and_near_weight_read_time() -> None:
    model = _model()
    gpu = find_gpu("H100-SXM")
    weight_read_s = 16.06e9 / gpu.hbm_bandwidth_bytes_per_s
    step = float(model.decode_step_s(1, 512))
    assert weight_read_s < step < 2.5 * weight_read_s
    assert decode_bound(model, 1, 512) == "memory-bandwidth"
    assert decode_bound(model, 4096, 16) == "compute"  # short context: FLOPs outgrow weight reads
    assert decode_bound(model, 4096, 2048) == "memory-bandwidth"  # long context: KV reads dominate


@settings(max_examples=40)
@given(st.integers(1, 512), st.integers(1, 512), st.integers(16, 8192))
@example(a=270, b=298, context=3387)  # prefill-bound: an unconverged closed loop once served 298 clients less
def test_more_batch_never_lowers_step_time_or_throughput(a: int, b: int, context: int) -> None:
    model = _model()
    low, high = sorted((a, b))
    assert float(model.decode_step_s(high, context)) >= float(model.decode_step_s(low, context))
    shape = RequestShape(context, 128)
    est = estimate_at_concurrency(model, shape, np.array([low, high], dtype=float))
    assert est.tpot_mean_s[1] >= est.tpot_mean_s[0] - 1e-12
    assert est.output_tokens_per_s[1] >= est.output_tokens_per_s[0] - 1e-9


def test_longer_context_costs_more_per_step() -> None:
    model = _model()
    assert float(model.decode_step_s(64, 8000)) > float(model.decode_step_s(64, 500))


def test_prefill_grows_superlinearly_with_prompt_length() -> None:
    model = _model()
    short, long = float(model.prefill_s(2048)), float(model.prefill_s(32768))
    assert long > 16 * short * 0.95


def test_tensor_parallel_speeds_up_decode_but_costs_communication() -> None:
    tp1, tp8 = _model("llama-3.1-70b", tp=2), _model("llama-3.1-70b", tp=8)
    assert float(tp8.decode_step_s(1, 1000)) < float(tp1.decode_step_s(1, 1000))
    pcie = _model("llama-3.1-8b", gpu="L4", tp=4)
    assert float(pcie.decode_step_s(1, 100)) > float(_model("llama-3.1-8b", gpu="L4", tp=1).decode_step_s(1, 100)) / 4


def test_moe_decode_reads_only_touched_experts() -> None:
    moe = _model("Qwen/Qwen3-30B-A3B")
    one, many = float(moe.decode_step_s(1, 100)), float(moe.decode_step_s(256, 100))
    assert many > 2 * one  # at batch 1 only 8 of 128 experts per layer are read


def test_fp8_weights_decode_faster_than_bf16() -> None:
    assert float(_model(precision=Precision.FP8).decode_step_s(8, 1000)) < float(_model().decode_step_s(8, 1000))


def test_chunked_prefill_slows_co_scheduled_decodes() -> None:
    model = _model()
    short_prompts = estimate_at_concurrency(model, RequestShape(100, 200), 64.0)
    long_prompts = estimate_at_concurrency(model, RequestShape(6000, 200), 64.0)
    assert float(long_prompts.tpot_mean_s) > 1.5 * float(short_prompts.tpot_mean_s)


def test_queueing_grows_ttft_toward_saturation() -> None:
    model = _model()
    shape = RequestShape(1000, 200)
    saturation = float(estimate_at_concurrency(model, shape, 64.0).request_rate)
    rates = np.array([0.1, 0.5, 0.9, 0.99]) * saturation
    est = estimate_at_rate(model, shape, rates, 64.0)
    assert np.all(np.diff(est.ttft_quantile_s) > 0)
    assert np.all(est.stable)
    over = estimate_at_rate(model, shape, 1.1 * saturation, 64.0)
    assert not bool(over.stable) and np.isinf(over.ttft_quantile_s)


def test_tpot_percentile_is_at_least_the_mean() -> None:
    est = estimate_at_rate(_model(), RequestShape(2000, 100), 5.0, 128.0, quantile=0.95)
    assert float(est.tpot_quantile_s) >= float(est.tpot_mean_s)


@pytest.mark.parametrize("quantile", [0.5, 0.9, 0.99])
def test_quantiles_order(quantile: float) -> None:
    est_low = estimate_at_rate(_model(), RequestShape(1000, 200), 10.0, 128.0, quantile=0.5)
    est = estimate_at_rate(_model(), RequestShape(1000, 200), 10.0, 128.0, quantile=quantile)
    assert float(est.ttft_quantile_s) >= float(est_low.ttft_quantile_s) - 1e-12


def test_every_gemm_of_a_pass_pays_a_fixed_cost_and_only_when_the_step_carries_tokens() -> None:
    dense = resolve_architecture("llama-3.1-8b")
    assert gemm_calls_per_pass(dense) == 32 * 4 + 1  # QKV, output, gate-up, down per layer; the LM head
    moe = resolve_architecture("deepseek-ai/DeepSeek-R1")
    dense_layers = moe.num_layers - moe.num_moe_layers
    # a MoE layer's router and shared expert are GEMMs; its fused routed-expert kernel pays moe_call_fixed_s
    assert gemm_calls_per_pass(moe) == moe.num_layers * 6 + dense_layers * 2 + moe.num_moe_layers * 3 + 1
    model = _model()
    free = build_replica_model(replace(model.setup, efficiency=replace(model.setup.efficiency, gemm_fixed_s=0.0)))
    gap = model.pass_terms(8, 1024).linear_s - free.pass_terms(8, 1024).linear_s
    assert float(gap) == pytest.approx(129 * model.setup.efficiency.gemm_fixed_s)
    # a pass without tokens launches no GEMM (the weights term is the roofline's, as before)
    assert float(model.pass_terms(0, 0).linear_s) == pytest.approx(float(free.pass_terms(0, 0).linear_s))


def test_a_moe_layer_pays_the_fused_kernels_fixed_cost_once() -> None:
    model = _model("Qwen/Qwen3-30B-A3B")
    eff = model.setup.efficiency
    free = build_replica_model(replace(model.setup, efficiency=replace(eff, moe_call_fixed_s=0.0)))
    gap = model.pass_terms(8, 1024).linear_s - free.pass_terms(8, 1024).linear_s
    assert float(gap) == pytest.approx(48 * eff.moe_call_fixed_s)  # 48 MoE layers
    assert float(model.pass_terms(0, 0).linear_s) == pytest.approx(float(free.pass_terms(0, 0).linear_s))


def test_narrow_expert_slices_compute_at_a_smaller_share_of_the_dense_rate() -> None:
    eff = DEFAULT_EFFICIENCY
    assert eff.expert_compute_share(eff.expert_width_half_columns) == pytest.approx(0.5)
    shares = [eff.expert_compute_share(columns) for columns in (96, 192, 384, 768, 14336)]
    assert shares == sorted(shares) and shares[-1] > 0.95 and shares[0] < 0.3
    # Qwen3-30B-A3B's 768-wide experts: TP8 slices them to 96 columns, a prompt's expert work slows
    tp1, tp8 = _model("Qwen/Qwen3-30B-A3B"), _model("Qwen/Qwen3-30B-A3B", tp=8)
    assert tp1.expert_compute_share == pytest.approx(eff.expert_compute_share(768))
    assert tp8.expert_compute_share == pytest.approx(eff.expert_compute_share(96))
    dense = _model()
    assert dense.expert_compute_share == 1.0


def test_an_a100_streams_weights_at_its_measured_share_of_the_fitted_factor() -> None:
    a100, h100 = find_gpu("A100-SXM-80GB"), find_gpu("H100-SXM")
    assert a100.weight_streaming_scale == pytest.approx(0.82) and h100.weight_streaming_scale == 1.0
    model = _model(gpu="A100-SXM-80GB")
    eff = model.setup.efficiency
    streaming_s = model.always_read_bytes / (a100.hbm_bandwidth_bytes_per_s * eff.hbm_bandwidth * 0.82)
    fixed_s = model.gemm_calls_per_pass * eff.gemm_fixed_s
    assert float(model.pass_terms(1, 16).linear_s) == pytest.approx(streaming_s + fixed_s, rel=1e-3)
