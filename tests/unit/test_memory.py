"""Memory model: exact KV figures, weights by precision, vLLM-style KV capacity."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscale.api.spec import KvCacheDtype, Precision
from kvscale.catalog import find_gpu, resolve_architecture
from kvscale.perfmodel.memory import (
    VLLM_BLOCK_SIZE_TOKENS,
    compute_kv_capacity,
    compute_parameter_counts,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    max_model_len_that_fits,
    replayed_prompt_hit_rate,
    weights_bytes_per_gpu,
)
from kvscale.units import GIB


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("meta-llama/Llama-3.1-70B-Instruct", 327_680),
        ("meta-llama/Llama-3.1-8B-Instruct", 131_072),
        ("Qwen/Qwen3-30B-A3B", 98_304),
        ("deepseek-ai/DeepSeek-V3", 70_272),
    ],
)
def test_kv_bytes_per_token_exact(model: str, expected: int) -> None:
    assert kv_bytes_per_token(resolve_architecture(model)) == expected


def test_fp8_kv_cache_halves_bytes() -> None:
    arch = resolve_architecture("llama-3.1-70b")
    assert kv_bytes_per_token(arch, KvCacheDtype.FP8) == 327_680 // 2


def test_mla_cache_is_replicated_across_ranks() -> None:
    arch = resolve_architecture("deepseek-ai/DeepSeek-V3")
    assert kv_bytes_per_token(arch, tensor_parallel=8) == kv_bytes_per_token(arch)


def test_gqa_cache_is_sharded_then_replicated_beyond_kv_heads() -> None:
    arch = resolve_architecture("llama-3.1-70b")  # 8 KV heads
    assert kv_bytes_per_token(arch, tensor_parallel=8) == 327_680 // 8
    assert kv_bytes_per_token(arch, tensor_parallel=16) == 327_680 // 8  # one head per rank, replicated


def test_sliding_window_layers_stop_growing_at_their_window() -> None:
    arch = resolve_architecture("openai/gpt-oss-120b")
    assert arch.num_sliding_layers > 0
    short = kv_bytes_per_sequence(arch, 100, KvCacheDtype.AUTO)
    long = kv_bytes_per_sequence(arch, 100_000, KvCacheDtype.AUTO)
    assert short == pytest.approx(100 * kv_bytes_per_token(arch))
    assert long < 100_000 * kv_bytes_per_token(arch) * 0.6


@pytest.mark.parametrize(
    ("model", "published_b"),
    [("llama-3.1-8b", 8.03), ("llama-3.1-70b", 70.6), ("meta-llama/Llama-3.1-405B-Instruct", 405.9),
     ("deepseek-ai/DeepSeek-V3", 671.0), ("mistralai/Mixtral-8x7B-Instruct-v0.1", 46.7)],
)
def test_parameter_counts_match_published_totals(model: str, published_b: float) -> None:
    total = compute_parameter_counts(resolve_architecture(model)).total / 1e9
    assert total == pytest.approx(published_b, rel=0.03)


def test_weights_scale_with_precision() -> None:
    arch = resolve_architecture("llama-3.1-70b")
    bf16 = weights_bytes_per_gpu(arch, Precision.BF16, 1)
    fp8 = weights_bytes_per_gpu(arch, Precision.FP8, 1)
    int4 = weights_bytes_per_gpu(arch, Precision.INT4, 1)
    assert 130 * GIB < bf16 < 133 * GIB  # 70.6 B params x 2 bytes
    assert bf16 > fp8 > int4
    assert int4 > bf16 / 4  # scales and 16-bit embeddings keep 4-bit above a quarter


@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8]))
def test_more_tensor_parallel_never_raises_weights_per_gpu(tp_a: int, tp_b: int) -> None:
    arch = resolve_architecture("llama-3.1-70b")
    low, high = sorted((tp_a, tp_b))
    assert weights_bytes_per_gpu(arch, Precision.BF16, high) <= weights_bytes_per_gpu(arch, Precision.BF16, low)


def test_kv_capacity_like_vllm_for_llama_8b_on_h100() -> None:
    # vLLM logs ~450-470k tokens of KV cache for Llama-3.1-8B bf16 on one H100 at 0.90 utilisation.
    arch = resolve_architecture("llama-3.1-8b")
    cap = compute_kv_capacity(arch, find_gpu("H100-SXM").memory_bytes, Precision.BF16, KvCacheDtype.AUTO,
                              1, 0.90, 8192, 256)
    assert 400_000 < cap.tokens < 500_000
    assert cap.tokens % 16 == 0


def test_70b_bf16_does_not_fit_one_80gb_gpu() -> None:
    arch = resolve_architecture("llama-3.1-70b")
    cap = compute_kv_capacity(arch, find_gpu("H100-SXM").memory_bytes, Precision.BF16, KvCacheDtype.AUTO,
                              1, 0.95, 2048, 1)
    assert not cap.fits
    assert max_model_len_that_fits(arch, cap, KvCacheDtype.AUTO, 1) == 0


def test_a_replayed_prompt_is_served_but_for_the_block_holding_its_last_token() -> None:
    """vLLM serves the full blocks below a cached prompt's last token: over lengths spread across a
    block, the tokens left to compute average (1 + block) / 2."""
    block = VLLM_BLOCK_SIZE_TOKENS
    lengths = range(200, 200 + block)  # one of every remainder
    computed = [length - block * ((length - 1) // block) for length in lengths]
    mean_length = sum(lengths) / block
    assert sum(computed) / block == pytest.approx((1 + block) / 2)
    assert replayed_prompt_hit_rate(mean_length) == pytest.approx(1.0 - sum(computed) / block / mean_length)
    assert replayed_prompt_hit_rate(5.0) == 0.0  # within the last block: nothing to serve
    assert replayed_prompt_hit_rate(0.0) == 0.0
