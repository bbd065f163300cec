"""Synthetic traces: Poisson, diurnal and bursty arrivals, from a spec string and a seed.

    synthetic:poisson:rate=5:duration=3600
    synthetic:diurnal:rate=5:amplitude=0.8:period=3600:duration=3600
    synthetic:bursts:rate=2:burst_rate=20:every=600:length=60:duration=3600
    synthetic:weekly:rate=2:duration=259200:start_day=6:weekend=0.5

`weekly` is the working week of a business application: each day quiet at night (NIGHT_SHARE of the
peak at 04:00), rising through the morning to a peak at 16:00; `rate` is a weekday's mean, weekend days
run at `weekend` times the weekday, and `start_day` is the weekday the trace starts on at midnight
(0 Monday ... 6 Sunday).

Common keys: input=512 and output=256 (mean tokens), lengths=fixed|exponential, seed=0.
A drifting request shape: input_to=T and/or output_to=T with drift=linear|daily. linear: the mean moves
from input (output) at the start to input_to (output_to) at the end of the trace; daily: it swings between
the two every `period` (`input` at the start of each period, `input_to` half a period in: with diurnal
arrivals, the peak's requests have the other shape, as when daytime chat gives way to nightly batch work).
Shared prefixes: prefixes=N (groups; 0, the default, for none) and prefix=T tokens: each request's
prompt starts with one of N prefixes of T tokens (groups drawn Zipf-like, as system prompts and
conversations are), followed by its own `input` tokens.
Non-homogeneous arrivals are drawn by thinning a Poisson process at the peak rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from kvscale.errors import InvalidSpecError
from kvscale.sim.trace import Trace

PREFIX = "synthetic:"
KINDS = ("poisson", "diurnal", "bursts", "weekly")
_DEFAULTS: dict[str, float] = {"rate": 5.0, "duration": 3600.0, "input": 512.0, "output": 256.0, "seed": 0.0,
                               "amplitude": 0.8, "period": 3600.0, "burst_rate": 20.0, "every": 600.0,
                               "length": 60.0, "prefixes": 0.0, "prefix": 1024.0, "start_day": 0.0,
                               "weekend": 0.5, "input_to": 0.0, "output_to": 0.0}
DAY_S = 86_400.0
NIGHT_SHARE = 0.15
_LENGTHS = ("fixed", "exponential")
_DRIFTS = ("none", "linear", "daily")

RateFunction = Callable[[NDArray[np.float64]], NDArray[np.float64]]


def _parse(text: str) -> tuple[str, dict[str, float], str, str]:
    parts = text.removeprefix(PREFIX).split(":")
    kind = parts[0]
    if kind not in KINDS:
        raise InvalidSpecError(f"--trace {text!r}: unknown synthetic kind {kind!r}; use one of {', '.join(KINDS)}")
    values = dict(_DEFAULTS)
    lengths, drift = "fixed", "none"
    for part in parts[1:]:
        key, sep, value = part.partition("=")
        if not sep:
            raise InvalidSpecError(f"--trace {text!r}: expected key=value, got {part!r}")
        if key == "drift":
            if value not in _DRIFTS:
                raise InvalidSpecError(f"--trace {text!r}: drift must be one of {', '.join(_DRIFTS)}")
            drift = value
            continue
        if key == "lengths":
            if value not in _LENGTHS:
                raise InvalidSpecError(f"--trace {text!r}: lengths must be one of {', '.join(_LENGTHS)}")
            lengths = value
            continue
        if key not in _DEFAULTS:
            raise InvalidSpecError(f"--trace {text!r}: unknown key {key!r}; known: {', '.join(sorted(_DEFAULTS))}")
        try:
            values[key] = float(value)
        except ValueError as exc:
            raise InvalidSpecError(f"--trace {text!r}: {key} must be a number, got {value!r}") from exc
    for key in ("rate", "duration", "input", "output", "period", "every", "length", "prefix"):
        if values[key] <= 0 and not (key == "rate" and values[key] == 0):
            raise InvalidSpecError(f"--trace {text!r}: {key} must be positive")
    targets = values["input_to"] > 0 or values["output_to"] > 0
    if min(values["input_to"], values["output_to"]) < 0 or targets != (drift != "none"):
        raise InvalidSpecError(f"--trace {text!r}: a drifting shape needs drift=linear|daily and a positive "
                               "input_to and/or output_to; neither without the other")
    return kind, values, lengths, drift


def _rate_function(kind: str, v: dict[str, float]) -> tuple[RateFunction, float]:
    """(arrival rate at times t, its maximum)."""
    rate = v["rate"]
    if kind == "diurnal":
        amplitude = min(max(v["amplitude"], 0.0), 1.0)

        def diurnal(t: NDArray[np.float64]) -> NDArray[np.float64]:
            # Lowest at the start, highest half a period in.
            return rate * (1.0 - amplitude * np.cos(2.0 * math.pi * t / v["period"]))

        return diurnal, rate * (1.0 + amplitude)
    if kind == "weekly":
        grid = np.linspace(0.0, DAY_S, 1441)
        day_mean = float(np.mean(_working_day(grid[:-1])))
        weekend = min(max(v["weekend"], 0.0), 1.0)

        def weekly(t: NDArray[np.float64]) -> NDArray[np.float64]:
            weekday = np.mod(np.floor(t / DAY_S) + v["start_day"], 7)
            level = np.where(weekday >= 5, weekend, 1.0)
            return rate * level * _working_day(np.mod(t, DAY_S)) / day_mean

        return weekly, rate / day_mean
    if kind == "bursts":
        def bursts(t: NDArray[np.float64]) -> NDArray[np.float64]:
            inside = np.mod(t, v["every"]) >= v["every"] - v["length"]
            return np.where(inside, v["burst_rate"], rate)

        return bursts, max(rate, v["burst_rate"])

    def flat(t: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.full_like(t, rate)

    return flat, rate


def _working_day(seconds: NDArray[np.float64]) -> NDArray[np.float64]:
    """A working day's load shape, 1 at its 16:00 peak and NIGHT_SHARE at 04:00."""
    rise = (1.0 - np.cos(2.0 * math.pi * (seconds / 3600.0 - 4.0) / 24.0)) / 2.0
    return NIGHT_SHARE + (1.0 - NIGHT_SHARE) * rise ** 1.5


