"""kvscale's routed-expert term against vLLM's own fused MoE kernel, timed alone on H100 and H200.

    .venv/bin/python benchmarks/moe_kernels.py [-v]     # a few seconds; reads benchmarks/data/moe/

The measurements are NVIDIA AIConfigurator's collected MoE tables for vLLM 0.24.0 (the file names its
repository, commit and paths): one fused MoE layer (bf16 Triton kernel) for 1-16,384 tokens routed evenly
top-k among E experts of hidden x inter, each expert's FFN sliced by TP. The model's term for one such layer
is its fixed cost per fused MoE call plus the larger of streaming the touched experts' weights (at the HBM
factor times the GPU's weight-streaming scale) and their FLOPs at the compute factor times the share that
experts this narrow reach (EfficiencyFactors.expert_compute_share).

What it asks: is the MoE term right across expert widths and TP? Until 2026-11-28 the model charged a MoE
layer two GEMMs' fixed cost (9 us) and the dense compute rate at any width: the kernels' one-token
latencies show 20-30 us beyond streaming, and a TP8 slice of Qwen3-30B-A3B's 768-wide experts (96 columns)
ran its tokens 3-4x slower than that rate. The fixed cost and the width law (half, exponent) are fitted
here on the shapes of models kvscale's catalog does not hold, and reported on the catalog's MoE models
(Mixtral-8x7B, Qwen3-30B-A3B, Qwen3-235B-A22B), which the fit did not see.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvscale.catalog import find_gpu
from kvscale.perfmodel import DEFAULT_EFFICIENCY, EfficiencyFactors

DATA = Path(__file__).parent / "data" / "moe" / "aiconfigurator.json"
BF16_BYTES = 2
# (hidden, expert FFN width, experts, top-k) of the catalog's MoE models: the evaluation set.
CATALOG_SHAPES = {
    (4096, 14336, 8, 2): "Mixtral-8x7B",
    (2048, 768, 128, 8): "Qwen3-30B-A3B",
    (4096, 1536, 128, 8): "Qwen3-235B-A22B",
}
# The fit streams experts at the share Hopper's GEMMs reach in the same collector's tables beside their
# fixed cost (benchmarks/gemm_shards.py: 0.85 + 3.5 us), not at the end-to-end factor: that one is refitted
# with this fit's output held fixed (benchmarks/fit_efficiency.py), and must not feed back into it.
KERNEL_STREAMING_SHARE = 0.85
DECODE_TOKENS = 256  # up to here a step's tokens stream the experts' weights; from PROMPT_TOKENS on they compute
PROMPT_TOKENS = 1024
# The fit's grid: fixed cost (us), half-rate width (columns per GPU), exponent.
FIXED_US = tuple(float(x) for x in range(0, 61, 2))
HALF_COLUMNS = tuple(float(x) for x in np.geomspace(25, 1600, 49).round(0))
EXPONENTS = tuple(float(x) for x in np.arange(0.5, 2.51, 0.04).round(2))


@dataclass(frozen=True)
class Layer:
    gpu: str
    hidden: int
    inter: int
    experts: int
    top_k: int
    tp: int
    tokens: int
    measured_s: float

    @property
    def columns(self) -> float:
        return self.inter / self.tp

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.hidden, self.inter, self.experts, self.top_k)

    @property
    def touched(self) -> int:
        """Experts with tokens: the table spreads the tokens evenly, so min(E, T k)."""
        return min(self.experts, self.tokens * self.top_k)

    @property
    def regime(self) -> str:
        if self.tokens <= DECODE_TOKENS:
            return f"decode (1-{DECODE_TOKENS} tokens)"
        if self.tokens >= PROMPT_TOKENS:
            return f"prompt (>= {PROMPT_TOKENS} tokens)"
        return "between"


def load_table(key: str) -> list[dict[str, Any]]:
    table = json.loads(DATA.read_text())[key]
    return [dict(zip(table["columns"], row, strict=True)) for row in table["rows"]]


def load_layers() -> list[Layer]:
    return [Layer(r["gpu"], r["hidden"], r["inter"], r["experts"], r["top_k"], r["tp"], r["tokens"],
                  r["latency_ms"] / 1e3) for r in load_table("fused")]


def model_layer_s(layers: list[Layer], eff: EfficiencyFactors, *, width_law: bool = True) -> np.ndarray:
    """The model's time for each fused MoE layer (ReplicaModel.pass_terms' expert part, one layer)."""
    out = np.empty(len(layers))
    for i, layer in enumerate(layers):
        gpu = find_gpu(layer.gpu)
        expert_params = 3 * layer.hidden * layer.columns  # gate, up and down, this GPU's slice
        stream_s = layer.touched * expert_params * BF16_BYTES / (
            gpu.hbm_bandwidth_bytes_per_s * eff.hbm_bandwidth * gpu.weight_streaming_scale)
        share = eff.expert_compute_share(layer.columns) if width_law else 1.0
        compute_s = layer.tokens * layer.top_k * 2 * expert_params / (gpu.bf16_flops_per_s * eff.compute * share)
        out[i] = max(stream_s, compute_s) + eff.moe_call_fixed_s
    return out


def old_model_layer_s(layers: list[Layer]) -> np.ndarray:
    """The term before 2026-11-28: two GEMMs' fixed cost, the dense compute rate at any width."""
    eff = replace(DEFAULT_EFFICIENCY, moe_call_fixed_s=2 * DEFAULT_EFFICIENCY.gemm_fixed_s)
    return model_layer_s(layers, eff, width_law=False)


