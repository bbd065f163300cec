"""The offline CLI: `kvscale plan` and `kvscale predict`, run as a user would."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def kvscale(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvscale", *args], capture_output=True, text=True, cwd=ROOT,
                          check=False)


def test_plan_json_has_the_stable_keys() -> None:
    result = kvscale("plan", "-f", "examples/llama-3.1-70b-h100.yaml", "-o", "json")
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["feasible"] is True
    assert body["gpu_type"] == "H100-SXM"
    assert body["tensor_parallel"] in (2, 4, 8)
    assert body["replicas"] * body["tensor_parallel"] == body["gpus"]
    assert body["predicted"]["tpot_ms"] <= 40


def test_plan_table_and_goodput_chart(tmp_path: Path) -> None:
    chart = tmp_path / "goodput.png"
    result = kvscale("plan", "-f", "examples/llama-3.1-70b-h100.yaml", "--plot", str(chart))
    assert result.returncode == 0, result.stderr
    assert "PLAN (binding:" in result.stdout and "TP" in result.stdout
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 10_000


def test_infeasible_plan_exits_1_with_explanation(tmp_path: Path) -> None:
    text = (ROOT / "examples/llama-3.1-70b-h100.yaml").read_text().replace("tpotMs: 40", "tpotMs: 1")
    resource = tmp_path / "impossible.yaml"
    resource.write_text(text)
    result = kvscale("plan", "-f", str(resource), "-o", "json")
    assert result.returncode == 1
    body = json.loads(result.stdout)
    assert body["feasible"] is False and "unreachable" in body["explanation"]


def test_predict_json() -> None:
    result = kvscale("predict", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-SXM", "--tp", "1",
                     "--batch", "32", "--input-tokens", "1024", "--output-tokens", "256", "-o", "json")
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    for key in ("ttft_ms", "tpot_ms", "decode_step_ms", "prefill_ms", "output_tokens_per_s",
                "output_tokens_per_s_per_gpu", "kv_bytes_per_token", "weights_bytes_per_gpu", "kv_cache_tokens",
                "bound"):
        assert key in body
    assert body["kv_bytes_per_token"] == 131_072
    assert body["bound"] == "memory-bandwidth"


@pytest.mark.parametrize(("flag", "value", "kind"), [("--concurrency", "50", "closed-loop"),
                                                   ("--request-rate", "1", "open-loop"),
                                                   ("--batch", "8", "static-batch")])
def test_predict_says_which_load_it_modelled(flag: str, value: str, kind: str) -> None:
    result = kvscale("predict", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "H100-SXM", "--tp", "4",
                     flag, value, "--input-tokens", "5000", "--output-tokens", "500", "-o", "json")
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["load"] == kind and body["load_value"] == float(value)
    assert body["ttft_percentile_ms"] >= body["ttft_ms"] > 0
    assert body["tpot_percentile_ms"] >= body["tpot_ms"] > 0
    assert body["stable"] is True


def test_predict_ttft_grows_with_concurrency_and_an_overload_says_so() -> None:
    def closed(concurrency: int) -> dict[str, object]:
        out = kvscale("predict", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-SXM", "--concurrency",
                      str(concurrency), "--input-tokens", "4096", "--output-tokens", "256", "-o", "json")
        assert out.returncode == 0, out.stderr
        parsed: dict[str, object] = json.loads(out.stdout)
        return parsed

    one, fifty = closed(1), closed(50)
    assert float(fifty["ttft_ms"]) > 1.5 * float(one["ttft_ms"])  # type: ignore[arg-type]
    overload = kvscale("predict", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4",
                       "--request-rate", "100", "--input-tokens", "4096")
    assert overload.returncode == 0, overload.stderr
    assert "overloaded" in overload.stdout
    as_json = kvscale("predict", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", "--request-rate", "100",
                      "--input-tokens", "4096", "-o", "json")
    body = json.loads(as_json.stdout)  # strict JSON: an unbounded TTFT is null, not Infinity
    assert body["stable"] is False and body["ttft_ms"] is None


def test_predict_with_a_user_config_json(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16,
                                  "num_key_value_heads": 4, "intermediate_size": 8192, "vocab_size": 50000}))
    result = kvscale("predict", "--model", "my-org/tiny", "--config-json", str(config), "--gpu", "L4", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["kv_bytes_per_token"] == 2 * 16 * 4 * 128 * 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["predict", "--model", "no-such-model", "--gpu", "H100"], "not in the catalog"),
        (["predict", "--model", "llama-3.1-8b", "--gpu", "TPU-v9"], "known types"),
        (["predict", "--model", "llama-3.1-8b", "--gpu", "H100", "--tp", "3"], "not legal"),
        (["plan", "-f", "does-not-exist.yaml"], "cannot read"),
        (["run", "--metrics-window", "5"], "--metrics-window must be at least 10 seconds"),
        (["run", "-n", "team-*"], "patterns are not supported"),
        (["run", "-n", "prod", "-n", "Prod"], "'Prod' is not a namespace name"),
    ],
)
def test_bad_input_is_one_clear_line(args: list[str], message: str) -> None:
    result = kvscale(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_invalid_resource_names_the_field(tmp_path: Path) -> None:
    text = (ROOT / "examples/llama-3.1-70b-h100.yaml").read_text().replace("ttftMs: 1000", "ttftMs: -5")
    resource = tmp_path / "bad.yaml"
    resource.write_text(text)
    result = kvscale("plan", "-f", str(resource))
    assert result.returncode == 2
    assert "spec.slo.ttftMs" in result.stderr


def test_predict_num_prompts_counts_a_runs_first_wave_in_its_mean_ttft() -> None:
    def closed(*extra: str) -> dict[str, float]:
        out = kvscale("predict", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "H100-SXM", "--tp", "4",
                      "--precision", "fp8", "--concurrency", "64", "--input-tokens", "8192", "--output-tokens", "1024",
                      *extra, "-o", "json")
        assert out.returncode == 0, out.stderr
        parsed: dict[str, float] = json.loads(out.stdout)
        return parsed

    steady, run = closed(), closed("--num-prompts", "640")
    assert steady["ttft_ms"] == steady["ttft_steady_ms"] == run["ttft_steady_ms"]
    assert run["run_requests"] == 640.0 and run["ttft_ms"] > 1.5 * steady["ttft_ms"]
    assert run["tpot_ms"] == steady["tpot_ms"]  # only the mean TTFT counts the first wave
    alone = kvscale("predict", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-SXM", "--num-prompts", "5")
    assert alone.returncode != 0 and "--num-prompts needs --concurrency" in alone.stderr
