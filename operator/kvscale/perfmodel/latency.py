"""TTFT and TPOT distributions of one replica under load (pure numpy, broadcasting).

TTFT: a prompt waits for the prompt work ahead of it (chunked prefill serves prompts oldest first
out of the token budget the decodes leave: an M/G/1 queue on prompt tokens, Pollaczek-Khinchine
mean, exponential tail with an atom at zero), then runs its own chunks. Prompt lengths are a
lognormal matched to the mean and the SLO-percentile prompt, so the TTFT percentile is that of
wait + own prefill over the length mix, not of either alone.

TPOT: a request's inter-token time averages its steps; the prompts queued behind it during its TTFT
and those arriving while it decodes (Poisson) each add their prefill time to the steps they share
with it, and those arriving in another prompt's steps queue behind that one. Short requests, which
see few prompts but divide them by few tokens, set the high percentiles.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kvscale.perfmodel.distributions import (
    BOTH_ENDS_EDGES,
    gamma_sf,
    lognormal_strata_by_scv,
    normal_sf,
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
                    prompt_rate: Array, queued_window_s: Array, prompt_extra_s: Array, prompt_weights: Array,
                    mean_output_tokens: float, output_scv: float | None, quantile: float,
                    output_percentiles: tuple[tuple[float, float], ...] = (), batch_sd_s: ArrayLike = 0.0,
                    batch_relaxation_s: ArrayLike = 1.0) -> Array:
    """The `quantile` of per-request TPOT over output lengths (output_interval_strata).

    A request of n intervals with TPOT t lives n·t seconds; other prompts' chunks in its steps add their
    extra step time (`prompt_extra_s`, per prompt stratum on the last axis), and each other request
    decoding beside it adds `decode_slope_s` to every step they share. Three kinds of prompts reach its
    steps (docs/accuracy.md, "The TPOT tail's three kinds of prompts"):
    - queued: those that arrived during its TTFT (`queued_window_s`, the engine's part of it) wait behind
      it; its last prefill step's leftover room takes a part (uniform over a chunk), the rest runs in its
      decode steps, at most n chunks;
    - early: those arriving while it decodes undisturbed (n decode steps) start at the next step: of k
      chunk-steps arriving at a uniform step, k - k²/2n fall inside;
    - late: at TPOT t its life holds n·(t - decode) seconds of prompt steps, and the prompts arriving in
      them queue behind the one in progress (its residual chunks, E[k²]/2E[k]), so fewer of theirs fit.
    Late prompts exist only once a queued or early one disturbs the request, so P(TPOT > t) is
    P(a first prompt) x P(S > n·(t - base) | one), S's conditional mean and variance matched by a gamma;
    the decode base is what remains of the mean step without the others.
    The batch a request finds when it starts decoding varies too (an open loop's, not a closed loop's):
    its step time has sd `batch_sd_s` and relaxes in `batch_relaxation_s`, so over a life of L seconds
    the part still there averages (1 - exp(-L/relaxation)) / (L/relaxation) of it; that normal term is
    added to S. It sets the spread of long requests' TPOT, which prompts barely move.
    """
    intervals, weights = output_interval_strata(mean_output_tokens, output_scv, output_percentiles)
    n = intervals[:, None]  # (lengths, prompts)
    decode = np.asarray(decode_s, dtype=np.float64)[..., None]
    slope = np.asarray(decode_slope_s, dtype=np.float64)[..., None]
    step = np.asarray(mean_step_s, dtype=np.float64)[..., None]
    rate = np.asarray(prompt_rate, dtype=np.float64)[..., None]
    window = np.asarray(queued_window_s, dtype=np.float64)[..., None]
    per_chunk = np.maximum(np.asarray(full_step_s, dtype=np.float64) - np.asarray(decode_s, dtype=np.float64),
                           1e-12)[..., None, None]
    extra = np.asarray(prompt_extra_s, dtype=np.float64)[..., None, :]
    chunks = extra / per_chunk
    w = np.asarray(prompt_weights, dtype=np.float64)
    early = _inside_window(extra, chunks, per_chunk, n)
    leftover = np.where(chunks <= 1.0, chunks - chunks**2 / 2.0, 0.5) * per_chunk
    queued = np.minimum(np.maximum(extra - leftover, 0.0), per_chunk * n)
    mean_chunks = np.sum(chunks * w, axis=-1, keepdims=True)
    residual = np.sum(chunks**2 * w, axis=-1, keepdims=True) / (2.0 * np.maximum(mean_chunks, 1e-12))
    late = np.where(n > residual, _inside_window(extra, chunks, per_chunk, np.maximum(n - residual, 1e-9)), 0.0)
    # The others' decode cost while in the request's life (taken at the mean step: the batch term is
    # second order), per arrival inside it and per one queued before: steps shared x the slope.
    residences = intervals * step  # (..., lengths): how long the others decode
    joins_inside, joins_before = _overlap_moments(residences[..., None, :], residences[..., :, None])
    batch_inside = slope * np.sum(joins_inside * weights, axis=-1) / step
    batch_before = slope * np.sum(joins_before * weights, axis=-1) / step
    early_m = _size_moments(early, w, batch_inside)
    queued_m = _size_moments(queued, w, batch_before)
    late_m = _size_moments(late, w, batch_inside)
    early_count = rate * intervals * decode
    queued_count = rate * window
    first_count = np.maximum(early_count + queued_count, 1e-300)
    first_mean = (early_count * early_m[0] + queued_count * queued_m[0]) / first_count
    first_second = (early_count * early_m[1] + queued_count * queued_m[1]) / first_count
    disturbed = np.maximum(-np.expm1(-first_count), 1e-300)  # P(at least one first prompt)
    given_mean = first_count * first_mean / disturbed
    given_var = (first_count * first_second + (first_count * first_mean) ** 2) / disturbed - given_mean**2

    relaxations = residences / np.maximum(np.asarray(batch_relaxation_s, dtype=np.float64), 1e-9)[..., None]
    still_there = np.where(relaxations > 1e-9, -np.expm1(-relaxations) / np.maximum(relaxations, 1e-9), 1.0)
    spread = np.asarray(batch_sd_s, dtype=np.float64)[..., None] * intervals * still_there  # (..., lengths)

    def survival(t: Array) -> Array:
        tt = t[..., None]
        late_count = rate * intervals * np.maximum(tt - decode, 0.0)
        base = decode - ((early_count + late_count) * batch_inside + queued_count * batch_before) / intervals
        x = intervals * (tt - base)
        mean = given_mean + late_count * late_m[0]
        var = np.maximum(given_var + late_count * late_m[1], 1e-18 * np.maximum(mean, 1e-300) ** 2)
        undisturbed = np.where(spread > 0.0, normal_sf(x / np.where(spread > 0.0, spread, 1.0)),
                               np.where(x < 0.0, 1.0, 0.0))
        disturbed_sf = gamma_sf(x, mean, var + spread**2)
        return np.asarray(np.sum(((1.0 - disturbed) * undisturbed + disturbed * disturbed_sf) * weights, axis=-1))

    ceiling = np.maximum(np.asarray(full_step_s, dtype=np.float64), decode[..., 0]) * 1.1
    return quantile_by_bisection(survival, quantile, np.asarray(decode_s, dtype=np.float64) * 0.5, ceiling)


def _inside_window(extra: Array, chunks: Array, per_chunk: Array, steps: Array) -> Array:
    """Of a prompt of `chunks` chunk-steps (`extra` seconds) that starts at a uniform step of a window of
    `steps` steps, the time that falls inside it: k - k²/2n chunk-steps, or half the window when longer."""
    return np.where(chunks <= steps, extra * (1.0 - chunks / (2.0 * steps)), per_chunk * steps / 2.0)


def _size_moments(sizes: Array, prompt_weights: Array, batch_s: Array) -> tuple[Array, Array]:
    """(mean, second moment) over prompt strata of one prompt's time in the request's steps plus the
    decode cost `batch_s` it adds while it decodes beside it."""
    mean = np.sum(sizes * prompt_weights, axis=-1)
    second = np.sum(sizes**2 * prompt_weights, axis=-1)
    return mean + batch_s, second + 2.0 * mean * batch_s + batch_s**2