def _lengths(rng: np.random.Generator, mean: float | NDArray[np.float64], count: int,
             kind: str) -> NDArray[np.int64]:
    """`count` lengths of mean `mean` (one per request where it drifts)."""
    if kind == "fixed":
        means: NDArray[np.float64] = np.broadcast_to(np.asarray(mean, dtype=np.float64), (count,))
        return np.maximum(np.rint(means), 1).astype(np.int64)
    return np.maximum(np.rint(rng.exponential(mean, count)), 1).astype(np.int64)


def _drifted_mean(start: float, end: float, times: NDArray[np.float64], drift: str,
                  values: dict[str, float]) -> float | NDArray[np.float64]:
    """Each request's mean length: `start` throughout, or drifting towards `end` (0: no target, no drift)."""
    if drift == "none" or end <= 0:
        return start
    if drift == "linear":
        weight = times / values["duration"]
    else:
        weight = (1.0 - np.cos(2.0 * math.pi * times / values["period"])) / 2.0
    return start + (end - start) * weight


def generate_synthetic_trace(text: str) -> Trace:
    """A trace from a `synthetic:KIND:key=value:...` spec; the same spec always gives the same trace."""
    kind, values, lengths, drift = _parse(text)
    rng = np.random.default_rng(int(values["seed"]))
    duration = values["duration"]
    rate_at, peak = _rate_function(kind, values)
    expected = int(peak * duration)
    if expected > 20_000_000:
        raise InvalidSpecError(f"--trace {text!r}: {expected} requests is too many to simulate")
    count = rng.poisson(peak * duration) if peak > 0 else 0
    times = np.sort(rng.uniform(0.0, duration, count))
    if count and kind != "poisson":
        times = times[rng.uniform(0.0, peak, count) < rate_at(times)]
    n = times.size
    inputs = _lengths(rng, _drifted_mean(values["input"], values["input_to"], times, drift, values), n, lengths)
    outputs = _lengths(rng, _drifted_mean(values["output"], values["output_to"], times, drift, values), n, lengths)
    groups = int(values["prefixes"])
    if groups <= 0:
        return Trace(name=text, arrival_s=times, input_tokens=inputs, output_tokens=outputs, duration_s=duration)
    # Zipf-like popularity: group k is drawn in proportion to 1/(k+1).
    popularity = 1.0 / np.arange(1, groups + 1)
    group = rng.choice(groups, size=n, p=popularity / popularity.sum()).astype(np.int64)
    shared = np.full(n, max(int(values["prefix"]), 1), dtype=np.int64)
    return Trace(name=text, arrival_s=times, input_tokens=inputs + shared, output_tokens=outputs,
                 duration_s=duration, prefix_group=group, prefix_tokens=shared)
