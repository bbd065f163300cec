"""kvscale's step-time roofline against engine steps measured on real GPUs, term by term.

    .venv/bin/python benchmarks/kernel_steps.py [-v] [--json OUT]     # a second; reads benchmarks/data/kernel_steps/

The measurements come from `benchmarks/gpu/measure_steps.py`, run on one H100 SXM and one H200 (random
weights, CUDA graphs; cuBLAS GEMMs and PyTorch's fused attention; docs/accuracy.md says what they are and
are not). Each measured step is set against the model's terms for the same per-GPU shard
(`ReplicaModel.pass_terms`: no all-reduce, no per-step overhead, because one GPU replaying a graph has
neither), by regime: weight streaming, the ridge between memory- and tensor-bound, tensor-bound prompt
chunks, KV-cache reads, prompt attention. The factors under test are the defaults; nothing here was fitted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvscale.api.spec import Precision
from kvscale.catalog import find_gpu, resolve_architecture
from kvscale.perfmodel import DEFAULT_EFFICIENCY, ReplicaModel, ServingSetup, build_replica_model

DATA = Path(__file__).parent / "data" / "kernel_steps"
GPU_BY_DEVICE_NAME = {"NVIDIA H200": "H200", "NVIDIA H100 80GB HBM3": "H100-SXM"}
REPEAT_MARK = "-repeat"  # a later run of the same cases on another machine of the kind: the spread
LOOP_SUFFIX = "-loop"  # MoE shards with one cuBLAS GEMM per expert instead of PyTorch's grouped GEMM
LARGE_KV_READ = 65_536  # decodes x cache length from which the KV reads outweigh the kernels' fixed costs
PROMPT_CHUNK = 1024  # prompt tokens in a step from which the linear layers are tensor-bound here


@dataclass(frozen=True)
class Comparison:
    gpu: str
    model: str
    tensor_parallel: int
    part: str
    decode_seqs: int
    context_tokens: int
    prefill_tokens: int
    regime: str
    measured_s: float
    predicted_s: float
    achieved: float | None  # achieved / datasheet peak of the bound resource, where the regime has one
    model_factor: float | None  # the model's factor for that resource

    @property
    def ratio(self) -> float:
        return self.predicted_s / self.measured_s


def is_side_run(path: Path) -> bool:
    """A repeat or a kernel variant: read for its spread against the main run, not compared itself."""
    return REPEAT_MARK in path.stem or path.stem.endswith(LOOP_SUFFIX)


def regime_of(part: str, decodes: int, context: int, prefill: int, moe: bool = False) -> str:
    if moe:  # PyTorch's grouped GEMM over the routed experts; routing's gather and scatter unfused
        if part == "linear":
            if prefill == 0:
                return "MoE linear (grouped GEMM): decode batch 1-256"
            if decodes == 0:
                return f"MoE linear (grouped GEMM): prompt chunk >= {PROMPT_CHUNK} tokens"
            return "MoE linear (grouped GEMM): mixed"
        if part == "step":
            return "MoE whole step (routing's gather/scatter unfused)"
    if part.startswith("linear"):
        precision = " fp8" if part == "linear_fp8" else ""
        if prefill == 0:
            return f"linear{precision}: weights streamed (decode batch <= 64)" if decodes <= 64 else \
                f"linear{precision}: ridge (decode batch 128-256)"
        if decodes == 0 and prefill >= PROMPT_CHUNK:
            return f"linear{precision}: tensor-bound (prompt chunk >= {PROMPT_CHUNK} tokens)"
        return f"linear{precision}: small chunk or mixed"
    if part == "attention":
        if prefill == 0:
            if decodes * context >= LARGE_KV_READ:
                return "attention: KV reads (decodes x context >= 65k)"
            return "attention: small decode batches (fixed costs)"
        if decodes == 0:
            return f"attention: prompt chunk {'>= 4096' if prefill >= 4096 else '< 4096'} tokens"
        return "attention: mixed"
    kind = "decode" if prefill == 0 else "prompt" if decodes == 0 else "mixed"
    return f"whole step ({kind})"


def _achieved(model: ReplicaModel, part: str, decodes: int, context: int, prefill: int,
              measured_s: float) -> tuple[float | None, float | None]:
    """(achieved fraction of the datasheet peak, the model's factor) for the regime's bound resource."""
    eff = model.setup.efficiency
    bandwidth = model.setup.gpu.hbm_bandwidth_bytes_per_s
    if part.startswith("linear") and prefill == 0 and (decodes <= 64 or model.arch.is_moe):
        return float(model.weight_bytes_per_pass(decodes)) / measured_s / bandwidth, eff.hbm_bandwidth
    if part.startswith("linear") and decodes == 0 and prefill >= PROMPT_CHUNK:
        # Expert FLOPs as the model counts them: at the share of the dense rate their width reaches.
        per_token = model.linear_flops_per_token + model.expert_flops_per_token / model.expert_compute_share
        flops = prefill * per_token + model.lm_head_flops_per_token
        return flops / measured_s / model.linear_flops_per_s, eff.compute
    if part == "attention" and prefill == 0 and decodes * context >= LARGE_KV_READ:
        kv_bytes = decodes * context * model.kv_bytes_per_token_per_layer * model.arch.num_layers
        return kv_bytes / measured_s / bandwidth, eff.attention_bandwidth
    if part == "attention" and decodes == 0:
        flops = prefill * prefill / 2.0 * model.attention_flops_per_token_pair
        return flops / measured_s / model.attention_flops_per_s, eff.compute
    return None, None


def compare_file(path: Path) -> list[Comparison]:
    report = json.loads(path.read_text())
    gpu = find_gpu(GPU_BY_DEVICE_NAME[report["device"]])
    models: dict[tuple[str, int, str], ReplicaModel] = {}
    rows = []
    for timing in report["timings"]:
        part, tp = timing["part"], timing["tensor_parallel"]
        precision = Precision.FP8 if part == "linear_fp8" else Precision.BF16
        key = (timing["model"], tp, precision.value)
        if key not in models:
            setup = ServingSetup(resolve_architecture(timing["model"]), gpu, tp, precision,
                                 efficiency=DEFAULT_EFFICIENCY)
            models[key] = build_replica_model(setup)
        model = models[key]
        decodes, context, prefill = timing["decode_seqs"], timing["context_tokens"], timing["prefill_tokens"]
        # A prompt's first chunk: causal attention over itself, one logit row.
        terms = model.pass_terms(decodes, context, prefill, prefill * prefill / 2.0, 1 if prefill else 0)
        attention_s = float(terms.decode_attention_s + terms.prefill_attention_s)
        predicted = {"linear": float(terms.linear_s), "linear_fp8": float(terms.linear_s),
                     "attention": attention_s, "step": float(terms.linear_s) + attention_s}[part]
        achieved, factor = _achieved(model, part, decodes, context, prefill, timing["mean_s"])
        rows.append(Comparison(gpu.name, timing["model"], tp, part, decodes, context, prefill,
                               regime_of(part, decodes, context, prefill, model.arch.is_moe), timing["mean_s"],
                               predicted, achieved, factor))
    return rows


def fixed_costs(rows: list[Comparison]) -> dict[tuple[str, str], dict[str, float]]:
    """Per layer at one decode over 1k tokens: the attention call, and what the whole step adds beyond its
    linear layers and attention (norms, RoPE, activations, residuals: unfused PyTorch ops here)."""
    found: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for row in rows:
        if row.regime.startswith("MoE"):  # their step adds unfused routing, not what this reads
            continue
        if (row.decode_seqs, row.context_tokens, row.prefill_tokens) == (1, 1024, 0):
            found[(row.gpu, f"{row.model} TP{row.tensor_parallel}")][row.part] = row.measured_s
    out = {}
    for key, parts in found.items():
        layers = resolve_architecture(key[1].rsplit(" TP", 1)[0]).num_layers
        if {"step", "linear", "attention"} <= parts.keys():
            out[key] = {"attention_us_per_layer": parts["attention"] / layers * 1e6,
                        "other_us_per_layer": (parts["step"] - parts["linear"] - parts["attention"]) / layers * 1e6}
    return out


def side_run_spread(paths: list[Path]) -> list[tuple[str, int, float, float]]:
    """(file, matched timings, median and largest relative difference) between a side run and its main run:
    a repeat on another machine (|difference|), or a MoE kernel variant (its time / the main run's - 1)."""
    out = []
    for path in paths:
        if not is_side_run(path):
            continue
        stem = path.stem.split(REPEAT_MARK)[0] if REPEAT_MARK in path.stem else path.stem[: -len(LOOP_SUFFIX)]
        first = path.with_name(stem + path.suffix)
        if not first.exists():
            continue
        if path.stem.endswith(LOOP_SUFFIX):
            continue  # loop_against_grouped

        def index(p: Path) -> dict[tuple[Any, ...], float]:
            report = json.loads(p.read_text())
            return {(t["model"], t["tensor_parallel"], t["part"], t["decode_seqs"], t["context_tokens"],
                     t["prefill_tokens"]): t["mean_s"] for t in report["timings"]}

        a, b = index(first), index(path)
        diffs = [abs(b[k] / a[k] - 1.0) for k in a.keys() & b.keys()]
        if diffs:
            out.append((path.name, len(diffs), statistics.median(diffs), max(diffs)))
    return out


def loop_against_grouped(paths: list[Path]) -> dict[str, tuple[int, float, float, float]]:
    """Per MoE model: (timings, median, min, max) of the linear layers' time with one cuBLAS GEMM per expert
    over their time with PyTorch's grouped GEMM (same machine kind, same routing)."""
    ratios: dict[str, list[float]] = defaultdict(list)
    for path in paths:
        if not path.stem.endswith(LOOP_SUFFIX):
            continue
        first = path.with_name(path.stem[: -len(LOOP_SUFFIX)] + path.suffix)
        if not first.exists():
            continue
        grouped = {(t["model"], t["decode_seqs"], t["context_tokens"], t["prefill_tokens"]): t["mean_s"]
                   for t in json.loads(first.read_text())["timings"] if t["part"] == "linear"}
        for t in json.loads(path.read_text())["timings"]:
            key = (t["model"], t["decode_seqs"], t["context_tokens"], t["prefill_tokens"])
            if t["part"] == "linear" and key in grouped:
                ratios[t["model"]].append(t["mean_s"] / grouped[key])
    return {model: (len(r), statistics.median(r), min(r), max(r)) for model, r in ratios.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="every comparison")
    parser.add_argument("--json", help="write every comparison here")
    args = parser.parse_args()
    paths = sorted(DATA.glob("*.json"))
    rows = [row for path in paths if not is_side_run(path) for row in compare_file(path)]
    if not rows:
        print(f"no measurements under {DATA}", file=sys.stderr)
        return 1
    eff = DEFAULT_EFFICIENCY
    print(f"{len(rows)} measured step parts from {len(paths)} files; model factors: HBM {eff.hbm_bandwidth}, "
          f"KV reads {eff.attention_bandwidth}, tensor {eff.compute} (per-step overhead "
          f"{eff.step_overhead_s * 1e3:.1f} ms left out)")
    print("\npredicted / measured by regime (1.00 = exact; < 1 the model is faster than the GPU):")
    print(f"{'gpu':9s} {'regime':56s} {'n':>3s} {'median':>7s} {'range':>12s} {'achieved':>9s} {'model':>6s}")
    groups: dict[tuple[str, str], list[Comparison]] = defaultdict(list)
    for row in rows:
        groups[(row.gpu, row.regime)].append(row)
    for (gpu, regime), members in sorted(groups.items()):
        ratios = [m.ratio for m in members]
        achieved = [m.achieved for m in members if m.achieved is not None]
        factor = next((m.model_factor for m in members if m.model_factor is not None), None)
        achieved_text = f"{statistics.median(achieved):.2f}" if achieved else ""
        factor_text = f"{factor:.2f}" if factor is not None else ""
        print(f"{gpu:9s} {regime:56s} {len(members):3d} {statistics.median(ratios):7.2f} "
              f"{min(ratios):5.2f}-{max(ratios):<6.2f} {achieved_text:>9s} {factor_text:>6s}")
    print("\nfixed costs per layer at one decode over 1,024 tokens (measured):")
    for (gpu, shard), costs in sorted(fixed_costs(rows).items()):
        print(f"  {gpu:9s} {shard:42s} attention {costs['attention_us_per_layer']:5.1f} us, "
              f"norms/RoPE/activations {costs['other_us_per_layer']:5.1f} us")
    for name, matched, median, largest in side_run_spread(paths):
        print(f"\nrun-to-run spread ({name} against its first run, another machine of the kind): "
              f"{matched} timings, median {median:.1%}, largest {largest:.1%}")
    loops = loop_against_grouped(paths)
    if loops:
        print("\nMoE linear layers with one cuBLAS GEMM per expert, time / PyTorch's grouped GEMM's:")
        for model, (count, median, low, high) in sorted(loops.items()):
            print(f"  {model:42s} {count:2d} timings: median {median:.2f} ({low:.2f}-{high:.2f})")
    if args.verbose:
        print()
        for row in rows:
            print(f"{row.gpu:9s} {row.model.split('/')[-1]:24s} TP{row.tensor_parallel} {row.part:10s} "
                  f"decodes {row.decode_seqs:4d} ctx {row.context_tokens:6d} prompt {row.prefill_tokens:5d}: "
                  f"measured {row.measured_s * 1e3:8.2f} ms, model {row.predicted_s * 1e3:8.2f} ms ({row.ratio:.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(row) | {"ratio": row.ratio} for row in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
