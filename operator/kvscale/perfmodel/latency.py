"""TTFT and TPOT distributions of one replica under load (pure numpy, broadcasting).

TTFT: a prompt waits for the prompt work ahead of it (chunked prefill serves prompts oldest first
out of the token budget the decodes leave: an M/G/1 queue on prompt tokens, Pollaczek-Khinchine
mean, exponential tail with an atom at zero), then runs its own chunks. Prompt lengths are a
lognormal matched to the mean and the SLO-percentile prompt, so the TTFT percentile is that of
wait + own prefill over the length mix, not of either alone.

TPOT: a request's inter-token time averages its steps; the prompts that arrive while it decodes
(Poisson, a number proportional to its length) each add their prefill time to the steps they
share with it. So a request's extra time is compound Poisson in its length; short requests,
which see few prompts but divide them by few tokens, set the high percentiles.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from kvscale.perfmodel.distributions import (
    BOTH_ENDS_EDGES,
    compound_poisson_sf,
    lognormal_strata_by_scv,
    percentile_strata,
    quantile_by_bisection,
    strata_midpoints,
)

Array = NDArray[np.float64]
_MAX_INTERVALS = 1 << 16


@lru_cache(maxsize=256)
def output_interval_strata(mean_output_tokens: float, output_scv: float | None,
                           percentiles: tuple[tuple[float, float], ...] = ()) -> tuple[Array, Array]:
    """(inter-token intervals, probabilities) of requests' output lengths: through the known
    percentiles; else a lognormal of the mean and squared coefficient of variation; else geometric
    with the mean (the maximum-entropy guess). Requests of one token have no inter-token time (they
    count as one interval, as short as any)."""
    if percentiles:
        lengths, weights = percentile_strata(percentiles, BOTH_ENDS_EDGES)
        return np.maximum(np.round(lengths) - 1.0, 1.0), weights
    if output_scv is not None:
        lengths, weights = lognormal_strata_by_scv(mean_output_tokens, output_scv, BOTH_ENDS_EDGES)
        return np.maximum(np.round(lengths) - 1.0, 1.0), weights
    p = 1.0 / max(mean_output_tokens, 1.0 + 1e-9)
    mids, weights = strata_midpoints(BOTH_ENDS_EDGES)
    if p >= 1.0:
        return np.ones_like(mids), weights
    # Conditional on length >= 2, length - 1 is again geometric on 1, 2, ... with the same p.
    return np.clip(np.ceil(np.log1p(-mids) / np.log1p(-p)), 1, _MAX_INTERVALS), weights


def mg1_wait(rate: Array, service_mean_s: Array, service_second_moment_s2: Array) -> tuple[Array, Array]:
    """(utilisation, mean wait in seconds) of an M/G/1 queue; the wait is inf at or past saturation."""
    rho = rate * service_mean_s
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = rate * service_second_moment_s2 / (2.0 * (1.0 - rho))
    return rho, np.where(rho >= 1.0, np.inf, np.maximum(wait, 0.0))


def _wait_survival(t: Array, wait_probability: Array, decay: Array, shift_s: Array) -> Array:
    """P(W > t): an atom at 0; given a wait, `shift_s` for sure (a backlogged prompt ends with its
    step, which the prompts behind it fill), then an exponential tail of rate `decay`."""
    p = np.clip(wait_probability, 0.0, 1.0)
    beyond = np.maximum(t - shift_s, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        tail = np.where(decay > 0.0, p * np.exp(-beyond * decay), 0.0)
    return np.where(t < 0.0, 1.0, np.where(t < shift_s, p, tail))


def ttft_quantile_s(own_prefill_s: Array, weights: Array, wait_probability: Array, tail_decay: Array,
                    shift_s: Array, fixed_s: Array, quantile: float) -> Array:
    """The `quantile` of TTFT = fixed + wait + own prefill, over prompt strata on the last axis of
    `own_prefill_s` (of probabilities `weights`); the other arrays broadcast against its leading axes.
    The wait is 0 or, with `wait_probability`, `shift_s` plus an exponential of rate `tail_decay`."""
    p = np.asarray(wait_probability, dtype=np.float64)[..., None]
    shift = np.asarray(shift_s, dtype=np.float64)[..., None]
    decay = np.asarray(tail_decay, dtype=np.float64)[..., None]
    finite = (decay[..., 0] > 0.0) | (p[..., 0] <= 0.0)

    def survival(t: Array) -> Array:
        return np.asarray(np.sum(_wait_survival(t[..., None] - own_prefill_s, p, decay, shift)
                                 * weights, axis=-1))

    longest = np.max(own_prefill_s, axis=-1)
    tail_length = np.where(decay[..., 0] > 0, np.log(1.0 / (1.0 - quantile)) / np.maximum(decay[..., 0], 1e-300), 0.0)
    high = longest + shift[..., 0] + tail_length + 1e-9
    q = quantile_by_bisection(survival, quantile, np.zeros_like(high), high)
    return np.where(finite, q + fixed_s, np.inf)


def _overlap_moments(residence_s: Array, window_s: Array) -> tuple[Array, Array]:
    """For another request decoding for `residence_s` that joins the batch at a uniform moment of a
    window of `window_s`: (mean steps-time it spends in the window, the same for one joining just
    before the window starts)."""
    longer = residence_s >= window_s
    inside = np.where(longer, window_s / 2.0, residence_s - residence_s**2 / (2.0 * window_s))
    return inside, np.minimum(residence_s, window_s)


def tpot_quantile_s(decode_s: Array, decode_slope_s: Array, mean_step_s: Array, full_step_s: Array,
                    prompt_rate: Array, lead_s: Array, prompt_extra_s: Array, prompt_weights: Array,
                    mean_output_tokens: float, output_scv: float | None, quantile: float,
                    output_percentiles: tuple[tuple[float, float], ...] = ()) -> Array:
    """The `quantile` of per-request TPOT over output lengths (output_interval_strata).

    A request of n intervals with TPOT t lives n·t seconds; the requests arriving meanwhile (and
    those that arrived during its own TTFT, `lead_s`, queued behind it and prefilled in its first
    steps, which is what makes short requests' TPOT high) each add their prompt's extra step time
    (`prompt_extra_s`, per prompt stratum on the last axis) and, while they decode beside it,
    `decode_slope_s` to each step. So P(TPOT > t) = P(S > n·(t - base)), S compound Poisson with
    mean count rate·(n·t + lead): a slow request's longer life takes in more arrivals, which is what
    stretches the tail; the decode base is what remains of the mean step without them. A step carries
    at most one full chunk (`full_step_s`), so a request of n steps takes in at most n chunks of a
    long prompt, and of one arriving mid-life only the chunks before its end.
    """
    intervals, weights = output_interval_strata(mean_output_tokens, output_scv, output_percentiles)
    n = intervals[:, None]  # (lengths, prompts)
    decode = np.asarray(decode_s, dtype=np.float64)[..., None]
    slope = np.asarray(decode_slope_s, dtype=np.float64)[..., None]
    step = np.asarray(mean_step_s, dtype=np.float64)[..., None]
    rate = np.asarray(prompt_rate, dtype=np.float64)[..., None]
    lead = np.asarray(lead_s, dtype=np.float64)[..., None]
    per_chunk = np.maximum(np.asarray(full_step_s, dtype=np.float64) - np.asarray(decode_s, dtype=np.float64),
                           1e-12)[..., None, None]
    extra = np.asarray(prompt_extra_s, dtype=np.float64)[..., None, :]
    chunks = extra / per_chunk
    # Arriving at a uniform moment of the request's life: k - k²/2n of its k chunk-steps fall inside.
    inside = np.where(chunks <= n, extra * (1.0 - chunks / (2.0 * n)), per_chunk * n / 2.0)
    queued = np.minimum(extra, per_chunk * n)
    w = np.asarray(prompt_weights, dtype=np.float64)
    inside_mean, inside_second = np.sum(inside * w, axis=-1), np.sum(inside**2 * w, axis=-1)
    queued_mean, queued_second = np.sum(queued * w, axis=-1), np.sum(queued**2 * w, axis=-1)
    # The others' decode cost while in the request's life (taken at the mean step: the batch term is
    # second order), per arrival inside it and per one queued before: steps shared x the slope.
    residences = intervals * step  # (..., lengths): how long the others decode
    joins_inside, joins_before = _overlap_moments(residences[..., None, :], residences[..., :, None])
    batch_inside = slope * np.sum(joins_inside * weights, axis=-1) / step
    batch_before = slope * np.sum(joins_before * weights, axis=-1) / step

    def survival(t: Array) -> Array:
        tt = t[..., None]
        during, before = rate * intervals * tt, rate * lead
        events = np.maximum(during + before, 1e-300)
        size_inside, size_before = inside_mean + batch_inside, queued_mean + batch_before
        mean_e = (during * size_inside + before * size_before) / events
        second_e = (during * (inside_second + 2.0 * inside_mean * batch_inside + batch_inside**2)
                    + before * (queued_second + 2.0 * queued_mean * batch_before + batch_before**2)) / events
        base = decode - (during * batch_inside + before * batch_before) / intervals
        return np.asarray(np.sum(compound_poisson_sf(intervals * (tt - base), events, mean_e, second_e) * weights,
                                 axis=-1))

    ceiling = np.maximum(np.asarray(full_step_s, dtype=np.float64), decode[..., 0]) * 1.1
    return quantile_by_bisection(survival, quantile, np.asarray(decode_s, dtype=np.float64) * 0.5, ceiling)