def fit(layers: list[Layer]) -> tuple[float, float, float, float]:
    """(fixed s, half columns, exponent, mean |log error|) minimising the mean |log(model / measured)|
    over `layers`, on the grid above, streaming at KERNEL_STREAMING_SHARE, the default compute factor."""
    measured = np.array([layer.measured_s for layer in layers])
    base = replace(DEFAULT_EFFICIENCY, moe_call_fixed_s=0.0, hbm_bandwidth=KERNEL_STREAMING_SHARE)
    stream_s = model_layer_s(layers, replace(base, compute=1e9))  # the streaming term alone
    flops_s = np.array([layer.tokens * layer.top_k * 2 * 3 * layer.hidden * layer.columns for layer in layers])
    rate = np.array([find_gpu(layer.gpu).bf16_flops_per_s * base.compute for layer in layers])
    columns = np.array([layer.columns for layer in layers])
    fixed = np.array(FIXED_US)[:, None] * 1e-6
    best = (0.0, 0.0, 0.0, float("inf"))
    for half in HALF_COLUMNS:
        for exponent in EXPONENTS:
            share = 1.0 / (1.0 + (half / columns) ** exponent)
            terms = np.maximum(stream_s, flops_s / (rate * share))
            errors = np.abs(np.log((terms[None, :] + fixed) / measured[None, :])).mean(axis=1)
            i = int(np.argmin(errors))
            if errors[i] < best[3]:
                best = (float(fixed[i, 0]), half, exponent, float(errors[i]))
    return best


def median_error(predicted: np.ndarray, layers: list[Layer]) -> float:
    measured = np.array([layer.measured_s for layer in layers])
    return float(np.median(np.abs(predicted / measured - 1.0)))


def one_token_fixed_costs() -> dict[tuple[str, str, str], list[float]]:
    """Per (GPU, kernel, dtype): one token's latency beyond streaming its k experts at the model's rate."""
    bytes_per_weight = {"bfloat16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "int4_wo": 0.53, "w4a16_mxfp4": 0.53}
    out: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in load_table("one_token"):
        gpu = find_gpu(r["gpu"])
        weights = r["top_k"] * 3 * r["hidden"] * r["inter"] / r["tp"] * bytes_per_weight[r["dtype"]]
        stream_s = weights / (gpu.hbm_bandwidth_bytes_per_s * DEFAULT_EFFICIENCY.hbm_bandwidth
                              * gpu.weight_streaming_scale)
        out[(r["gpu"], r["kernel"], r["dtype"])].append(r["latency_ms"] / 1e3 - stream_s)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="every catalog layer")
    args = parser.parse_args()
    layers = load_layers()
    tuning = [layer for layer in layers if layer.shape not in CATALOG_SHAPES]
    evaluation = [layer for layer in layers if layer.shape in CATALOG_SHAPES]
    if not tuning or not evaluation:
        print(f"no measurements under {DATA}", file=sys.stderr)
        return 1
    eff = DEFAULT_EFFICIENCY
    fixed_s, half, exponent, loss = fit(tuning)
    print(f"{len(layers)} fused MoE layers (vLLM 0.24, bf16, H100 and H200): {len(tuning)} of "
          f"{len({layer.shape for layer in tuning})} shapes outside the catalog (tuning), {len(evaluation)} of the "
          f"catalog's {len(CATALOG_SHAPES)} MoE models (evaluation)")
    print(f"fit on the tuning shapes (streaming at {KERNEL_STREAMING_SHARE} of HBM): {fixed_s * 1e6:.0f} us per "
          f"call, half rate at {half:.0f} columns, exponent "
          f"{exponent:.2f} (mean |log error| {loss:.3f}); defaults: {eff.moe_call_fixed_s * 1e6:.0f} us, "
          f"{eff.expert_width_half_columns:.0f} columns, {eff.expert_width_exponent:.2f}")
    now, before = model_layer_s(evaluation, eff), old_model_layer_s(evaluation)
    print(f"\nevaluation shapes, median |error|: {median_error(now, evaluation):.1%} "
          f"(before the fixed cost and width law: {median_error(before, evaluation):.1%})")
    print("\npredicted / measured, median (range), by model, TP and regime:")
    print(f"{'model':16s} {'TP':>2s} {'columns':>7s} {'regime':26s} {'n':>3s} {'now':>17s} {'before':>17s}")
    groups: dict[tuple[str, int, str], list[int]] = defaultdict(list)
    for i, layer in enumerate(evaluation):
        groups[(CATALOG_SHAPES[layer.shape], layer.tp, layer.regime)].append(i)
    for (name, tp, regime), members in sorted(groups.items()):
        if regime == "between":
            continue
        measured = np.array([evaluation[i].measured_s for i in members])
        ratio_now, ratio_before = now[members] / measured, before[members] / measured
        columns = evaluation[members[0]].columns
        print(f"{name:16s} {tp:2d} {columns:7.0f} {regime:26s} {len(members):3d} "
              f"{np.median(ratio_now):5.2f} ({ratio_now.min():.2f}-{ratio_now.max():.2f}) "
              f"{np.median(ratio_before):5.2f} ({ratio_before.min():.2f}-{ratio_before.max():.2f})")
    print("\none token, latency beyond streaming its k experts (the fixed cost), median per kernel family:")
    for (gpu, kernel, dtype), costs in sorted(one_token_fixed_costs().items()):
        print(f"  {gpu:9s} {dtype:12s} {kernel[:60]:60s} {statistics.median(costs) * 1e6:6.1f} us (n={len(costs)})")
    if args.verbose:
        print()
        for i, layer in enumerate(evaluation):
            print(f"{layer.gpu:9s} {CATALOG_SHAPES[layer.shape]:16s} TP{layer.tp} {layer.tokens:6d} tokens: measured "
                  f"{layer.measured_s * 1e6:9.1f} us, model {now[i] * 1e6:9.1f} ({now[i] / layer.measured_s:.2f}), "
                  f"before {before[i] * 1e6:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
