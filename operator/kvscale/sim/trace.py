"""Request traces: arrival times and request lengths, parsed from CSV text or generated.

The CSV format is the Azure LLM inference trace's (`TIMESTAMP,ContextTokens,GeneratedTokens`, one
request a row); TIMESTAMP is either a date-time or seconds. Parsing takes the file's bytes (plain or
gzip): reading files is the caller's job.
"""

from __future__ import annotations

import csv
import gzip
import io
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from kvscale.errors import InvalidSpecError

AZURE_ATTRIBUTION = (
    "Azure LLM inference trace 2023 (Patel et al., \"Splitwise: Efficient generative LLM inference using "
    "phase splitting\", ISCA 2024), Azure Public Dataset, CC BY 4.0"
)
PACKAGED_TRACES = {
    "azure-conv": "azure-llm-2023-conv.csv.gz",
    "azure-code": "azure-llm-2023-code.csv.gz",
}
_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Trace:
    """Requests sorted by arrival; times in seconds from the trace's start."""

    name: str
    arrival_s: NDArray[np.float64]
    input_tokens: NDArray[np.int64]
    output_tokens: NDArray[np.int64]
    duration_s: float
    attribution: str | None = None
    # Shared prompt prefixes (a system prompt, a conversation so far): the group a request's prompt
    # starts with (-1: none) and how many of its tokens that prefix is. A server whose prefix cache
    # holds the group's KV computes only the rest.
    prefix_group: NDArray[np.int64] | None = None
    prefix_tokens: NDArray[np.int64] | None = None

    @property
    def requests(self) -> int:
        return int(self.arrival_s.size)

    def sped_up(self, speedup: float) -> Trace:
        """Arrivals `speedup` times faster (the same requests in 1/speedup of the time)."""
        if speedup <= 0:
            raise InvalidSpecError(f"--speedup must be positive, got {speedup}")
        if speedup == 1:
            return self
        return replace(self, name=f"{self.name} x{speedup:g}", arrival_s=self.arrival_s / speedup,
                       duration_s=self.duration_s / speedup)

    def truncated(self, duration_s: float) -> Trace:
        """Only the arrivals before `duration_s`; the trace then lasts exactly that long."""
        if duration_s <= 0:
            raise InvalidSpecError(f"--duration-s must be positive, got {duration_s}")
        keep = self.arrival_s < duration_s
        return replace(self, arrival_s=self.arrival_s[keep], input_tokens=self.input_tokens[keep],
                       output_tokens=self.output_tokens[keep], duration_s=duration_s,
                       prefix_group=None if self.prefix_group is None else self.prefix_group[keep],
                       prefix_tokens=None if self.prefix_tokens is None else self.prefix_tokens[keep])

    def after(self, start_s: float) -> Trace:
        """The arrivals from `start_s` on, shifted to start at 0: the rest of a trace after a cut."""
        if not 0 <= start_s < self.duration_s:
            raise InvalidSpecError(f"a cut at {start_s} s is outside the trace's {self.duration_s} s")
        keep = self.arrival_s >= start_s
        return replace(self, arrival_s=self.arrival_s[keep] - start_s, input_tokens=self.input_tokens[keep],
                       output_tokens=self.output_tokens[keep], duration_s=self.duration_s - start_s,
                       prefix_group=None if self.prefix_group is None else self.prefix_group[keep],
                       prefix_tokens=None if self.prefix_tokens is None else self.prefix_tokens[keep])

    def rate_per_window(self, window_s: float = 60.0) -> NDArray[np.float64]:
        """Arrivals/s in consecutive windows of `window_s` from the start."""
        bins = max(1, int(np.ceil(self.duration_s / window_s)))
        counts = np.bincount(np.minimum((self.arrival_s // window_s).astype(np.int64), bins - 1), minlength=bins)
        return counts.astype(np.float64) / window_s

    def peak_rate(self, window_s: float = 60.0) -> float:
        return float(np.max(self.rate_per_window(window_s))) if self.requests else 0.0

    @property
    def mean_rate(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0


def _timestamps_s(values: list[str], name: str) -> NDArray[np.float64]:
    try:
        return np.array([float(v) for v in values], dtype=np.float64)
    except ValueError:
        pass
    try:
        # Fractions beyond microseconds (the Azure files carry 7 digits) are cut, not rounded.
        stamps = np.array([v.strip().replace(" ", "T")[:26] for v in values], dtype="datetime64[us]")
    except ValueError as exc:
        raise InvalidSpecError(f"{name}: TIMESTAMP is neither seconds nor a date-time: {exc}") from exc
    seconds: NDArray[np.float64] = (stamps - stamps.min()).astype(np.float64) / 1e6
    return seconds


def parse_trace_csv(data: bytes, name: str, attribution: str | None = None) -> Trace:
    """A trace from CSV bytes (gzip-compressed or not) with the columns TIMESTAMP, ContextTokens,
    GeneratedTokens. Arrivals start at 0; outputs of 0 tokens count as 1 (a request yields a token)."""
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise InvalidSpecError(f"{name}: not a readable gzip file: {exc}") from exc
    reader = csv.reader(io.StringIO(data.decode("utf-8-sig")))
    header = [h.strip() for h in next(reader, [])]
    missing = [c for c in _COLUMNS if c not in header]
    if missing:
        raise InvalidSpecError(f"{name}: missing column(s) {', '.join(missing)}; expected {','.join(_COLUMNS)}")
    cols = [header.index(c) for c in _COLUMNS]
    rows = [row for row in reader if row]
    if not rows:
        raise InvalidSpecError(f"{name}: no requests")
    try:
        stamps = [row[cols[0]] for row in rows]
        inputs = np.array([int(row[cols[1]]) for row in rows], dtype=np.int64)
        outputs = np.array([int(row[cols[2]]) for row in rows], dtype=np.int64)
    except (ValueError, IndexError) as exc:
        raise InvalidSpecError(f"{name}: malformed row: {exc}") from exc
    if np.any(inputs < 1) or np.any(outputs < 0):
        raise InvalidSpecError(f"{name}: token counts must be positive")
    arrival = _timestamps_s(stamps, name)
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order] - float(arrival.min())
    # The trace lasts until its last arrival, rounded up to a whole second.
    duration = float(np.ceil(arrival[-1] + 1e-9)) if arrival[-1] > 0 else 1.0
    return Trace(name=name, arrival_s=arrival, input_tokens=inputs[order], output_tokens=np.maximum(outputs[order], 1),
                 duration_s=duration, attribution=attribution)
