"""A real vLLM (the PyPI CPU build) as the server of a bed pod, a closed-loop load with aborts, and a
capture of its `/metrics` over time.

* `vllm_venv()` runs install.sh (a cached virtualenv) and `tiny_model_dir()` builds the tiny
  random-weight Llama once (tiny_model.py); see README.md in this directory.
* `spawn_vllm(config, seed)` has PodSim's spawn signature: it starts `vllm serve` (serve.sh) on a free
  loopback port for a pod, served under the pod's `--served-model-name`, and waits for /health.
* `ClosedLoop` runs N clients, each sending its next streamed completion when the last one ends
  (`vllm bench serve --max-concurrency N` style); one request in `abort_every` is dropped by its
  client after the first token, which vLLM counts as finished_reason="abort".
* `MetricsCapture` reads `/metrics` every `interval_s` and keeps (seconds since start, text).
"""

from __future__ import annotations

import http.client
import json
import math
import os
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bedkit import InferenceSim, launch_sim
from metricsreplay import Snapshot

HERE = Path(__file__).resolve().parent
VLLM_VERSION = "0.32.0"
STARTUP_TIMEOUT_S = 300.0  # cold: torch import and the engine's CPU warm-up on 2 cores


def cache_dir() -> Path:
    return Path(os.environ.get("KVSCALE_CACHE_DIR", Path.home() / ".cache" / "kvscale"))


def vllm_venv() -> Path:
    """The cached vLLM virtualenv (install.sh installs it once; later calls take a second)."""
    done = subprocess.run(["bash", str(HERE / "install.sh")], check=True, capture_output=True, text=True)
    return Path(done.stdout.strip().splitlines()[-1])


def tiny_model_dir(venv: Path) -> Path:
    model = cache_dir() / "tiny-llama"
    if not (model / "config.json").is_file():
        subprocess.run([str(venv / "bin" / "python"), str(HERE / "tiny_model.py"), str(model)], check=True)
    return model


@dataclass(frozen=True)
class VllmServer:
    venv: Path
    model_dir: Path
    max_num_seqs: int = 8
    max_model_len: int = 2048
    kv_cache_bytes: int = 4 * 2**20

    def spawn(self, served_model_name: str, seed: int = 0) -> InferenceSim:
        """`vllm serve` for one pod on a free loopback port (bedkit's launcher: logs, PID files, retries)."""
        env = {**os.environ, "KVSCALE_VLLM_VENV": str(self.venv), "SERVED_MODEL_NAME": served_model_name,
               "MAX_NUM_SEQS": str(self.max_num_seqs), "MAX_MODEL_LEN": str(self.max_model_len),
               # a small KV cache (8,192 tokens of the tiny model), so that kv_cache_usage_perc moves
               "KV_CACHE_BYTES": str(self.kv_cache_bytes)}
        return launch_sim(lambda port: ["bash", str(HERE / "serve.sh"), str(self.model_dir), str(port),
                                        "--seed", str(seed % 2**32)],  # numpy wants 32 bits
                          served_model_name, STARTUP_TIMEOUT_S, env, name="vllm")


@dataclass
class RequestOutcome:
    started_s: float  # since the load began
    prompt_words: int
    output_tokens: int
    ttft_s: float | None
    latency_s: float
    aborted: bool = False
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2 or self.aborted:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


def streamed_completion(host_port: str, model: str, prompt: str, max_tokens: int, abort: bool,
                        timeout_s: float = 120.0) -> tuple[float | None, int, float, str | None]:
    """(TTFT s, chunks with text, latency s, error) of one streamed /v1/completions request; with
    `abort`, the connection is closed after the first token."""
    host, port = host_port.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True, "temperature": 0.0})
    t0 = time.monotonic()
    ttft, tokens = None, 0
    try:
        conn.connect()
        sock = conn.sock  # the response keeps its own reference: shutdown() is what tells the server
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            return None, 0, time.monotonic() - t0, f"HTTP {response.status}: {response.read()[:200]!r}"
        for raw in response:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            choices = json.loads(line[5:]).get("choices") or [{}]
            if choices[0].get("text"):
                tokens += 1
                if ttft is None:
                    ttft = time.monotonic() - t0
                    if abort:
                        sock.shutdown(socket.SHUT_RDWR)
                        break
        return ttft, tokens, time.monotonic() - t0, None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return ttft, tokens, time.monotonic() - t0, f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


