"""`kvscale predict --model M --gpu G --tp N [--batch B | --concurrency C | --request-rate R] ...`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvscale.api.spec import KvCacheDtype, Precision
from kvscale.catalog import find_gpu, read_config_json, resolve_architecture
from kvscale.errors import InvalidSpecError
from kvscale.perfmodel import Load, LoadKind, RequestShape, ServingSetup, predict_point
from kvscale.planner.candidates import tensor_parallel_is_legal
from kvscale.units import GIB


def _load(args: argparse.Namespace) -> Load:
    if args.num_prompts is not None and args.concurrency is None:
        raise InvalidSpecError("--num-prompts needs --concurrency: it names a closed-loop run's requests")
    if args.concurrency is not None:
        requests = None if args.num_prompts is None else float(args.num_prompts)
        return Load(LoadKind.CLOSED_LOOP, float(args.concurrency), requests)
    if args.request_rate is not None:
        if not args.request_rate > 0:
            raise InvalidSpecError("--request-rate must be positive")
        return Load(LoadKind.OPEN_LOOP, float(args.request_rate))
    return Load(LoadKind.STATIC_BATCH, float(args.batch if args.batch is not None else 1))


def _describe(load: Load, input_tokens: int, output_tokens: int) -> str:
    shape = f"{input_tokens} in / {output_tokens} out"
    if load.kind is LoadKind.STATIC_BATCH:
        return f"static batch of {load.value:g} started together, {shape}"
    if load.kind is LoadKind.CLOSED_LOOP:
        run = "" if load.run_requests is None else f", {load.run_requests:g} requests started together"
        return f"closed loop: {load.value:g} clients{run}, {shape}"
    return f"open loop: Poisson arrivals at {load.value:g} requests/s, {shape}"


def run_predict(args: argparse.Namespace) -> int:
    for name in ("tp", "batch", "concurrency", "num_prompts", "input_tokens", "output_tokens", "max_num_seqs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InvalidSpecError(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.percentile < 100:
        raise InvalidSpecError("--percentile must be between 0 and 100")
    load = _load(args)
    config = read_config_json(Path(args.config_json)) if args.config_json else None
    arch = resolve_architecture(args.model, config)
    if not tensor_parallel_is_legal(arch, args.tp):
        raise InvalidSpecError(
            f"--tp {args.tp} is not legal for {arch.name}: {arch.num_attention_heads} attention heads and "
            f"{arch.num_kv_heads} KV heads must divide evenly")
    setup = ServingSetup(
        arch=arch,
        gpu=find_gpu(args.gpu),
        tensor_parallel=args.tp,
        precision=Precision(args.precision) if args.precision else arch.native_precision,
        kv_cache_dtype=KvCacheDtype(args.kv_cache_dtype),
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    shape = RequestShape(args.input_tokens, args.output_tokens)
    p = predict_point(setup, shape, load, args.max_num_seqs, args.percentile / 100.0)
    prediction = p
    if args.output == "json":
        print(json.dumps({"model": arch.name, "gpu": setup.gpu.name, "tensor_parallel": args.tp,
                          "precision": setup.precision.value, **prediction.to_dict()}, indent=2))
        return 0
    pct = f"p{args.percentile:g}"
    rows = [
        ("model", f"{arch.name} ({setup.precision.value}) on {args.tp} x {setup.gpu.name}"),
        ("load", _describe(load, args.input_tokens, args.output_tokens)),
        ("TTFT", f"{p.ttft_ms:.1f} ms mean, {p.ttft_percentile_ms:.1f} ms {pct}" if load.run_requests is None else
                 f"{p.ttft_ms:.1f} ms mean over the run (the first wave's queue included), {p.ttft_steady_ms:.1f} ms "
                 f"mean and {p.ttft_percentile_ms:.1f} ms {pct} in the steady state"),
        ("TPOT", f"{p.tpot_ms:.2f} ms mean, {p.tpot_percentile_ms:.2f} ms {pct}"),
        ("requests", f"{p.requests_per_s:.3f}/s completed, {p.running_seqs:.1f} running"
                     + ("" if p.stable else " (overloaded: arrivals outrun the replica, queues grow)")),
        ("decode step", f"{prediction.decode_step_ms:.2f} ms ({prediction.bound}-bound)"),
        ("prefill (one prompt)", f"{prediction.prefill_ms:.1f} ms"),
        ("throughput", f"{prediction.output_tokens_per_s:,.0f} output tok/s "
                       f"({prediction.output_tokens_per_s_per_gpu:,.0f} per GPU)"),
        ("weights per GPU", f"{prediction.weights_bytes_per_gpu / GIB:.2f} GiB"),
        ("KV bytes per token", f"{prediction.kv_bytes_per_token:,}"),
        ("KV cache", f"{prediction.kv_cache_tokens:,} tokens ({prediction.max_concurrency} requests of this shape)"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    return 0
