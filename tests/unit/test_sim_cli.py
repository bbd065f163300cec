"""`kvscale simulate`, run as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("slo_attainment", "goodput_tokens_per_s", "p50_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "p50_tpot_ms",
        "p95_tpot_ms", "p99_tpot_ms", "gpu_hours", "trace_gpu_hours", "trace_mean_replicas", "cost",
        "tokens_per_dollar", "max_replicas", "mean_replicas", "requests", "dropped", "unfinished")


def kvscale(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvscale", *args], capture_output=True, text=True, cwd=ROOT,
                          check=False)


def test_simulate_json_with_a_synthetic_trace_and_a_plot(tmp_path: Path) -> None:
    chart = tmp_path / "timeline.png"
    result = kvscale("simulate", "-f", "examples/llama-3.1-8b-l4.yaml", "--trace",
                     "synthetic:poisson:rate=4:duration=300", "--policy", "kvscale", "-o", "json", "--plot", str(chart))
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    for key in KEYS:
        assert key in body, key
    assert body["requests"] > 1000 and 0.0 <= body["slo_attainment"] <= 1.0
    assert body["policy_detail"]["calibration"]["samples"] > 0
    assert body["server_efficiency"] != body["planner_efficiency"]
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_table_with_a_packaged_trace_sped_up_keeps_the_attribution() -> None:
    result = kvscale("simulate", "-f", "examples/llama-3.1-8b-l4.yaml", "--trace", "azure-code", "--speedup", "4",
                     "--duration-s", "120", "--policy", "hpa-queue")
    assert result.returncode == 0, result.stderr
    assert "SLO attainment" in result.stdout and "GPU-hours" in result.stdout
    assert "while the trace ran" in result.stdout
    assert "CC BY 4.0" in result.stdout and "slower than the planner assumes" in result.stdout


def test_simulate_reads_a_csv_file(tmp_path: Path) -> None:
    trace = tmp_path / "mine.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,100,20\n0.5,200,30\n1.5,300,40\n")
    result = kvscale("simulate", "-f", "examples/llama-3.1-8b-l4.yaml", "--trace", str(trace), "--policy",
                     "static-peak", "-o", "json")
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["requests"] == 3 and body["unfinished"] == 0 and body["attribution"] is None


def test_simulate_bad_trace_is_one_line_and_exit_2() -> None:
    result = kvscale("simulate", "-f", "examples/llama-3.1-8b-l4.yaml", "--trace", "synthetic:weird:rate=1")
    assert result.returncode == 2
    assert "unknown synthetic kind" in result.stderr and result.stderr.count("\n") == 1
    missing = kvscale("simulate", "-f", "examples/llama-3.1-8b-l4.yaml", "--trace", "/nonexistent.csv")
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_simulate_draws_startups_from_a_range_and_pins_a_forecaster() -> None:
    args = ("simulate", "-f", "examples/llama-3.1-8b-l4.yaml", "--trace",
            "synthetic:diurnal:rate=4:amplitude=0.9:period=1200:duration=1200", "-o", "json")
    drawn = kvscale(*args, "--startup-s", "60-300", "--seed", "3", "--forecaster", "HoltWinters")
    assert drawn.returncode == 0, drawn.stderr
    forecast = json.loads(drawn.stdout)["policy_detail"]["forecast"]
    assert forecast["forecaster"] == "holt-winters" and forecast["backtest_error_pct"]["holt-winters"] is not None
    again = kvscale(*args, "--startup-s", "60-300", "--seed", "3", "--forecaster", "HoltWinters")
    assert json.loads(again.stdout)["gpu_hours"] == json.loads(drawn.stdout)["gpu_hours"]  # seeded
    bad = kvscale(*args, "--startup-s", "300-60")
    assert bad.returncode == 2 and "0 <= MIN <= MAX" in bad.stderr
    unknown = kvscale(*args, "--forecaster", "Oracle")
    assert unknown.returncode == 2 and "invalid choice" in unknown.stderr
