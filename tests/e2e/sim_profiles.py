"""Latency parameters for llm-d-inference-sim per (model, GPU, tensor-parallel degree), from published figures.

Every number here comes from llm-d-inference-sim's own published latency material, which compiles
public vLLM / MLPerf / vendor benchmarks into simulator settings (repository github.com/llm-d/llm-d-inference-sim):

* PUBLISHED_PROFILES: the three ready-made per-token profiles, copied field by field from
  `manifests/latency-profiles/8b-h100-balanced-per-token.yaml` (commit 90e9d32),
  `manifests/latency-profiles/70b-h100-tp8-throughput-per-token.yaml` (commit 86ce94f) and
  `manifests/latency-profiles/small-l40s-edge-per-token.yaml` (commit 90e9d32). They are used only for the
  exact (model size, GPU, TP) they describe.
* REFERENCE_TABLE: the "Reference Tables" of `docs/latency-profiles.md` (commit 9d328ab): ranges of
  inter-token latency, prefill overhead and prefill time per token by model size and GPU (batch 1,
  BF16). We take the midpoint of each range.
* Anything else (a GPU or TP degree the table does not list, e.g. L4, H200, or Llama-8B at TP2) is
  DERIVED from the nearest listed GPU of the same model-size row, scaled by datasheet ratios from the
  kvscale GPU catalog: inter-token latency by memory bandwidth (decode is bandwidth-bound), prefill
  time per token by dense BF16 TFLOPS (prefill is compute-bound), and both by (tp_ref / tp) ** 0.8
  (tensor parallelism splits the work but pays all-reduces; 0.8 is our assumption, not a measurement).
  Such profiles say "derived" in their `source`.

`time-factor-under-load` is the published profile's value where one applies, else 2.0, the top of the
range the simulator's docs call realistic for latency-optimised deployments ("1.5-2.0";
`docs/latency-simulation.md`). The simulator scales prefill and decode linearly from 1x at one running
request to this factor at `--max-num-seqs`, so latency grows with the batch like a real engine's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvscale.catalog import GpuSpec, find_gpu, resolve_architecture
from kvscale.perfmodel.memory import compute_parameter_counts

DOCS = "llm-d-inference-sim docs/latency-profiles.md (commit 9d328ab)"
MANIFESTS = "llm-d-inference-sim manifests/latency-profiles"
LATENCY_OPTIMISED_LOAD_FACTOR = 2.0
TP_EXPONENT = 0.8


@dataclass(frozen=True)
class LatencyProfile:
    """Simulator latency settings (per-token calculator) and where they come from."""

    name: str
    inter_token_latency_ms: float
    inter_token_latency_std_ms: float
    prefill_overhead_ms: float
    prefill_time_per_token_ms: float
    prefill_std_ms: float
    time_factor_under_load: float
    source: str

    def sim_args(self) -> list[str]:
        """The llm-d-inference-sim flags (durations in whole microseconds: Go duration strings)."""

        def us(ms: float) -> str:
            return f"{round(ms * 1000)}us"

        return [
            "--latency-calculator=per-token",
            f"--inter-token-latency={us(self.inter_token_latency_ms)}",
            f"--inter-token-latency-std-dev={us(self.inter_token_latency_std_ms)}",
            f"--prefill-overhead={us(self.prefill_overhead_ms)}",
            f"--prefill-time-per-token={us(self.prefill_time_per_token_ms)}",
            f"--prefill-time-std-dev={us(self.prefill_std_ms)}",
            f"--time-factor-under-load={self.time_factor_under_load:g}",
        ]

    def ttft_ms(self, prompt_tokens: int, load_factor: float = 1.0) -> float:
        """Prefill time the simulator aims for (no queueing), for documentation and test bounds."""
        return (self.prefill_overhead_ms + prompt_tokens * self.prefill_time_per_token_ms) * load_factor


PUBLISHED_PROFILES: dict[tuple[str, str, int], LatencyProfile] = {
    # (size class, catalog GPU, TP): profile, field by field from the YAML files named in `source`.
    ("7-8B", "H100-SXM", 1): LatencyProfile(
        "8b-h100-balanced", 12, 2, 30, 0.250, 5, 2.0,
        f"{MANIFESTS}/8b-h100-balanced-per-token.yaml (commit 90e9d32): Llama-3-8B on one H100, max-num-seqs 16"),
    ("70B", "H100-SXM", 8): LatencyProfile(
        "70b-h100-tp8-throughput", 25, 4, 80, 0.500, 15, 3.0,
        f"{MANIFESTS}/70b-h100-tp8-throughput-per-token.yaml (commit 86ce94f): Llama-3-70B on 8 x H100, TP8"),
    ("1-3B", "L40S", 1): LatencyProfile(
        "small-l40s-edge", 15, 2, 20, 0.350, 3, 1.5,
        f"{MANIFESTS}/small-l40s-edge-per-token.yaml (commit 90e9d32): 1-3B model on one L40S"),
}

# size class -> (reference TP, prefill overhead range ms, {GPU: (ITL range ms, prefill per-token range ms)})
# from the three reference tables of docs/latency-profiles.md; None where the table says "infeasible" / "-".
_Range = tuple[float, float]
REFERENCE_TABLE: dict[str, list[tuple[int, _Range, dict[str, tuple[_Range, _Range]]]]] = {
    "1-3B": [(1, (15, 25), {"H100-SXM": ((5, 8), (0.10, 0.20)), "A100-SXM-80GB": ((8, 12), (0.20, 0.35)),
                            "L40S": ((12, 18), (0.35, 0.55)), "MI300X": ((6, 10), (0.08, 0.15))})],
    "7-8B": [(1, (25, 40), {"H100-SXM": ((10, 15), (0.15, 0.30)), "A100-SXM-80GB": ((15, 25), (0.30, 0.55)),
                            "L40S": ((25, 35), (0.65, 1.00)), "MI300X": ((12, 18), (0.11, 0.23))})],
    "13B": [(1, (40, 60), {"H100-SXM": ((15, 22), (0.55, 0.85)), "A100-SXM-80GB": ((22, 35), (0.90, 1.40)),
                           "L40S": ((40, 55), (1.50, 2.20)), "MI300X": ((18, 28), (0.42, 0.65))})],
    "30-34B": [(2, (50, 80), {"H100-SXM": ((20, 30), (0.30, 0.50)), "A100-SXM-80GB": ((30, 45), (0.60, 1.00)),
                              "MI300X": ((25, 35), (0.22, 0.38))})],
    "70B": [(4, (70, 110), {"H100-SXM": ((25, 40), (0.60, 0.90)), "A100-SXM-80GB": ((40, 60), (1.20, 1.80)),
                            "MI300X": ((30, 45), (0.45, 0.68))}),
            (8, (60, 100), {"H100-SXM": ((18, 28), (0.40, 0.60)), "A100-SXM-80GB": ((28, 45), (0.80, 1.30)),
                            "MI300X": ((22, 32), (0.30, 0.45))})],
    "405B": [(8, (150, 250), {"H100-SXM": ((60, 100), (2.0, 4.0)), "MI300X": ((70, 120), (3.0, 6.0))})],
}


def size_class(total_params: float) -> str:
    billions = total_params / 1e9
    for limit, name in ((4, "1-3B"), (10, "7-8B"), (20, "13B"), (45, "30-34B"), (100, "70B")):
        if billions <= limit:
            return name
    return "405B"


def _mid(r: _Range) -> float:
    return (r[0] + r[1]) / 2


def profile_for(model: str, gpu: str, tensor_parallel: int = 1) -> LatencyProfile:
    """The latency profile for `model` (catalog name or HF id) on `tensor_parallel` x `gpu` (catalog name,
    alias or node product label such as NVIDIA-L4)."""
    spec = find_gpu(gpu)
    arch = resolve_architecture(model)
    cls = size_class(compute_parameter_counts(arch).total)
    exact = PUBLISHED_PROFILES.get((cls, spec.name, tensor_parallel))
    if exact is not None:
        return exact
    rows = REFERENCE_TABLE[cls]
    ref_tp, overhead, by_gpu = min(rows, key=lambda row: abs(row[0] - tensor_parallel))
    if spec.name in by_gpu and ref_tp == tensor_parallel:
        itl, per_token = by_gpu[spec.name]
        return LatencyProfile(
            f"{cls}-{spec.name}-tp{tensor_parallel}", _mid(itl), 0.1 * _mid(itl), _mid(overhead), _mid(per_token),
            0.1 * _mid(overhead), LATENCY_OPTIMISED_LOAD_FACTOR,
            f"{DOCS}: reference-table midpoints for {cls} on {spec.name} (TP{tensor_parallel})")
    ref_name = _nearest_listed_gpu(spec, by_gpu)
    ref = find_gpu(ref_name)
    itl, per_token = by_gpu[ref_name]
    tp_scale = (ref_tp / tensor_parallel) ** TP_EXPONENT
    itl_ms = _mid(itl) * ref.hbm_bandwidth_bytes_per_s / spec.hbm_bandwidth_bytes_per_s * tp_scale
    per_token_ms = _mid(per_token) * ref.bf16_flops_per_s / spec.bf16_flops_per_s * tp_scale
    return LatencyProfile(
        f"{cls}-{spec.name}-tp{tensor_parallel}-derived", round(itl_ms, 2), round(0.1 * itl_ms, 2), _mid(overhead),
        round(per_token_ms, 4), 0.1 * _mid(overhead), LATENCY_OPTIMISED_LOAD_FACTOR,
        f"derived from {DOCS} reference-table midpoints for {cls} on {ref_name} TP{ref_tp}: inter-token latency x "
        f"memory bandwidth {ref.hbm_bandwidth_bytes_per_s / 1e12:.3g}/{spec.hbm_bandwidth_bytes_per_s / 1e12:.3g} "
        "TB/s, "
        f"prefill per token x BF16 {ref.bf16_flops_per_s / 1e12:.4g}/{spec.bf16_flops_per_s / 1e12:.4g} TFLOPS, both x "
        f"(TP{ref_tp}/TP{tensor_parallel})^{TP_EXPONENT} (kvscale GPU catalog datasheet figures)")


def _nearest_listed_gpu(spec: GpuSpec, by_gpu: dict[str, tuple[_Range, _Range]]) -> str:
    """The listed GPU of the same vendor whose memory bandwidth is closest (by ratio) to `spec`'s."""
    same_vendor = [n for n in by_gpu if find_gpu(n).resource_name == spec.resource_name] or list(by_gpu)
    return min(same_vendor, key=lambda name: abs(math.log(find_gpu(name).hbm_bandwidth_bytes_per_s
                                                         / spec.hbm_bandwidth_bytes_per_s)))
