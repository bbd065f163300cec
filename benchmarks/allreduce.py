"""kvscale's all-reduce term against all-reduces measured on 8-GPU A100 and H100 nodes.

    .venv/bin/python benchmarks/allreduce.py [-v]     # under a second; reads benchmarks/data/allreduce/

The measurements are NVIDIA AIConfigurator's collected tables (the file names its repository, commit and
paths): vLLM's and TensorRT-LLM's own all-reduce in CUDA graphs, and nccl-tests, at 2, 4 and 8 ranks from
4 KiB to 128 MiB: a decode step's hidden states (tokens x hidden size x 2 bytes: 32 sequences of an
8192-wide model are 512 KiB) up to a prompt chunk's (2048 tokens of it are 32 MiB, 8192 are 128 MiB).
Each row is set against `estimate_allreduce_s` at the default factors, the cost the model charges for one
call; nothing here was fitted. The model's fixed cost per call (`allreduce_latency_s`) was fitted to
end-to-end serving measurements, so it holds what a call costs inside a step (ranks arriving skewed from
the kernels before it, launch gaps) as well as the transfer: a model above an isolated microbenchmark at
small sizes is expected; one below it at the sizes decode uses would be a term that undercounts.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from kvscale.catalog import find_gpu
from kvscale.perfmodel import DEFAULT_EFFICIENCY
from kvscale.perfmodel.communication import estimate_allreduce_s

DATA = Path(__file__).parent / "data" / "allreduce" / "aiconfigurator.json"
# Message sizes of decode steps in the published sweeps (16 to 128 sequences of a 4096- or 8192-wide model),
# and of prompt chunks (vLLM's 2048- and 8192-token budgets, the same widths).
DECODE_BYTES = (128 * 1024, 2 * 1024 * 1024)
PROMPT_BYTES = (16 * 1024 * 1024, 128 * 1024 * 1024)


def load_tables(path: Path = DATA) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def compare(tables: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measured (table, ranks, size): measured and modelled microseconds."""
    rows = []
    for table in tables["tables"]:
        gpu = find_gpu(table["gpu"])
        for row in table["rows"]:
            model_us = 1e6 * float(estimate_allreduce_s(gpu, row["ranks"], row["message_bytes"], DEFAULT_EFFICIENCY))
            rows.append({"gpu": table["gpu"], "implementation": f"{table['implementation']} {table['version']}",
                         "ranks": row["ranks"], "message_bytes": row["message_bytes"],
                         "measured_us": row["latency_us"], "model_us": model_us})
    return rows


def median_ratios(rows: list[dict[str, Any]], band: tuple[int, int] = DECODE_BYTES,
                  ) -> dict[tuple[str, str, int], tuple[float, float, float, int]]:
    """Per (gpu, implementation, ranks), over the sizes of `band`: the median measured and modelled call
    (us), the median model / measured, and how many sizes."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if band[0] <= row["message_bytes"] <= band[1]:
            groups[(row["gpu"], row["implementation"], row["ranks"])].append(row)
    return {key: (statistics.median(r["measured_us"] for r in members),
                  statistics.median(r["model_us"] for r in members),
                  statistics.median(r["model_us"] / r["measured_us"] for r in members), len(members))
            for key, members in sorted(groups.items())}


def summarise(rows: list[dict[str, Any]], band: tuple[int, int] = DECODE_BYTES) -> list[str]:
    return [f"  {gpu:<14} {implementation:<17} TP{ranks}: measured {measured:6.1f} us, model {model:6.1f} us, "
            f"model / measured {ratio:4.2f} (median over {count} sizes)"
            for (gpu, implementation, ranks), (measured, model, ratio, count) in median_ratios(rows, band).items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="print every row")
    args = parser.parse_args(argv)
    tables = load_tables()
    rows = compare(tables)
    print(f"all-reduce: kvscale's term against measured calls (command: .venv/bin/python benchmarks/allreduce.py; "
          f"data: {tables['source']} at {tables['commit'][:10]})")
    print(f"one call at decode sizes ({DECODE_BYTES[0] // 1024} KiB to {DECODE_BYTES[1] // 1024 // 1024} MiB), "
          f"default factors ({DEFAULT_EFFICIENCY.allreduce_latency_s * 1e6:.0f} us per call, "
          f"{DEFAULT_EFFICIENCY.interconnect:.2f} of the NVLink rate):")
    for line in summarise(rows):
        print(line)
    print(f"one call at prompt-chunk sizes ({PROMPT_BYTES[0] // 2**20} to {PROMPT_BYTES[1] // 2**20} MiB):")
    for line in summarise(rows, PROMPT_BYTES):
        print(line)
    if args.verbose:
        for r in rows:
            print(f"    {r['gpu']:<14} {r['implementation']:<17} TP{r['ranks']} {r['message_bytes']:>9} B  "
                  f"measured {r['measured_us']:7.2f} us  model {r['model_us']:7.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
