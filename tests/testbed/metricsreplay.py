"""Replays captured `/metrics` snapshots of a real vLLM to the bed's Prometheus, at their own pace.

A capture is a gzipped JSON-lines file, one snapshot per line: `{"t_s": seconds since the first
snapshot, "text": the exposition as the server answered it}` (tests/realvllm/capture.py writes it).

`MetricsReplay` serves, from a loopback HTTP server, the newest snapshot whose time has come
(`start_s + time_scale * t_s <= now`), every sample stamped with that instant (`value timestamp_ms`).
Prometheus honours exposed timestamps, so the stored series have exactly the (scaled) captured
spacing, whatever the scrape timing; a test can then compute what every query must answer from the
snapshots alone. A snapshot is stored only if a scrape falls within its time: `time_scale` stretches
the capture so that every snapshot outlasts a scrape interval, and before `begin()` the endpoint
serves no samples (Prometheus may take a few seconds to scrape a new target for the first time).

`engines=N` repeats every series of engine "0" for engines "1".."N-1": one pod running N data-parallel
engines, as vLLM exports them (one child per engine, label `engine`).
"""

from __future__ import annotations

import gzip
import json
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+\d+)?\s*$")


@dataclass(frozen=True)
class Snapshot:
    t_s: float
    text: str


def read_capture(path: Path) -> list[Snapshot]:
    with gzip.open(path, "rt") as handle:
        snapshots = [Snapshot(float(row["t_s"]), row["text"]) for row in map(json.loads, handle) if row]
    return sorted(snapshots, key=lambda s: s.t_s)


def write_capture(path: Path, snapshots: Sequence[Snapshot]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        for snapshot in snapshots:
            handle.write(json.dumps({"t_s": round(snapshot.t_s, 3), "text": snapshot.text}) + "\n")


def with_engines(text: str, engines: int) -> str:
    """The exposition with every `engine="0"` series repeated for engines 1..engines-1 (same values)."""
    if engines <= 1:
        return text
    out: list[str] = []
    for line in text.splitlines():
        out.append(line)
        if not line.startswith("#") and 'engine="0"' in line:
            out.extend(line.replace('engine="0"', f'engine="{engine}"') for engine in range(1, engines))
    return "\n".join(out) + "\n"


def stamped(text: str, timestamp_ms: int) -> str:
    """Every sample line with an explicit timestamp (replacing one it had)."""
    out: list[str] = []
    for line in text.splitlines():
        match = None if line.startswith("#") else _SAMPLE.match(line)
        if match:
            out.append(f"{match.group(1)}{match.group(2) or ''} {match.group(3)} {timestamp_ms}")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


class MetricsReplay:
    """A loopback /metrics endpoint replaying `snapshots` from `start_s` (epoch seconds)."""

    def __init__(self, snapshots: Sequence[Snapshot], engines: int = 1, time_scale: float = 1.0) -> None:
        if not snapshots:
            raise ValueError("a replay needs at least one snapshot")
        self.snapshots = list(snapshots)
        self.start_s: float | None = None
        self.engines = engines
        self.time_scale = time_scale
        self.scrapes = 0
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = replay.exposition(time.time()).encode()
                replay.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-replay", daemon=True)

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    def begin(self, start_s: float) -> None:
        """Replay from `start_s` (epoch seconds): snapshot i is served from start_s + time_scale * t_i."""
        self.start_s = start_s

    @property
    def end_s(self) -> float:
        return self.at(self.snapshots[-1])

    def at(self, snapshot: Snapshot) -> float:
        """The epoch time a snapshot is stamped with."""
        if self.start_s is None:
            raise RuntimeError("the replay has not begun")
        return self.start_s + self.time_scale * snapshot.t_s

    def exposition(self, now_s: float) -> str:
        if self.start_s is None or now_s < self.start_s:
            return "# the replay has not begun\n"
        current = self.snapshots[0]
        for snapshot in self.snapshots:
            if self.at(snapshot) <= now_s:
                current = snapshot
        return stamped(with_engines(current.text, self.engines), round(self.at(current) * 1000))

    def start(self) -> MetricsReplay:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> MetricsReplay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
