"""Accuracy as a regression guard: the headline median errors of `benchmarks/accuracy.py` (NVIDIA GPUs
with vLLM, TensorRT-LLM or NIM, per metric and per way the load was applied) may not rise more than
two points above the figures committed in docs/accuracy.md. A change that makes the model better
lowers the committed figures in the same commit; one that makes it worse fails here."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from benchmarks_loader import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "accuracy.md"
ALLOWED_RISE_POINTS = 2.0
GUARD_BLOCK = re.compile(r"```accuracy-guard\n(.*?)```", re.DOTALL)


def committed() -> dict[str, float]:
    match = GUARD_BLOCK.search(DOC.read_text())
    assert match, "docs/accuracy.md has no ```accuracy-guard block"
    figures = {}
    for line in match.group(1).splitlines():
        if line.strip() and not line.startswith("#"):
            key, value = line.split()[:2]
            figures[key] = float(value)
    return figures


def test_no_headline_median_error_rose_beyond_the_committed_figure() -> None:
    accuracy = load_benchmark("accuracy")
    now = {key: error for key, (error, count) in accuracy.headline_medians(accuracy.run()).items() if count}
    figures = committed()
    assert set(now) == set(figures), "docs/accuracy.md guards other figures than accuracy.py reports"
    worse = {key: (figures[key], round(now[key], 2)) for key in now if now[key] > figures[key] + ALLOWED_RISE_POINTS}
    assert not worse, f"median % error rose (committed, now): {worse}"


def test_leave_one_source_out_holds_out_a_publishers_files_together() -> None:
    """A sweep saved as one file per rate, or a CI pipeline's builds, is one source: holding out one file
    while its siblings stay in the fit would leak what the held-out figures show."""
    fit = load_benchmark("fit_efficiency")
    sweep = "https://github.com/DO-Solutions/gtc-2026-doks/blob/c70feba/dev/vllm/benchmarks/phase0/run/rate-{}.json"
    assert fit.source_of({"source": sweep.format("0.5")}) == fit.source_of({"source": sweep.format("3.0")})
    builds = "https://buildkite.com/vllm/performance-benchmark/builds/{}#annotation"
    assert fit.source_of({"source": builds.format(9513)}) == fit.source_of({"source": builds.format(9555)})
    assert (fit.source_of({"source": "https://github.com/NVIDIA/TensorRT-LLM/blob/a/docs/perf.md"})
            != fit.source_of({"source": "https://github.com/ai-dynamo/aiconfigurator/blob/a/silicon.csv"}))
    page = "https://blog.vllm.ai/2024/07/23/llama31.html"
    assert fit.source_of({"source": page + "#results"}) == page
    sources = {fit.source_of(m) for m in fit.load_measurements()}
    assert len(sources) < len({str(m["source"]).split("#")[0] for m in fit.load_measurements()})


def test_a_sweep_that_replays_its_prompts_is_predicted_with_a_warm_prefix_cache() -> None:
    """Rows marked warm_prefix_cache (the same prompts, the same server, an earlier rate) get the hit
    rate vLLM's block cache gives a replayed prompt: less prompt work, a shorter TTFT than cold."""
    accuracy = load_benchmark("accuracy")
    warm = [m for m in accuracy.load_measurements() if m.get("warm_prefix_cache")]
    assert warm, "published.yaml marks no replayed sweep"
    for row in warm:
        cold = {key: value for key, value in row.items() if key != "warm_prefix_cache"}
        predicted = accuracy.predict_measurement(row) + accuracy.predict_measurement(cold)
        ttft = {c.warm_prefix_cache: c.predicted for c in predicted if c.metric == "ttft_ms"}
        assert ttft[True] < ttft[False], row["id"]
