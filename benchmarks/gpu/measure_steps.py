#!/usr/bin/env python3
"""Measure one GPU's engine-step times for decoder shards with random weights (no model download).

    python3 benchmarks/gpu/measure_steps.py --out steps.json        # one H100/H200: about 5 minutes

Runs on any CUDA machine with PyTorch (it is not part of the kvscale package and needs nothing of it).
For each model shard (the per-GPU slice of a tensor-parallel replica: heads, KV heads, FFN and vocabulary
divided by TP; the all-reduces are left out, one GPU cannot measure them) it builds the decoder's
weights in bf16 at random, and times whole engine steps captured in CUDA graphs (as vLLM runs its decode
steps): a batch of decodes over a KV cache of a given length, a prompt chunk prefilled alone, and the two
mixed. Each step is timed three ways: the whole step; its linear layers only (the four projections per
layer and the LM head, on the step's token count); its attention only. FP8 linear layers
(torch._scaled_mm, per-tensor scales, the activation cast included) are timed beside bf16 for some shards.

What it is and is not: cuBLAS GEMMs and PyTorch's fused attention (FlashAttention-2 / cuDNN through
scaled_dot_product_attention), unfused RMSNorm, RoPE and SiLU in plain PyTorch ops. vLLM's own kernels
(FlashAttention-3 or FlashInfer over a paged cache, fused norms and activations) are at least as fast, so
"step" is an upper bound of a vLLM step's GPU time without its CPU-side scheduling, and "linear" is what
the GEMM library reaches on those shapes. kvscale's roofline is compared against it by
benchmarks/kernel_steps.py, which reads the JSON this writes.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

try:  # the fused backends only; the math fallback would materialise the score matrix
    from torch.nn.attention import SDPBackend, sdpa_kernel

    FUSED_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
except ImportError:  # pragma: no cover - old PyTorch
    sdpa_kernel = None

# The architectures as their config.json states them (kvscale's catalog has the same figures).
MODELS: dict[str, dict[str, int]] = {
    "meta-llama/Llama-3.1-8B-Instruct": dict(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128,
                                             ffn=14336, vocab=128256),
    "meta-llama/Llama-3.1-70B-Instruct": dict(hidden=8192, layers=80, heads=64, kv_heads=8, head_dim=128,
                                              ffn=28672, vocab=128256),
    "Qwen/Qwen3-32B": dict(hidden=5120, layers=64, heads=64, kv_heads=8, head_dim=128, ffn=25600, vocab=151936),
    # Mixture-of-experts: every layer routes each token to `top_k` of `experts` FFNs of width `ffn`.
    "mistralai/Mixtral-8x7B-Instruct-v0.1": dict(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128,
                                                 ffn=14336, vocab=32000, experts=8, top_k=2),
    "Qwen/Qwen3-30B-A3B": dict(hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128, ffn=768,
                               vocab=151936, experts=128, top_k=8),
    "Qwen/Qwen3-235B-A22B": dict(hidden=4096, layers=94, heads=64, kv_heads=4, head_dim=128, ffn=1536,
                                 vocab=151936, experts=128, top_k=8),
}
# (model, tensor_parallel, whether FP8 linear layers are timed too)
SHARDS = (
    ("meta-llama/Llama-3.1-8B-Instruct", 1, True),
    ("meta-llama/Llama-3.1-70B-Instruct", 4, True),
    ("Qwen/Qwen3-32B", 2, False),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", 2, False),
    ("Qwen/Qwen3-30B-A3B", 1, False),
    ("Qwen/Qwen3-235B-A22B", 8, False),
)
# (decodes, their cache length, prompt tokens prefilled in the step as one prompt's first chunk)
STEPS = (
    (1, 1024, 0), (8, 1024, 0), (32, 1024, 0), (64, 1024, 0), (128, 1024, 0), (256, 1024, 0),
    (64, 4096, 0), (16, 16384, 0),
    (0, 0, 256), (0, 0, 1024), (0, 0, 2048), (0, 0, 4096), (0, 0, 8192),
    (64, 1024, 2048), (128, 1024, 512),
)
FP8_STEPS = ((1, 1024, 0), (64, 1024, 0), (256, 1024, 0), (0, 0, 2048), (0, 0, 8192))
# Mixture-of-experts shards: decode batches touch from top_k to all experts; prompt chunks touch all.
MOE_STEPS = (
    (1, 1024, 0), (8, 1024, 0), (32, 1024, 0), (64, 1024, 0), (128, 1024, 0), (256, 1024, 0),
    (0, 0, 1024), (0, 0, 4096), (0, 0, 8192), (64, 1024, 2048),
)
MAX_CACHED_TOKENS = 262_144  # decodes x cache length, the largest case above
# --smoke: the same code paths on the CPU with a tiny model, to check the script without a GPU.
SMOKE_MODEL = dict(hidden=256, layers=2, heads=8, kv_heads=2, head_dim=32, ffn=512, vocab=1024)
SMOKE_MOE_MODEL = dict(hidden=256, layers=2, heads=8, kv_heads=2, head_dim=32, ffn=128, vocab=1024, experts=8,
                       top_k=2)
SMOKE_STEPS = ((1, 64, 0), (4, 128, 0), (0, 0, 64), (4, 64, 32))
EPS = 1e-6


@dataclass
class Timing:
    model: str
    tensor_parallel: int
    part: str  # step | linear | attention | linear_fp8
    decode_seqs: int
    context_tokens: int
    prefill_tokens: int
    mean_s: float
    min_s: float
    replays: int
    note: str = ""


@dataclass
class Report:
    device: str
    torch_version: str
    cuda_version: str
    ceilings: dict[str, float] = field(default_factory=dict)
    timings: list[Timing] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Shard:
    """One GPU's slice of a TP replica: its weights, a KV cache and static activation buffers."""

    def __init__(self, name: str, tp: int, device: torch.device, dtype: torch.dtype,
                 max_cached_tokens: int = MAX_CACHED_TOKENS) -> None:
        cfg = MODELS.get(name, SMOKE_MOE_MODEL if name == "smoke-moe" else SMOKE_MODEL)
        self.name, self.tp, self.device, self.dtype = name, tp, device, dtype
        self.hidden = cfg["hidden"]
        self.layers = cfg["layers"]
        self.heads = cfg["heads"] // tp
        self.kv_heads = max(1, cfg["kv_heads"] // tp)
        self.head_dim = cfg["head_dim"]
        self.ffn = cfg["ffn"] // tp
        self.vocab = cfg["vocab"] // tp
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.qkv_width = q + 2 * kv

        def weight(rows: int, cols: int) -> torch.Tensor:
            return torch.empty(rows, cols, device=device, dtype=dtype).normal_(0.0, 0.02)

        # [out, in] as vLLM keeps them (F.linear computes x @ W^T).
        self.wqkv = [weight(self.qkv_width, self.hidden) for _ in range(self.layers)]
        self.wo = [weight(self.hidden, q) for _ in range(self.layers)]
        self.experts, self.top_k = cfg.get("experts", 0), cfg.get("top_k", 0)
        if self.experts:
            # Every GPU holds every expert, each sliced by TP (vLLM's fused MoE without expert parallelism):
            # [experts, out, in] per layer, and the router's [experts, hidden].
            self.router = [weight(self.experts, self.hidden) for _ in range(self.layers)]
            def stacked(rows: int, cols: int) -> torch.Tensor:
                return torch.empty(self.experts, rows, cols, device=device, dtype=dtype).normal_(0.0, 0.02)

            self.w13 = [stacked(2 * self.ffn, self.hidden) for _ in range(self.layers)]
            self.w2 = [stacked(self.hidden, self.ffn) for _ in range(self.layers)]
            self.grouped = pick_grouped_gemm(device, dtype)
        else:
            self.router = []
            self.w13 = [weight(2 * self.ffn, self.hidden) for _ in range(self.layers)]
            self.w2 = [weight(self.hidden, self.ffn) for _ in range(self.layers)]
            self.grouped = ""
        self.norms = [torch.ones(self.hidden, device=device, dtype=dtype) for _ in range(2 * self.layers + 1)]
        self.lm_head = weight(self.vocab, self.hidden)
        per_layer = max_cached_tokens * self.kv_heads * self.head_dim
        self.k_cache = [torch.empty(per_layer, device=device, dtype=dtype).normal_() for _ in range(self.layers)]
        self.v_cache = [torch.empty(per_layer, device=device, dtype=dtype).normal_() for _ in range(self.layers)]
        self.fp8: dict[str, list[torch.Tensor]] = {}

    def weight_bytes(self) -> int:
        tensors = [*self.wqkv, *self.wo, *self.router, *self.w13, *self.w2, self.lm_head]
        return sum(t.numel() * t.element_size() for t in tensors)

    def make_fp8(self) -> None:
        fp8 = torch.float8_e4m3fn
        # _scaled_mm wants its second operand column-major: W^T of a row-major [out, in] is that.
        self.fp8 = {key: [w.to(fp8) for w in getattr(self, key)] for key in ("wqkv", "wo", "w13", "w2")}
        self.fp8["lm_head"] = [self.lm_head.to(fp8)]

    def drop_fp8(self) -> None:
        self.fp8 = {}

    def cache(self, layer: int, decodes: int, context: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = decodes * self.kv_heads * context * self.head_dim
        shape = (decodes, self.kv_heads, context, self.head_dim)
        return self.k_cache[layer][:n].view(shape), self.v_cache[layer][:n].view(shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + EPS)).to(x.dtype) * weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def pick_grouped_gemm(device: torch.device, dtype: torch.dtype) -> str:
    """'grouped_mm' where PyTorch's grouped GEMM (CUTLASS on Hopper) runs and agrees with a loop over the
    experts, else 'loop' (one GEMM per expert that has tokens, which costs a launch per expert)."""
    if not hasattr(torch, "_grouped_mm"):
        return "loop"
    try:
        x = torch.randn(48, 64, device=device, dtype=dtype)
        w = torch.randn(4, 32, 64, device=device, dtype=dtype)
        counts = [16, 0, 24, 8]
        offs = torch.tensor(counts, device=device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        got = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        want = grouped_loop(x, w, counts)
        if torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-1):
            return "grouped_mm"
        print("grouped_mm disagrees with the loop; using the loop", file=sys.stderr)
    except (RuntimeError, TypeError) as err:
        print(f"grouped_mm unavailable ({err}); using the loop", file=sys.stderr)
    return "loop"


def grouped_loop(x: torch.Tensor, w: torch.Tensor, counts: list[int]) -> torch.Tensor:
    out = torch.empty(x.shape[0], w.shape[1], device=x.device, dtype=x.dtype)
    start = 0
    for expert, count in enumerate(counts):
        if count:
            out[start:start + count] = F.linear(x[start:start + count], w[expert])
        start += count
    return out


@dataclass
class Routing:
    """A fixed top-k routing of a step's tokens, drawn uniformly (every expert equally likely, k distinct per
    token), sorted by expert as a fused MoE kernel groups them. Fixed when the step is built, so the graph
    captures its shapes; the router's GEMM and top-k still run in the whole step."""

    token_of_slot: torch.Tensor  # [tokens * k]: which token each expert-sorted slot serves
    weight_of_slot: torch.Tensor  # [tokens * k, 1]
    counts: list[int]  # tokens per expert
    offsets: torch.Tensor  # int32 cumulative counts, as grouped_mm takes them

    @property
    def experts_touched(self) -> int:
        return sum(1 for c in self.counts if c)


def draw_routing(tokens: int, experts: int, top_k: int, device: torch.device, dtype: torch.dtype,
                 generator: torch.Generator) -> Routing:
    choice = torch.rand(tokens, experts, generator=generator).argsort(dim=-1)[:, :top_k]  # on the CPU
    expert_of_slot = choice.reshape(-1)
    order = expert_of_slot.argsort(stable=True)
    token_of_slot = (torch.arange(tokens).repeat_interleave(top_k))[order]
    counts = torch.bincount(expert_of_slot, minlength=experts).tolist()
    offsets = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    weights = torch.full((tokens * top_k, 1), 1.0 / top_k)
    return Routing(token_of_slot.to(device), weights.to(device=device, dtype=dtype), counts, offsets.to(device))


def attention(shard: Shard, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              decodes: int, context: int, prefill: int, out: torch.Tensor) -> None:
    """Decode queries against the cache, the prompt chunk causally against itself; results into `out`."""
    d, heads, kv_heads = shard.head_dim, shard.heads, shard.kv_heads
    group = heads // kv_heads
    if decodes:
        kc, vc = shard.cache(layer, decodes, context)
        # Grouped-query decode: a KV head's `group` queries are one short query sequence (FlashDecoding's trick).
        qd = q[:decodes].view(decodes, kv_heads, group, d)
        od = F.scaled_dot_product_attention(qd, kc, vc)
        out[:decodes].copy_(od.reshape(decodes, heads * d))
    if prefill:
        qp = q[decodes:].view(prefill, heads, d).transpose(0, 1).unsqueeze(0)
        kp = k[decodes:].view(prefill, kv_heads, d).transpose(0, 1).unsqueeze(0)
        vp = v[decodes:].view(prefill, kv_heads, d).transpose(0, 1).unsqueeze(0)
        if group > 1:  # expand + copy: repeat_interleave may synchronise, which a graph capture refuses
            kp = kp[:, :, None].expand(1, kv_heads, group, prefill, d).reshape(1, heads, prefill, d)
            vp = vp[:, :, None].expand(1, kv_heads, group, prefill, d).reshape(1, heads, prefill, d)
        op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True)
        out[decodes:].copy_(op.squeeze(0).transpose(0, 1).reshape(prefill, heads * d))