@dataclass
class ClosedLoop:
    """`clients` concurrent clients against `host_port` until stopped; prompt lengths cycle through
    `prompt_words`, outputs through `max_tokens`."""

    host_port: str
    model: str
    clients: int
    prompt_words: tuple[int, ...] = (40, 120, 250, 400)
    max_tokens: tuple[int, ...] = (64, 128, 256)
    abort_every: int = 7
    # An aborted request asks for many tokens, so that it is still decoding when its client leaves: a
    # tiny model finishes 64 tokens before vLLM notices the closed connection (then it counts "length").
    abort_max_tokens: int = 800
    outcomes: list[RequestOutcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _t0: float = 0.0

    def _client(self, index: int) -> None:
        sent = 0
        while not self._stop.is_set():
            n = index + self.clients * sent
            words = self.prompt_words[n % len(self.prompt_words)]
            prompt = " ".join(f"word{(n * 31 + i) % 997}" for i in range(words))
            abort = self.abort_every > 0 and n % self.abort_every == self.abort_every - 1
            started = time.monotonic() - self._t0
            max_tokens = self.abort_max_tokens if abort else self.max_tokens[n % len(self.max_tokens)]
            ttft, tokens, latency, error = streamed_completion(self.host_port, self.model, prompt, max_tokens, abort)
            with self._lock:
                self.outcomes.append(RequestOutcome(started, words, tokens, ttft, latency, abort, error))
            sent += 1

    def start(self, t0: float | None = None) -> ClosedLoop:
        self._t0 = time.monotonic() if t0 is None else t0
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True, name=f"client-{i}")
                         for i in range(self.clients)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(150)


def load_summary(outcomes: list[RequestOutcome], since_s: float, until_s: float) -> dict[str, Any]:
    """Client-side figures of the requests that started in [since_s, until_s)."""
    chosen = [o for o in outcomes if since_s <= o.started_s < until_s]
    served = [o for o in chosen if not o.aborted and o.error is None]
    span = max(until_s - since_s, 1e-9)

    def p95(values: list[float]) -> float | None:
        if not values:
            return None
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]

    ttfts = [o.ttft_s for o in served if o.ttft_s is not None]
    tpots = [t for o in served if (t := o.tpot_s) is not None]
    return {
        "requests": len(chosen), "served": len(served), "aborted": sum(o.aborted for o in chosen),
        "errors": sum(o.error is not None for o in chosen),
        "served_per_s": len(served) / span, "aborted_per_s": sum(o.aborted for o in chosen) / span,
        "ttft_p95_s": p95(ttfts), "ttft_mean_s": sum(ttfts) / len(ttfts) if ttfts else None,
        "tpot_p95_s": p95(tpots), "tpot_mean_s": sum(tpots) / len(tpots) if tpots else None,
        "output_tokens_mean": sum(o.output_tokens for o in served) / len(served) if served else None,
    }


class MetricsCapture:
    """Reads `url` every `interval_s` in a thread; `snapshots` holds (seconds since start, text)."""

    def __init__(self, url: str, interval_s: float = 2.0) -> None:
        self.url = url
        self.interval_s = interval_s
        self.snapshots: list[Snapshot] = []
        self.started_at = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="metrics-capture")

    def _run(self) -> None:
        while not self._stop.is_set():
            taken = time.time()
            try:
                with urllib.request.urlopen(self.url, timeout=5) as response:
                    text = response.read().decode()
            except OSError:
                text = None
            if text is not None:
                self.snapshots.append(Snapshot(round(taken - self.started_at, 3), text))
            self._stop.wait(max(0.0, self.interval_s - (time.time() - taken)))

    def start(self) -> MetricsCapture:
        self.started_at = time.time()
        self._thread.start()
        return self

    def stop(self) -> list[Snapshot]:
        self._stop.set()
        self._thread.join(10)
        return self.snapshots
