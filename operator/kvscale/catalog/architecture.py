"""Model architectures as the performance model sees them, read from a Hugging Face config.json.

The catalog's data file stores the relevant config.json fields verbatim, so catalog entries and
user-supplied config.json files go through the same loader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvscale.api.spec import Precision
from kvscale.errors import ModelConfigError

# Wrappers (multimodal, Gemma 3) nest the language model's fields under one of these keys.
_NESTED_TEXT_KEYS = ("text_config", "language_config", "llm_config")


@dataclass(frozen=True)
class ModelArchitecture:
    """Shape of a decoder-only transformer; every count is per model (not per TP rank)."""

    name: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_context_tokens: int
    tie_word_embeddings: bool = False
    native_precision: Precision = Precision.BF16
    # Multi-head latent attention (DeepSeek): the cache holds one latent of kv_lora_rank + rope dims.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # Sliding-window attention: this many layers keep only the last `sliding_window_tokens`.
    sliding_window_tokens: int = 0
    num_sliding_layers: int = 0
    # Mixture of experts: `num_dense_layers` layers keep a dense FFN of `intermediate_size`.
    num_experts: int = 0
    num_experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0
    source: str = ""

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def num_full_attention_layers(self) -> int:
        return self.num_layers - self.num_sliding_layers


def _require_int(config: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = config.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ModelConfigError(f"config.json field {key!r} must be a non-negative integer, got {value!r}")
            return int(value)
    if default is not None:
        return default
    raise ModelConfigError(f"config.json lacks {' / '.join(repr(k) for k in keys)}")


def _native_precision(config: Mapping[str, Any]) -> Precision:
    quant = config.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower()
    if method == "mxfp4":
        return Precision.MXFP4
    if method == "fp8" or quant.get("fmt") in ("e4m3", "e5m2"):
        return Precision.FP8
    if method in ("awq", "gptq") or quant.get("bits") == 4:
        return Precision.INT4
    if quant.get("bits") == 8:
        return Precision.INT8
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").lower()
    return Precision.FP16 if dtype in ("float16", "fp16", "half") else Precision.BF16


def _sliding_layers(config: Mapping[str, Any], num_layers: int) -> tuple[int, int]:
    """(window tokens, number of sliding-window layers); (0, 0) when every layer attends fully."""
    window = config.get("sliding_window")
    if not window or config.get("use_sliding_window") is False:
        return 0, 0
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        sliding = sum(1 for t in layer_types if "sliding" in str(t))
        return int(window), sliding
    pattern = config.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 1:
        # Gemma 3: every `pattern`-th layer is global, the others local.
        return int(window), num_layers - num_layers // pattern
    if config.get("max_window_layers") is not None and config.get("use_sliding_window"):
        return int(window), max(0, num_layers - int(config["max_window_layers"]))
    # A window on every layer (Mistral-7B-v0.1 style).
    return int(window), num_layers


def architecture_from_hf_config(config: Mapping[str, Any], name: str, source: str = "") -> ModelArchitecture:
    """Build a ModelArchitecture from a Hugging Face config.json mapping.

    Raises ModelConfigError naming the missing field when the config lacks what the model needs.
    """
    text: Mapping[str, Any] = config
    for key in _NESTED_TEXT_KEYS:
        nested = config.get(key)
        if isinstance(nested, Mapping) and "hidden_size" in nested:
            text = {**nested, "quantization_config": config.get("quantization_config"),
                    "torch_dtype": nested.get("torch_dtype") or config.get("torch_dtype")}
            break
    hidden = _require_int(text, "hidden_size", "d_model", "n_embd")
    layers = _require_int(text, "num_hidden_layers", "n_layer", "num_layers")
    heads = _require_int(text, "num_attention_heads", "n_head")
    kv_heads = _require_int(text, "num_key_value_heads", "num_kv_heads", default=heads)
    if heads == 0 or kv_heads == 0 or hidden == 0 or layers == 0:
        raise ModelConfigError("config.json has zero layers, heads or hidden size")
    head_dim = _require_int(text, "head_dim", default=hidden // heads)
    num_experts = _require_int(text, "n_routed_experts", "num_local_experts", "num_experts", default=0)
    experts_per_token = _require_int(text, "num_experts_per_tok", "experts_per_token", "moe_topk", default=0)
    if num_experts and not experts_per_token:
        raise ModelConfigError("config.json declares experts but not num_experts_per_tok")
    intermediate = _require_int(text, "intermediate_size", "ffn_hidden_size", default=4 * hidden)
    moe_intermediate = _require_int(text, "moe_intermediate_size", default=intermediate) if num_experts else 0
    dense_layers = 0
    if num_experts:
        dense_layers = _require_int(text, "first_k_dense_replace", default=0)
        mlp_only = text.get("mlp_only_layers") or []
        dense_layers += len(mlp_only) if isinstance(mlp_only, list) else 0
    window, sliding = _sliding_layers(text, layers)
    max_context = _require_int(text, "max_position_embeddings", "n_positions", "seq_length", default=4096)
    return ModelArchitecture(
        name=name,
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=_require_int(text, "vocab_size", "padded_vocab_size"),
        max_context_tokens=max_context,
        tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
        native_precision=_native_precision(text),
        kv_lora_rank=_require_int(text, "kv_lora_rank", default=0),
        q_lora_rank=_require_int(text, "q_lora_rank", default=0),
        qk_rope_head_dim=_require_int(text, "qk_rope_head_dim", default=0),
        qk_nope_head_dim=_require_int(text, "qk_nope_head_dim", default=0),
        v_head_dim=_require_int(text, "v_head_dim", default=0),
        sliding_window_tokens=window,
        num_sliding_layers=sliding,
        num_experts=num_experts,
        num_experts_per_token=experts_per_token,
        moe_intermediate_size=moe_intermediate,
        num_shared_experts=_require_int(text, "n_shared_experts", "num_shared_experts", default=0),
        num_dense_layers=dense_layers,
        source=source,
    )
