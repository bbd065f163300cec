"""Replay a production LLM request trace as real OpenAI `/v1/completions` requests, on loopback only.

Arrival times and prompt / output lengths come from a trace CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`,
the Azure LLM inference traces in /work/shared/traces or demo/traces), replayed:

* time-scaled (`time_scale=15`: fifteen trace seconds per real second),
* rate-scaled (`rate_scale` < 1 keeps each request with that probability; > 1 sends each one
  floor(m) or ceil(m) times, the copies spread over the mean gap), with an optional surge
  (`Surge(factor, start_s, end_s)` multiplies the rate inside a replay-time window),
* with `max_tokens` = the output length and `ignore_eos` (the simulator then generates exactly that
  many tokens) and a prompt of exactly the input length in simulator tokens (one word per token,
  starting with a unique word so no two prompts share a prefix-cache block).

Each request is streamed (`stream: true`, usage included) over a fresh asyncio connection, sent to the
endpoint with the fewest outstanding requests among the deployment's current endpoints (a callable,
e.g. `PodSim.endpoints`), and timed on the client: TTFT (send to first token), TPOT ((last token -
first token) / (tokens - 1)) and end-to-end latency. A stream that carries an error event counts as failed.

The generator is bounded: it stops sending after `max_duration_s` or `max_requests`, never holds more
than `max_in_flight` requests, gives the last ones `drain_timeout_s` to finish, then stops by itself.
It runs in its own thread (`start()`, `wait()`, `stop()`, or `run()`), so a caller can read
`recent()` / `per_second()` while it runs.
"""

from __future__ import annotations

import asyncio
import bisect
import csv
import ipaddress
import json
import math
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACE_DIRS = (REPO_ROOT / "demo" / "traces", REPO_ROOT.parent / "shared" / "traces")
VOCAB = (
    "the", "model", "serves", "tokens", "from", "a", "cache", "of", "keys", "and", "values", "while", "scheduler",
    "batches", "requests", "for", "every", "replica", "on", "each", "node", "so", "latency", "stays", "under", "its",
    "target", "when", "load", "grows",
)


# --- traces and schedules --------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceRequest:
    at_s: float  # arrival, seconds from the start (of the trace, or of the replay for a schedule)
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Surge:
    """Multiply the request rate by `factor` between `start_s` and `end_s` of replay time."""

    factor: float
    start_s: float
    end_s: float


def find_trace(name: str = "azure-llm-2023-conv.csv") -> Path:
    for folder in TRACE_DIRS:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"trace {name} not found in {', '.join(map(str, TRACE_DIRS))}")


def _timestamp(text: str) -> float:
    head, _, frac = text.strip().partition(".")
    return datetime.fromisoformat(f"{head}.{(frac or '0')[:6]:0<6}").timestamp()


def read_trace(path: Path) -> list[TraceRequest]:
    """All rows of a trace CSV, arrival times relative to its first row, in arrival order."""
    with path.open(newline="") as f:
        rows = [(_timestamp(r["TIMESTAMP"]), int(r["ContextTokens"]), int(r["GeneratedTokens"]))
                for r in csv.DictReader(f)]
    rows.sort()
    t0 = rows[0][0]
    return [TraceRequest(t - t0, max(1, i), max(1, o)) for t, i, o in rows]


def trace_window(trace: Sequence[TraceRequest], offset_s: float, length_s: float) -> list[TraceRequest]:
    return [r for r in trace if offset_s <= r.at_s < offset_s + length_s]


def rate_scale_for(trace: Sequence[TraceRequest], time_scale: float, target_rps: float,
                   trace_offset_s: float = 0.0, duration_s: float | None = None) -> float:
    """The `rate_scale` that makes the replay's mean rate `target_rps` over the chosen window."""
    length = (duration_s * time_scale) if duration_s is not None else (trace[-1].at_s - trace_offset_s)
    window = trace_window(trace, trace_offset_s, length)
    natural_rps = len(window) / (length / time_scale)
    return target_rps / natural_rps


