"""`kvscale predict --model M --gpu G --tp N --batch B --input-tokens I --output-tokens O`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvscale.api.spec import KvCacheDtype, Precision
from kvscale.catalog import find_gpu, read_config_json, resolve_architecture
from kvscale.errors import InvalidSpecError
from kvscale.perfmodel import RequestShape, ServingSetup, predict_point
from kvscale.planner.candidates import tensor_parallel_is_legal
from kvscale.units import GIB


def run_predict(args: argparse.Namespace) -> int:
    for name in ("tp", "batch", "input_tokens", "output_tokens"):
        if getattr(args, name) < 1:
            raise InvalidSpecError(f"--{name.replace('_', '-')} must be at least 1")
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
    prediction = predict_point(setup, RequestShape(args.input_tokens, args.output_tokens), args.batch)
    if args.output == "json":
        print(json.dumps({"model": arch.name, "gpu": setup.gpu.name, "tensor_parallel": args.tp,
                          "batch": args.batch, "precision": setup.precision.value, **prediction.to_dict()}, indent=2))
        return 0
    rows = [
        ("model", f"{arch.name} ({setup.precision.value}) on {args.tp} x {setup.gpu.name}"),
        ("requests", f"{args.batch} concurrent x {args.input_tokens} in / {args.output_tokens} out"),
        ("TTFT", f"{prediction.ttft_ms:.1f} ms"),
        ("TPOT", f"{prediction.tpot_ms:.2f} ms"),
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
