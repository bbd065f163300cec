#!/usr/bin/env python3
"""Send a bounded handful of completions to a local vLLM server and summarise /metrics.

    python3 probe.py [--base-url http://127.0.0.1:8000] [--model tiny-llama]
                     [--requests 8] [--concurrency 4] [--max-tokens 32]
                     [--save-metrics FILE]

Standard library only (runs with any python3).  Prints a JSON summary: request
latencies, the vllm:* metric names, the bucket bounds of the latency
histograms, the label names of a few series, and whether the MFU counters
(vllm:estimated_flops_per_gpu_total, vllm:estimated_read_bytes_per_gpu_total)
exist and are non-zero.  Only talks to the URL given (meant for 127.0.0.1).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import re
import sys
import time
import urllib.request

PROMPTS = [
    "The autoscaler reads metrics from each replica and",
    "Hello, world! Tell me a story about a robot who",
    "Kubernetes operators reconcile the desired state by",
    "What is 2 + 2? The answer is",
]

SERIES_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def http(method: str, url: str, body: dict | None = None, timeout: float = 120.0) -> bytes:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def one_completion(base: str, model: str, i: int, max_tokens: int) -> dict:
    body = {"model": model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens,
            "temperature": 1.0, "seed": i, "ignore_eos": True}
    t0 = time.perf_counter()
    out = json.loads(http("POST", f"{base}/v1/completions", body))
    dt = time.perf_counter() - t0
    return {"latency_s": round(dt, 4), "usage": out.get("usage"),
            "finish_reason": out["choices"][0].get("finish_reason"),
            "text_head": out["choices"][0]["text"][:40]}


def parse_metrics(text: str) -> dict:
    series = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SERIES_RE.match(line)
        if not m:
            continue
        labels = dict(LABEL_RE.findall(m.group(3) or ""))
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        series.append((m.group(1), labels, value))
    return {"series": series,
            "types": dict(re.findall(r"^# TYPE (\S+) (\S+)", text, re.M))}


def summarise(text: str) -> dict:
    p = parse_metrics(text)
    series, types = p["series"], p["types"]
    vllm_families = sorted(n for n in types if n.startswith("vllm:"))

    def buckets(family: str):
        les = [s[1]["le"] for s in series if s[0] == f"{family}_bucket" and "le" in s[1]]
        seen, out = set(), []
        for le in les:
            if le not in seen:
                seen.add(le)
                out.append(le)
        return out or None

    def label_names(name: str):
        for s in series:
            if s[0] == name:
                return sorted(s[1])
        return None

    def total(name: str):
        vals = [s[2] for s in series if s[0] == name]
        return sum(vals) if vals else None

    return {
        "vllm_metric_families": [f"{n} ({types[n]})" for n in vllm_families],
        "buckets": {f: buckets(f) for f in (
            "vllm:request_prefill_time_seconds",
            "vllm:time_to_first_token_seconds",
            "vllm:request_time_per_output_token_seconds",
            "vllm:inter_token_latency_seconds",
            "vllm:e2e_request_latency_seconds",
            "vllm:request_queue_time_seconds",
        )},
        "labels": {n: label_names(n) for n in (
            "vllm:request_success_total",
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:time_to_first_token_seconds_bucket",
            "vllm:estimated_flops_per_gpu_total",
        )},
        "values": {n: total(n) for n in (
            "vllm:request_success_total",
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:estimated_flops_per_gpu_total",
            "vllm:estimated_read_bytes_per_gpu_total",
            "vllm:estimated_write_bytes_per_gpu_total",
        )},
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--save-metrics")
    a = ap.parse_args()
    base = a.base_url.rstrip("/")

    t0 = time.perf_counter()
    single = one_completion(base, a.model, 0, a.max_tokens)  # lone request: latency
    with cf.ThreadPoolExecutor(max_workers=a.concurrency) as ex:
        results = list(ex.map(lambda i: one_completion(base, a.model, i, a.max_tokens),
                              range(1, a.requests)))
    wall = time.perf_counter() - t0
    time.sleep(1.0)  # let the engine's stats logger publish the last iteration
    text = http("GET", f"{base}/metrics").decode()
    if a.save_metrics:
        with open(a.save_metrics, "w") as f:
            f.write(text)
    lat = sorted(r["latency_s"] for r in [single, *results])
    report = {
        "requests": len(lat),
        "max_tokens": a.max_tokens,
        "concurrency": a.concurrency,
        "wall_s": round(wall, 3),
        "single_request": single,
        "latency_s": {"min": lat[0], "p50": lat[len(lat) // 2], "max": lat[-1]},
        **summarise(text),
    }
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