def replay_schedule(
    trace: Sequence[TraceRequest],
    *,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    surge: Surge | None = None,
    trace_offset_s: float = 0.0,
    duration_s: float | None = None,
    max_requests: int | None = None,
    max_context_tokens: int | None = None,
    max_output_tokens: int | None = None,
    seed: int = 0,
) -> list[TraceRequest]:
    """The requests to send, `at_s` in replay seconds from the start, sorted; see the module docstring."""
    rng = random.Random(seed)
    length = (duration_s * time_scale) if duration_s is not None else math.inf
    window = [r for r in trace if trace_offset_s <= r.at_s < trace_offset_s + length]
    if not window:
        return []
    span = (min(length, window[-1].at_s - trace_offset_s) or 1.0) / time_scale
    mean_gap = span / len(window)
    out: list[TraceRequest] = []
    for row in window:
        t = (row.at_s - trace_offset_s) / time_scale
        m = rate_scale * (surge.factor if surge and surge.start_s <= t < surge.end_s else 1.0)
        copies = int(m) + (1 if rng.random() < m - int(m) else 0)
        inp, outp = row.input_tokens, min(row.output_tokens, max_output_tokens or row.output_tokens)
        if max_context_tokens is not None:  # what a client of a max-model-len server must do
            outp = min(outp, max_context_tokens - 1)
            inp = min(inp, max_context_tokens - outp)
        for c in range(copies):
            out.append(TraceRequest(t if c == 0 else t + rng.uniform(0, mean_gap), inp, outp))
    out.sort(key=lambda r: r.at_s)
    if duration_s is not None:
        out = [r for r in out if r.at_s < duration_s]
    return out[:max_requests] if max_requests is not None else out


# --- results -------------------------------------------------------------------------------------


@dataclass
class RequestResult:
    index: int
    scheduled_s: float  # when the schedule said to send it (from the generator's start)
    sent_s: float  # when it was sent (later than scheduled only when max_in_flight was reached)
    endpoint: str
    input_tokens: int
    max_tokens: int
    ok: bool = False
    status: int | None = None
    error: str | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    tokens: int = 0
    done_s: float | None = None

    def meets(self, ttft_slo_s: float | None, tpot_slo_s: float | None) -> bool:
        """Succeeded within both targets (a missing TPOT, i.e. one token, meets any TPOT target)."""
        if not self.ok:
            return False
        if ttft_slo_s is not None and (self.ttft_s is None or self.ttft_s > ttft_slo_s):
            return False
        return tpot_slo_s is None or self.tpot_s is None or self.tpot_s <= tpot_slo_s


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of `values`; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class SecondStats:
    second: int
    sent: int
    completed: int
    failed: int
    in_flight: int
    ttft_p95_s: float | None
    tpot_p95_s: float | None


