"""The shipped model and GPU catalogs: presence, lookups, and the architecture facts they must reproduce."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvscale import units
from kvscale.api.spec import Precision
from kvscale.catalog import (
    ModelArchitecture,
    architecture_from_hf_config,
    find_gpu,
    find_model_entry,
    load_catalog,
    read_config_json,
    resolve_architecture,
)
from kvscale.errors import ModelConfigError, UnknownGpuError, UnknownModelError

REQUIRED_MODELS = [
    "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.1-70B-Instruct",
    "meta-llama/Llama-3.1-405B-Instruct",
    "meta-llama/Llama-3.2-1B-Instruct",
    "meta-llama/Llama-3.2-3B-Instruct",
    "meta-llama/Llama-3.3-70B-Instruct",
    "Qwen/Qwen2.5-3B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-32B-Instruct",
    "Qwen/Qwen2.5-72B-Instruct",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen3-32B",
    "Qwen/Qwen3-30B-A3B",
    "Qwen/Qwen3-235B-A22B",
    "mistralai/Mistral-7B-Instruct-v0.3",
    "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "deepseek-ai/DeepSeek-V3",
    "deepseek-ai/DeepSeek-R1",
    "openai/gpt-oss-20b",
    "openai/gpt-oss-120b",
    "google/gemma-3-27b-it",
]

REQUIRED_GPUS = [
    "H100-SXM",
    "H100-PCIe",
    "H200",
    "B200",
    "A100-SXM-80GB",
    "A100-40GB",
    "L40S",
    "L4",
    "A10G",
    "MI300X",
    "RTX-4090",
    "RTX-5070-Ti",
]

BF16_BYTES = 2


def kv_bytes_per_token(arch: ModelArchitecture) -> int:
    """KV-cache bytes one token occupies at 16-bit precision, over all layers (no sliding window)."""
    if arch.is_mla:
        # MLA caches one compressed latent plus the shared rope key per layer.
        return arch.num_layers * (arch.kv_lora_rank + arch.qk_rope_head_dim) * BF16_BYTES
    return 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * BF16_BYTES


def attention_params_per_layer(arch: ModelArchitecture) -> int:
    h = arch.hidden_size
    if arch.is_mla:
        qk_head = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        if arch.q_lora_rank:
            q = h * arch.q_lora_rank + arch.q_lora_rank * arch.num_attention_heads * qk_head
        else:
            q = h * arch.num_attention_heads * qk_head
        kv_down = h * (arch.kv_lora_rank + arch.qk_rope_head_dim)
        kv_up = arch.kv_lora_rank * arch.num_attention_heads * (arch.qk_nope_head_dim + arch.v_head_dim)
        out = arch.num_attention_heads * arch.v_head_dim * h
        return q + kv_down + kv_up + out
    q_and_o = 2 * h * arch.num_attention_heads * arch.head_dim
    k_and_v = 2 * h * arch.num_kv_heads * arch.head_dim
    return q_and_o + k_and_v


def param_count(arch: ModelArchitecture, *, active: bool = False, input_embedding: bool = True) -> int:
    """Weights of a decoder-only model from its shapes (norms and biases left out: under 0.1%).

    Gated FFN = 3 matrices of hidden x intermediate. MoE layers hold `num_experts` such experts of
    `moe_intermediate_size`, plus shared experts and a router; `active` counts only the routed
    experts a token uses.
    """
    h = arch.hidden_size
    embeddings = arch.vocab_size * h if input_embedding else 0
    lm_head = 0 if arch.tie_word_embeddings and input_embedding else arch.vocab_size * h
    dense_ffn = 3 * h * arch.intermediate_size
    per_layer_attention = attention_params_per_layer(arch)
    if not arch.is_moe:
        return embeddings + lm_head + arch.num_layers * (per_layer_attention + dense_ffn)
    expert = 3 * h * arch.moe_intermediate_size
    routed = arch.num_experts_per_token if active else arch.num_experts
    moe_ffn = (routed + arch.num_shared_experts) * expert + h * arch.num_experts
    return (
        embeddings
        + lm_head
        + arch.num_layers * per_layer_attention
        + arch.num_dense_layers * dense_ffn
        + arch.num_moe_layers * moe_ffn
    )


def param_tolerance(model_id: str) -> float:
    # gpt-oss experts carry biases and a fused gate_up projection the 3-matrix formula approximates.
    return 0.05 if "gpt-oss" in model_id else 0.03


# ------------------------------------------------------------------------------------------ models


def test_catalog_loads_and_every_entry_builds_an_architecture() -> None:
    catalog = load_catalog()
    entries = catalog.model_entries()
    assert entries
    for entry in entries:
        arch = resolve_architecture(entry.id)
        assert arch.name == entry.id
        assert arch.num_layers > 0 and arch.hidden_size > 0 and arch.vocab_size > 0
        assert arch.max_context_tokens >= 4096
        assert entry.source == f"https://huggingface.co/{entry.id}/blob/main/config.json"
        assert entry.total_params_b is not None and entry.total_params_b > 0
        assert (entry.active_params_b is not None) == arch.is_moe, entry.id


@pytest.mark.parametrize("model_id", REQUIRED_MODELS)
def test_required_model_is_present(model_id: str) -> None:
    assert find_model_entry(model_id).id == model_id


def test_aliases_do_not_repeat_the_id_or_its_short_name() -> None:
    for entry in load_catalog().model_entries():
        own = {entry.id.lower(), entry.id.split("/")[-1].lower()}
        aliases = [a.lower() for a in entry.aliases]
        assert not own & set(aliases), entry.id
        assert len(aliases) == len(set(aliases)), entry.id


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B-Instruct"),
        ("META-LLAMA/llama-3.1-70b-instruct", "meta-llama/Llama-3.1-70B-Instruct"),
        ("Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B-Instruct"),
        ("llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct"),
        ("LLAMA-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct"),
        ("meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct"),
        ("  qwen3-30b-a3b  ", "Qwen/Qwen3-30B-A3B"),
        ("QWEN/QWEN3-30B-A3B", "Qwen/Qwen3-30B-A3B"),
        ("deepseek-v3", "deepseek-ai/DeepSeek-V3"),
        ("GPT-OSS-120B", "openai/gpt-oss-120b"),
        ("gemma-3-27b", "google/gemma-3-27b-it"),
        # An unknown organisation in front of a known short name still resolves.
        ("some-mirror/Mixtral-8x7B-Instruct-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
    ],
)
def test_model_lookup_is_case_insensitive_by_id_alias_and_short_name(name: str, expected: str) -> None:
    assert find_model_entry(name).id == expected


def test_unknown_model_raises_and_lists_known_models() -> None:
    with pytest.raises(UnknownModelError) as excinfo:
        find_model_entry("acme/NotAModel-9B")
    message = str(excinfo.value)
    assert "acme/NotAModel-9B" in message
    assert "meta-llama/Llama-3.1-70B-Instruct" in message
    assert "deepseek-ai/DeepSeek-V3" in message


@pytest.mark.parametrize(
    ("model", "expected_bytes"),
    [
        ("meta-llama/Llama-3.1-70B-Instruct", 327_680),
        ("meta-llama/Llama-3.1-8B-Instruct", 131_072),
        ("Qwen/Qwen3-30B-A3B", 98_304),
        ("deepseek-ai/DeepSeek-V3", 70_272),
    ],
)
def test_kv_bytes_per_token_match_published_figures(model: str, expected_bytes: int) -> None:
    assert kv_bytes_per_token(resolve_architecture(model)) == expected_bytes


def test_llama_3_1_70b_attention_shape() -> None:
    arch = resolve_architecture("llama-3.1-70b")
    assert (arch.num_layers, arch.num_attention_heads, arch.num_kv_heads, arch.head_dim) == (80, 64, 8, 128)
    assert not arch.is_moe and not arch.is_mla and arch.num_sliding_layers == 0


def test_deepseek_v3_mla_and_moe_fields() -> None:
    arch = resolve_architecture("deepseek-ai/DeepSeek-V3")
    assert arch.is_mla and arch.is_moe
    assert (arch.kv_lora_rank, arch.q_lora_rank, arch.qk_rope_head_dim) == (512, 1536, 64)
    assert (arch.qk_nope_head_dim, arch.v_head_dim) == (128, 128)
    assert arch.num_experts == 256
    assert arch.num_experts_per_token == 8
    assert arch.num_shared_experts == 1
    assert arch.num_dense_layers == 3
    assert arch.num_moe_layers == 58
    assert arch.moe_intermediate_size == 2048 and arch.intermediate_size == 18432
    assert arch.native_precision is Precision.FP8


def test_deepseek_r1_shares_v3_architecture() -> None:
    v3 = resolve_architecture("deepseek-ai/DeepSeek-V3")
    r1 = resolve_architecture("deepseek-ai/DeepSeek-R1")
    assert kv_bytes_per_token(v3) == kv_bytes_per_token(r1)
    assert param_count(v3) == param_count(r1)


@pytest.mark.parametrize(
    ("model", "layers", "experts"), [("openai/gpt-oss-20b", 24, 32), ("openai/gpt-oss-120b", 36, 128)]
)
def test_gpt_oss_half_the_layers_slide_over_128_tokens(model: str, layers: int, experts: int) -> None:
    arch = resolve_architecture(model)
    assert arch.num_layers == layers
    assert arch.num_sliding_layers == layers // 2
    assert arch.num_full_attention_layers == layers // 2
    assert arch.sliding_window_tokens == 128
    assert (arch.num_experts, arch.num_experts_per_token) == (experts, 4)
    assert arch.head_dim == 64 and arch.num_kv_heads == 8
    assert arch.native_precision is Precision.MXFP4


def test_gemma_3_27b_text_config_is_read_with_its_sliding_pattern() -> None:
    arch = resolve_architecture("google/gemma-3-27b-it")
    assert arch.hidden_size == 5376 and arch.num_layers == 62
    assert (arch.num_attention_heads, arch.num_kv_heads, arch.head_dim) == (32, 16, 128)
    assert arch.num_sliding_layers == 52
    assert arch.num_full_attention_layers == 10
    assert arch.sliding_window_tokens == 1024
    assert arch.tie_word_embeddings
    assert arch.native_precision is Precision.BF16


@pytest.mark.parametrize(
    ("model", "experts", "top_k", "moe_intermediate"),
    [
        ("Qwen/Qwen3-30B-A3B", 128, 8, 768),
        ("Qwen/Qwen3-235B-A22B", 128, 8, 1536),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 8, 2, 14336),
    ],
)
def test_moe_fields_parsed(model: str, experts: int, top_k: int, moe_intermediate: int) -> None:
    arch = resolve_architecture(model)
    assert (arch.num_experts, arch.num_experts_per_token, arch.moe_intermediate_size) == (
        experts,
        top_k,
        moe_intermediate,
    )
    assert arch.num_dense_layers == 0 and arch.num_moe_layers == arch.num_layers
    assert arch.num_shared_experts == 0


@pytest.mark.parametrize(
    "model",
    [
        "Qwen/Qwen2.5-7B-Instruct",
        "Qwen/Qwen2.5-72B-Instruct",
        "Qwen/Qwen3-8B",
        "mistralai/Mistral-7B-Instruct-v0.3",
    ],
)
def test_disabled_or_absent_sliding_window_means_full_attention(model: str) -> None:
    arch = resolve_architecture(model)
    assert arch.num_sliding_layers == 0 and arch.sliding_window_tokens == 0


def test_small_llama_3_2_ties_embeddings_and_keeps_explicit_head_dim() -> None:
    one_b = resolve_architecture("llama-3.2-1b")
    assert one_b.tie_word_embeddings and one_b.head_dim == 64
    three_b = resolve_architecture("llama-3.2-3b")
    assert three_b.tie_word_embeddings and three_b.head_dim == 128


@pytest.mark.parametrize("model_id", REQUIRED_MODELS)
def test_parameter_count_from_architecture_matches_the_model_card(model_id: str) -> None:
    entry = find_model_entry(model_id)
    assert entry.total_params_b is not None
    counted_b = param_count(resolve_architecture(model_id)) / 1e9
    assert counted_b == pytest.approx(entry.total_params_b, rel=param_tolerance(model_id))


@pytest.mark.parametrize(
    "model_id", [m for m in REQUIRED_MODELS if find_model_entry(m).active_params_b is not None]
)
def test_active_parameter_count_matches_the_model_card(model_id: str) -> None:
    entry = find_model_entry(model_id)
    assert entry.active_params_b is not None
    # OpenAI's gpt-oss "active" figure leaves out the input embedding table (a lookup, not a matmul).
    arch = resolve_architecture(model_id)
    counted_b = param_count(arch, active=True, input_embedding="gpt-oss" not in model_id) / 1e9
    assert counted_b == pytest.approx(entry.active_params_b, rel=param_tolerance(model_id))


# --------------------------------------------------------------------------- user config.json files


def test_config_json_from_a_file_goes_through_the_same_loader(tmp_path: Path) -> None:
    config = dict(find_model_entry("meta-llama/Llama-3.1-8B-Instruct").config)
    config["architectures"] = ["LlamaForCausalLM"]  # fields the loader ignores are fine
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")

    loaded = read_config_json(path)
    arch = architecture_from_hf_config(loaded, name="my-llama", source=str(path))

    assert arch.name == "my-llama"
    assert arch.source == str(path)
    assert kv_bytes_per_token(arch) == 131_072
    inline = resolve_architecture("my-llama", loaded)
    assert inline == dataclasses.replace(arch, source=inline.source)
    catalog = resolve_architecture("meta-llama/Llama-3.1-8B-Instruct")
    assert dataclasses.replace(catalog, name="my-llama", source=arch.source) == arch


def test_config_missing_hidden_size_names_the_field(tmp_path: Path) -> None:
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ModelConfigError, match="hidden_size"):
        architecture_from_hf_config(read_config_json(path), name="broken")


def test_unreadable_config_json_raises_model_config_error(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ModelConfigError):
        read_config_json(path)
    with pytest.raises(ModelConfigError):
        read_config_json(tmp_path / "missing.json")


# -------------------------------------------------------------------------------------------- GPUs


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_required_gpu_is_present(name: str) -> None:
    assert find_gpu(name).name == name


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("h100", "H100-SXM"),
        ("H100-SXM5-80GB", "H100-SXM"),
        ("h100-sxm", "H100-SXM"),
        ("NVIDIA-H100-80GB-HBM3", "H100-SXM"),
        ("a100", "A100-SXM-80GB"),
        ("A100-80GB", "A100-SXM-80GB"),
        ("a100-40gb", "A100-40GB"),
        ("nvidia-l4", "L4"),
        ("  l40s ", "L40S"),
        ("mi300x", "MI300X"),
        ("rtx4090", "RTX-4090"),
        ("rtx-5070-ti", "RTX-5070-Ti"),
    ],
)
def test_gpu_lookup_is_case_insensitive_by_name_and_alias(name: str, expected: str) -> None:
    assert find_gpu(name).name == expected


def test_unknown_gpu_raises_and_lists_known_gpus() -> None:
    with pytest.raises(UnknownGpuError) as excinfo:
        find_gpu("TPU-v5e")
    message = str(excinfo.value)
    assert "TPU-v5e" in message
    for name in ("H100-SXM", "MI300X", "L4"):
        assert name in message


def test_gpu_spec_is_converted_to_si_units() -> None:
    h100 = find_gpu("H100-SXM")
    assert h100.memory_bytes == units.gib_to_bytes(79.65)
    assert 79 * units.GIB < h100.memory_bytes < 80 * units.GIB
    assert h100.hbm_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert h100.bf16_flops_per_s == pytest.approx(989.4e12)
    assert h100.interconnect == "nvlink"
    assert h100.interconnect_bytes_per_s == pytest.approx(450e9)
    assert h100.product_label == "NVIDIA-H100-80GB-HBM3"
    assert h100.resource_name == "nvidia.com/gpu"


def test_price_override_applies_to_the_spec_only() -> None:
    assert find_gpu("L4", price_usd_per_hour=0.5).usd_per_hour == 0.5
    assert find_gpu("L4").usd_per_hour != 0.5


def test_every_gpu_entry_is_consistent() -> None:
    entries = load_catalog().gpu_entries()
    assert {e.name for e in entries} >= set(REQUIRED_GPUS)
    labels = [e.product_label for e in entries]
    assert len(labels) == len(set(labels))
    for entry in entries:
        assert entry.source.startswith("https://"), entry.name
        assert entry.price_source, entry.name
        if entry.fp8_dense_tflops is not None:
            assert entry.fp8_dense_tflops >= entry.bf16_dense_tflops, entry.name
        if entry.fp4_dense_tflops is not None:
            assert entry.fp8_dense_tflops is not None
            assert entry.fp4_dense_tflops >= entry.fp8_dense_tflops, entry.name
        if entry.int8_dense_tops is not None:
            assert entry.int8_dense_tops >= entry.bf16_dense_tflops, entry.name
        if entry.interconnect == "pcie":
            assert entry.interconnect_gb_per_s <= 64, entry.name
        if entry.vendor == "amd":
            assert entry.resource_name == "amd.com/gpu" and entry.interconnect == "xgmi"
        else:
            assert entry.resource_name == "nvidia.com/gpu" and entry.product_label.startswith("NVIDIA-")


def test_memory_is_in_gib_as_the_driver_reports_it() -> None:
    # 80 GB HBM parts report 81559 MiB (H100) and 81920 MiB (A100); never the marketing "80".
    assert find_gpu("H100-SXM").memory_bytes == units.gib_to_bytes(round(81559 / 1024, 2))
    assert find_gpu("A100-SXM-80GB").memory_bytes == units.gib_to_bytes(81920 / 1024)
    assert find_gpu("L4").memory_bytes < 23 * units.GIB  # sold as "24 GB"
    assert find_gpu("H200").memory_bytes > find_gpu("H100-SXM").memory_bytes
    assert find_gpu("MI300X").memory_bytes == units.gib_to_bytes(191.69)


def test_ampere_and_a10g_have_no_fp8() -> None:
    for name in ("A100-SXM-80GB", "A100-40GB", "A10G"):
        assert find_gpu(name).fp8_flops_per_s is None
    assert find_gpu("B200").fp4_flops_per_s == pytest.approx(9000e12)