def fp8_linear(x: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    rows = x.shape[0]
    padded = -(-rows // 16) * 16
    x8 = x.to(torch.float8_e4m3fn)
    if padded != rows:
        x8 = F.pad(x8.view(torch.uint8), (0, 0, 0, padded - rows)).view(torch.float8_e4m3fn)
    y = torch._scaled_mm(x8, w8.t(), scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
    return y[:rows]


def build_step(shard: Shard, part: str, decodes: int, context: int, prefill: int) -> tuple[Any, str]:
    """A closure that runs one step's `part` on static buffers (so it can be captured in a graph), and a note
    on what it reads beyond the shapes (a MoE step: the experts its routing touches)."""
    dev, dt = shard.device, shard.dtype
    tokens = decodes + prefill
    d = shard.head_dim
    q_width, kv_width = shard.heads * d, shard.kv_heads * d
    x0 = torch.randn(tokens, shard.hidden, device=dev, dtype=dt)
    qkv_static = torch.randn(tokens, shard.qkv_width, device=dev, dtype=dt)
    attn_out = torch.zeros(tokens, q_width, device=dev, dtype=dt)
    act_static = torch.randn(tokens, shard.ffn, device=dev, dtype=dt)
    positions = torch.arange(tokens, device=dev, dtype=torch.float32)
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))
    angles = torch.outer(positions, inv_freq)
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1).to(dt)[:, None, :]
    sin = torch.cat((angles.sin(), angles.sin()), dim=-1).to(dt)[:, None, :]
    logit_rows = decodes + (1 if prefill else 0)
    scale = torch.ones((), device=dev, dtype=torch.float32)
    routing = (draw_routing(tokens, shard.experts, shard.top_k, dev, dt, torch.Generator().manual_seed(tokens))
               if shard.experts else None)
    if routing is not None:
        slots = tokens * shard.top_k
        routed_static = torch.randn(slots, shard.hidden, device=dev, dtype=dt)
        routed_act_static = torch.randn(slots, shard.ffn, device=dev, dtype=dt)

    def experts(layer: int, x_sorted: torch.Tensor, which: str) -> torch.Tensor:
        assert routing is not None
        w = (shard.w13 if which == "w13" else shard.w2)[layer]
        if shard.grouped == "grouped_mm":
            return torch._grouped_mm(x_sorted, w.transpose(-2, -1), offs=routing.offsets)
        return grouped_loop(x_sorted, w, routing.counts)

    def moe(layer: int, h: torch.Tensor) -> torch.Tensor:
        assert routing is not None
        logits = F.linear(h, shard.router[layer])
        torch.topk(torch.softmax(logits.float(), dim=-1), shard.top_k, dim=-1)  # the router's work; routing is fixed
        gate, up = experts(layer, h.index_select(0, routing.token_of_slot), "w13").chunk(2, dim=-1)
        routed = experts(layer, F.silu(gate) * up, "w2") * routing.weight_of_slot
        return torch.zeros_like(h).index_add_(0, routing.token_of_slot, routed)

    def linear(key: str, layer: int, x: torch.Tensor) -> torch.Tensor:
        if part == "linear_fp8":
            return fp8_linear(x, shard.fp8[key][layer], scale)
        return F.linear(x, getattr(shard, key)[layer] if key != "lm_head" else shard.lm_head)

    def split(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = qkv.split([q_width, kv_width, kv_width], dim=-1)
        return q, k, v

    def run() -> None:
        x = x0
        for layer in range(shard.layers):
            if part in ("linear", "linear_fp8"):
                linear("wqkv", layer, x0)
                linear("wo", layer, attn_out)
                if routing is not None:
                    F.linear(x0, shard.router[layer])
                    experts(layer, routed_static, "w13")
                    experts(layer, routed_act_static, "w2")
                    continue
                linear("w13", layer, x0)
                linear("w2", layer, act_static)
                continue
            if part == "attention":
                q, k, v = split(qkv_static)
                attention(shard, layer, q.contiguous(), k.contiguous(), v.contiguous(), decodes, context,
                          prefill, attn_out)
                continue
            h = rms_norm(x, shard.norms[2 * layer])
            q, k, v = split(F.linear(h, shard.wqkv[layer]))
            q = rotate(q.view(tokens, shard.heads, d), cos, sin).reshape(tokens, q_width)
            k = rotate(k.view(tokens, shard.kv_heads, d), cos, sin).reshape(tokens, kv_width)
            attention(shard, layer, q, k, v.contiguous(), decodes, context, prefill, attn_out)
            x = x + F.linear(attn_out, shard.wo[layer])
            h = rms_norm(x, shard.norms[2 * layer + 1])
            if routing is not None:
                x = x + moe(layer, h)
                continue
            gate, up = F.linear(h, shard.w13[layer]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, shard.w2[layer])
        if part == "attention":
            return
        rows = x[-logit_rows:] if part == "step" else x0[:logit_rows]
        if part == "step":
            rows = rms_norm(rows, shard.norms[-1])
        linear("lm_head", 0, rows)

    note = (f"experts {shard.grouped}; touched {routing.experts_touched} of {shard.experts} per layer"
            if routing is not None else "")
    return run, note


def time_eager(fn: Any) -> tuple[float, float, int]:
    """--smoke on the CPU: run `fn` three times (the figures mean nothing there)."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sum(times) / len(times), min(times), len(times)


def time_graph(fn: Any, budget_s: float = 0.4) -> tuple[float, float, int]:
    """Capture `fn` in a CUDA graph and time its replays with CUDA events: (mean s, min s, replays)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    probe_start, probe_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe_start.record()
    graph.replay()
    probe_end.record()
    torch.cuda.synchronize()
    once = probe_start.elapsed_time(probe_end) / 1e3
    replays = max(5, min(50, math.ceil(budget_s / max(once, 1e-6))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    times = [start.elapsed_time(end) / 1e3 for start, end in events]
    del graph
    return sum(times) / len(times), min(times), replays


def measure_ceilings(device: torch.device) -> dict[str, float]:
    """The card's copy bandwidth and dense GEMM rates on these shapes, as this PyTorch reaches them."""
    ceilings: dict[str, float] = {}
    src = torch.empty(512 * 1024**2, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    mean_s, _, _ = time_graph(lambda: dst.copy_(src))
    ceilings["copy_read_plus_write_bytes_per_s"] = 2 * src.numel() * src.element_size() / mean_s
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    mean_s, _, _ = time_graph(lambda: a @ b)
    ceilings["bf16_gemm_8192_flops_per_s"] = 2 * 8192**3 / mean_s
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    one = torch.ones((), device=device, dtype=torch.float32)
    try:
        mean_s, _, _ = time_graph(lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one,
                                                           out_dtype=torch.bfloat16))
        ceilings["fp8_gemm_8192_flops_per_s"] = 2 * 8192**3 / mean_s
    except (RuntimeError, AttributeError) as err:
        ceilings["fp8_gemm_error"] = float("nan")
        print(f"fp8 ceiling: {err}", file=sys.stderr)
    return ceilings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--deadline-s", type=float, default=420.0, help="start no new case after this long")
    parser.add_argument("--models", nargs="*", default=None, help="only these models (default: every shard)")
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU: checks the code paths")
    args = parser.parse_args()
    began = time.monotonic()
    if args.smoke:
        device, timer = torch.device("cpu"), time_eager
        shards: tuple[tuple[str, int, bool], ...] = (("smoke", 1, False), ("smoke", 2, False),
                                                     ("smoke-moe", 1, False), ("smoke-moe", 2, False))
        steps, moe_steps, max_cached = SMOKE_STEPS, SMOKE_STEPS, 512
        report = Report(device="cpu (smoke)", torch_version=torch.__version__, cuda_version="")
    elif not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    else:
        device, timer, shards, max_cached = torch.device("cuda"), time_graph, SHARDS, MAX_CACHED_TOKENS
        steps, moe_steps = STEPS, MOE_STEPS
        report = Report(device=torch.cuda.get_device_name(device), torch_version=torch.__version__,
                        cuda_version=str(torch.version.cuda))
        report.ceilings = measure_ceilings(device)
        print(json.dumps(report.ceilings), flush=True)

    def save() -> None:
        with open(args.out, "w") as handle:
            json.dump(asdict(report), handle, indent=1)

    for name, tp, with_fp8 in shards:
        if args.models and name not in args.models:
            continue
        if time.monotonic() - began > args.deadline_s:
            report.errors.append(f"deadline: {name} TP{tp} not measured")
            continue
        shard = Shard(name, tp, device, torch.bfloat16, max_cached)
        print(f"{name} TP{tp}: {shard.weight_bytes() / 1e9:.1f} GB of weights per GPU"
              + (f", experts by {shard.grouped}" if shard.experts else ""), flush=True)
        shard_steps = moe_steps if shard.experts else steps
        parts = [("step", shard_steps), ("linear", shard_steps), ("attention", shard_steps)]
        if with_fp8:
            shard.make_fp8()
            parts.append(("linear_fp8", FP8_STEPS))
        for part, part_steps in parts:
            for decodes, context, prefill in part_steps:
                if time.monotonic() - began > args.deadline_s:
                    report.errors.append(f"deadline: {name} TP{tp} {part} {decodes}/{context}/{prefill}")
                    continue
                try:
                    step, note = build_step(shard, part, decodes, context, prefill)
                    if sdpa_kernel is not None and device.type == "cuda":
                        with sdpa_kernel(FUSED_ATTENTION):
                            mean_s, min_s, replays = timer(step)
                    else:
                        mean_s, min_s, replays = timer(step)
                except (RuntimeError, AttributeError, KeyError) as err:
                    report.errors.append(f"{name} TP{tp} {part} {decodes}/{context}/{prefill}: {err}")
                    print(report.errors[-1], file=sys.stderr, flush=True)
                    step = None
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    continue
                del step  # its closure holds the shard, which must go before the next one is built
                report.timings.append(Timing(name, tp, part, decodes, context, prefill, mean_s, min_s, replays,
                                             note))
                print(f"  {part:10s} decodes {decodes:4d} ctx {context:6d} prefill {prefill:5d}: "
                      f"{mean_s * 1e3:9.3f} ms (min {min_s * 1e3:.3f}, {replays} replays)", flush=True)
            save()
        del shard
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    save()
    print(f"done in {time.monotonic() - began:.0f} s, {len(report.errors)} errors", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