@dataclass
class LoadReport:
    """What a run sent and measured; times are seconds from the generator's start."""

    started_at: float  # wall clock (epoch s)
    duration_s: float
    results: list[RequestResult] = field(default_factory=list)
    scheduled: int = 0
    not_sent: int = 0  # scheduled but past max_duration_s / max_requests / stop()

    @property
    def completed(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    @property
    def failed(self) -> list[RequestResult]:
        return [r for r in self.results if not r.ok]

    def per_second(self) -> list[SecondStats]:
        seconds = max(1, math.ceil(self.duration_s))
        rows = []
        for s in range(seconds):
            done = [r for r in self.results if r.done_s is not None and s <= r.done_s < s + 1]
            ok = [r for r in done if r.ok]
            rows.append(SecondStats(
                second=s,
                sent=sum(1 for r in self.results if s <= r.sent_s < s + 1),
                completed=len(ok),
                failed=len(done) - len(ok),
                in_flight=sum(1 for r in self.results if r.sent_s < s + 1 and (r.done_s is None or r.done_s >= s + 1)),
                ttft_p95_s=percentile([r.ttft_s for r in ok if r.ttft_s is not None], 95),
                tpot_p95_s=percentile([r.tpot_s for r in ok if r.tpot_s is not None], 95),
            ))
        return rows

    def summary(self, ttft_slo_s: float | None = None, tpot_slo_s: float | None = None) -> dict[str, Any]:
        ok = self.completed
        ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
        tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
        errors: dict[str, int] = {}
        for r in self.failed:
            key = (r.error or f"HTTP {r.status}")[:80]
            errors[key] = errors.get(key, 0) + 1
        finished = len(self.results)
        return {
            "requests_sent": finished,
            "requests_completed": len(ok),
            "requests_failed": finished - len(ok),
            "requests_not_sent": self.not_sent,
            "errors": errors,
            "duration_s": round(self.duration_s, 2),
            "completed_per_s": round(len(ok) / self.duration_s, 3) if self.duration_s else None,
            "output_tokens_per_s": round(sum(r.tokens for r in ok) / self.duration_s, 1) if self.duration_s else None,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p95_s": percentile(ttft, 95), "ttft_p99_s": percentile(ttft, 99),
            "tpot_p50_s": percentile(tpot, 50), "tpot_p95_s": percentile(tpot, 95), "tpot_p99_s": percentile(tpot, 99),
            "e2e_p95_s": percentile([r.e2e_s for r in ok if r.e2e_s is not None], 95),
            "slo_attainment": (sum(1 for r in self.results if r.meets(ttft_slo_s, tpot_slo_s)) / finished
                               if finished else None),
        }

    def to_json(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "duration_s": self.duration_s, "scheduled": self.scheduled,
                "not_sent": self.not_sent, "results": [asdict(r) for r in self.results]}


# --- the generator -------------------------------------------------------------------------------


def check_loopback(endpoint: str) -> tuple[str, int]:
    """`host:port` -> (host, port), refusing anything that is not a loopback address."""
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    addresses = {info[4][0] for info in socket.getaddrinfo(host, int(port), proto=socket.IPPROTO_TCP)}
    if not addresses or not all(ipaddress.ip_address(a).is_loopback for a in addresses):
        raise ValueError(f"refusing to send load to {endpoint}: only loopback addresses are allowed")
    return host, int(port)


_FIRST_TOKEN = re.compile(rb'"text":"[^"]')
_FINISHED = re.compile(rb'"finish_reason":"')
_ERROR_EVENT = re.compile(rb'data: \{"error"')


def _dechunk(raw: bytes) -> bytes:
    """Decode an HTTP/1.1 chunked body (at the end of a response, so a split never matters)."""
    out, pos = bytearray(), 0
    while pos < len(raw):
        eol = raw.find(b"\r\n", pos)
        if eol < 0:
            break
        size = int(raw[pos:eol].split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += raw[eol + 2:eol + 2 + size]
        pos = eol + 2 + size + 2
    return bytes(out)


class LoadGenerator:
    """Sends `schedule` to the endpoints `endpoints()` returns; see the module docstring."""

    def __init__(
        self,
        schedule: Sequence[TraceRequest],
        endpoints: Callable[[], Sequence[str]],
        model: str,
        *,
        max_duration_s: float,
        max_requests: int | None = None,
        max_in_flight: int = 256,
        request_timeout_s: float = 120.0,
        drain_timeout_s: float = 60.0,
        stream: bool = True,
        seed: int = 0,
    ) -> None:
        if max_duration_s <= 0 or max_in_flight <= 0:
            raise ValueError("max_duration_s and max_in_flight must be positive")
        self.schedule = list(schedule)
        self.endpoints = endpoints
        self.model = model
        self.max_duration_s = max_duration_s
        self.max_requests = max_requests
        self.max_in_flight = max_in_flight
        self.request_timeout_s = request_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.stream = stream
        self.seed = seed
        self.outstanding: dict[str, int] = {}
        self._results: list[RequestResult] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0_wall = 0.0
        self._t0_mono = 0.0
        self._sent = 0
        self._rr = 0
        self._finished_at: float | None = None

    # --- control ---
    def start(self) -> LoadGenerator:
        self._t0_wall, self._t0_mono = time.time(), time.monotonic()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="loadgen", daemon=True)
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """True when the run has ended."""
        assert self._thread is not None, "start() first"
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        """Send nothing more; requests in flight still get `drain_timeout_s`."""
        self._stop.set()

    def run(self) -> LoadReport:
        self.start()
        self.wait()
        return self.report()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def elapsed(self) -> float:
        end = self._finished_at if self._finished_at is not None else time.monotonic()
        return end - self._t0_mono

    def report(self) -> LoadReport:
        with self._lock:
            results = list(self._results)
        return LoadReport(started_at=self._t0_wall, duration_s=self.elapsed(), results=results,
                          scheduled=len(self.schedule), not_sent=len(self.schedule) - self._sent)

    def recent(self, window_s: float = 5.0) -> dict[str, Any]:
        """Rates and p95 latencies over the last `window_s` seconds (for live tables)."""
        now = self.elapsed()
        with self._lock:
            results = list(self._results)
        done = [r for r in results if r.done_s is not None and r.done_s >= now - window_s]
        ok = [r for r in done if r.ok]
        return {
            "t_s": now,
            "completed_per_s": len(ok) / window_s,
            "failed_per_s": (len(done) - len(ok)) / window_s,
            "in_flight": sum(self.outstanding.values()),
            "sent": self._sent,
            "ttft_p95_s": percentile([r.ttft_s for r in ok if r.ttft_s is not None], 95),
            "tpot_p95_s": percentile([r.tpot_s for r in ok if r.tpot_s is not None], 95),
        }

    # --- the event loop ---
    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time() - (time.monotonic() - self._t0_mono)
        slots = asyncio.Semaphore(self.max_in_flight)
        tasks: set[asyncio.Task[None]] = set()
        try:
            for index, request in enumerate(self.schedule):
                if self._stop.is_set() or (self.max_requests is not None and index >= self.max_requests):
                    break
                due = t0 + request.at_s
                if request.at_s >= self.max_duration_s:
                    break
                while (delay := due - loop.time()) > 0 and not self._stop.is_set():
                    await asyncio.sleep(min(delay, 0.2))
                if self._stop.is_set():
                    break
                await slots.acquire()
                self._sent += 1
                task = asyncio.create_task(self._one(index, request, request.at_s, loop.time() - t0, slots))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                _done, pending = await asyncio.wait(set(tasks), timeout=self.drain_timeout_s)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        finally:
            self._finished_at = time.monotonic()

    def _payload(self, index: int, request: TraceRequest) -> bytes:
        rng = random.Random(self.seed * 1_000_003 + index)
        words = [f"r{self.seed}x{index}", *rng.choices(VOCAB, k=request.input_tokens - 1)]
        body: dict[str, Any] = {"model": self.model, "prompt": " ".join(words), "max_tokens": request.output_tokens,
                                "ignore_eos": True, "temperature": 0.0, "stream": self.stream}
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        return json.dumps(body).encode()

    async def _pick(self) -> str | None:
        """The endpoint with the fewest outstanding requests (waits up to 5 s for one to exist)."""
        deadline = time.monotonic() + 5
        while True:
            eps = list(self.endpoints())
            if eps:
                self._rr += 1
                return min(eps, key=lambda e: (self.outstanding.get(e, 0), (hash(e) + self._rr) % len(eps)))
            if time.monotonic() > deadline or self._stop.is_set():
                return None
            await asyncio.sleep(0.1)

    async def _one(self, index: int, request: TraceRequest, scheduled_s: float, sent_s: float,
                   slots: asyncio.Semaphore) -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time() - (time.monotonic() - self._t0_mono)
        result = RequestResult(index=index, scheduled_s=scheduled_s, sent_s=sent_s, endpoint="",
                               input_tokens=request.input_tokens, max_tokens=request.output_tokens)
        endpoint = await self._pick()
        try:
            if endpoint is None:
                result.error = "no endpoint serves the deployment"
                return
            result.endpoint = endpoint
            self.outstanding[endpoint] = self.outstanding.get(endpoint, 0) + 1
            try:
                await asyncio.wait_for(self._http(endpoint, self._payload(index, request), result, loop.time()),
                                       self.request_timeout_s)
            except TimeoutError:
                result.error = f"timed out after {self.request_timeout_s:g} s"
            except asyncio.CancelledError:
                result.error = "cancelled: still running when the drain timeout ended"
            except (OSError, ValueError, json.JSONDecodeError) as exc:
                result.error = f"{type(exc).__name__}: {exc}"
            finally:
                self.outstanding[endpoint] -= 1
        finally:
            result.done_s = loop.time() - t0
            slots.release()
            with self._lock:
                self._results.append(result)

    async def _http(self, endpoint: str, body: bytes, result: RequestResult, sent: float) -> None:
        loop = asyncio.get_running_loop()
        host, port = check_loopback(endpoint)
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(
                f"POST /v1/completions HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body)
            await writer.drain()
            status_line = await reader.readline()
            result.status = int(status_line.split()[1])
            chunked = False
            while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                chunked |= name.strip().lower() == "transfer-encoding" and "chunked" in value.lower()
            raw = bytearray()
            first = finished = None
            while data := await reader.read(65536):
                now = loop.time()
                scan_from = max(0, len(raw) - 32)
                raw += data
                if first is None and _FIRST_TOKEN.search(raw, scan_from):
                    first = now
                if finished is None and _FINISHED.search(raw, scan_from):
                    finished = now
            end = loop.time()
        finally:
            writer.close()
        payload = _dechunk(bytes(raw)) if chunked else bytes(raw)
        result.e2e_s = end - sent
        if result.status != 200:
            result.error = f"HTTP {result.status}: {payload[:200].decode(errors='replace')}"
            return
        if _ERROR_EVENT.search(payload) or (not self.stream and payload.startswith(b'{"error"')):
            start = max(0, payload.find(b'{"error"'))
            result.error = payload[start:start + 200].decode(errors="replace")
            return
        usage_at = payload.rfind(b'"usage":{')
        if usage_at >= 0:
            line_start = payload.rfind(b"\n", 0, usage_at) + 1
            line_end = payload.find(b"\n", usage_at)
            line = payload[line_start:line_end if line_end >= 0 else None].removeprefix(b"data: ")
            result.tokens = int(json.loads(line)["usage"]["completion_tokens"])
        if self.stream and first is not None:
            result.ttft_s = first - sent
            if result.tokens > 1:
                result.tpot_s = ((finished or end) - first) / (result.tokens - 1)
        result.ok = result.tokens > 0


def schedule_rate(schedule: Sequence[TraceRequest], at_s: float, window_s: float = 10.0) -> float:
    """Scheduled requests per second around `at_s` (for plots and test assertions)."""
    times = [r.at_s for r in schedule]
    lo = bisect.bisect_left(times, at_s - window_s / 2)
    hi = bisect.bisect_left(times, at_s + window_s / 2)
    return (hi - lo) / window_s
