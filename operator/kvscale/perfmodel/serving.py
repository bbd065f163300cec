"""Continuous batching at a load: TPOT and TTFT percentiles, throughput, and goodput under SLOs.

A replica keeps up to `max_num_seqs` sequences running. Every step decodes one token for each and,
with chunked prefill, spends the rest of the token budget on waiting prompts; so prompts slow the
decodes they share steps with. Arrivals queue for a free slot (M/M/c over the slots) and then for
prefill capacity (G/G/1 over the token budget). All functions broadcast over numpy arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kvscale.perfmodel.queueing import gg1_wait_quantile_s, mmc_wait_quantile_s
from kvscale.perfmodel.replica import ReplicaModel
from kvscale.perfmodel.tails import chunk_share_quantile

Array = NDArray[np.float64]
_FIXED_POINT_ITERATIONS = 40
_FIXED_POINT_TOLERANCE = 1e-2  # sequences
_BISECTION_ITERATIONS = 24


@dataclass(frozen=True)
class RequestShape:
    """Mean request: prompt and output lengths in tokens; optionally the prompt length at the SLO
    percentile, whose own prefill sets the TTFT tail at low load (vLLM's request_prompt_tokens)."""

    input_tokens: float
    output_tokens: float
    input_tokens_tail: float | None = None
    prefix_cache_hit_rate: float = 0.0  # share of prompt tokens whose KV the prefix cache already holds

    def prompt_length_scv(self, quantile: float) -> float:
        """Squared coefficient of variation of prompt lengths, matched to the percentile prompt: 0 when
        it is the mean (all prompts alike), 1 when it sits where an exponential's would (-ln(1-q) x
        the mean), and no more (a heavier tail is the floor's business, not the queue's)."""
        ratio = self.tail_input_tokens / max(self.input_tokens, 1.0)
        exponential = -math.log(1.0 - quantile)
        return min(1.0, ((ratio - 1.0) / (exponential - 1.0)) ** 2) if exponential > 1.0 else 0.0

    @classmethod
    def with_assumed_tail(cls, input_tokens: float, output_tokens: float, quantile: float,
                          max_prompt_tokens: float | None = None) -> RequestShape:
        """A shape known only by its means: prompt lengths taken as exponential (the maximum-entropy
        guess, as for output lengths in kvscale.perfmodel.tails; both Azure traces are close to it,
        squared CV 0.92), so the percentile prompt is -ln(1 - q) x the mean, within the longest prompt."""
        tail = input_tokens * -math.log(max(1.0 - quantile, 1e-9))
        if max_prompt_tokens is not None:
            tail = min(tail, max(max_prompt_tokens, input_tokens))
        return cls(input_tokens, output_tokens, max(tail, input_tokens))

    @property
    def tail_input_tokens(self) -> float:
        """The prompt length the TTFT percentile is computed for: the tail, never below the mean."""
        return max(self.input_tokens, self.input_tokens_tail or 0.0)

    @property
    def mean_context_tokens(self) -> float:
        """Mean cache length of a decoding sequence (halfway through its output)."""
        return self.input_tokens + self.output_tokens / 2.0

    @property
    def decode_steps(self) -> float:
        return max(self.output_tokens - 1.0, 0.0)


@dataclass(frozen=True)
class LoadEstimate:
    """Predicted behaviour of one replica at a load (arrays broadcast over the inputs)."""

    running_seqs: Array  # mean sequences in the running batch
    request_rate: Array  # completed requests/s
    output_tokens_per_s: Array
    tpot_mean_s: Array
    tpot_quantile_s: Array
    ttft_mean_s: Array
    ttft_quantile_s: Array
    decode_step_s: Array  # a step without prefill work
    chunk_step_s: Array  # a step carrying a full prefill chunk
    prefill_utilisation: Array  # share of the token budget spent on prompts
    stable: NDArray[np.bool_]


def _step_times(model: ReplicaModel, shape: RequestShape, running: Array, chunk_tokens: Array,
                ) -> tuple[Array, Array]:
    """(decode-only step, step that also carries `chunk_tokens` prompt tokens) at `running` sequences."""
    ctx = shape.mean_context_tokens
    decode = model.step_s(running, ctx)
    # A chunk holds slices of prompts; each prompt token attends to about half its prompt.
    chunk_step = model.step_s(running, ctx, chunk_tokens, chunk_tokens * shape.input_tokens / 2.0,
                              chunk_tokens / shape.input_tokens)
    return decode, chunk_step


def _chunk_room(model: ReplicaModel, running: Array) -> Array:
    """Prompt tokens a step can still take after one decode token per running sequence."""
    return np.maximum(float(model.setup.token_budget) - running, 1.0)


def _mean_step(model: ReplicaModel, shape: RequestShape, running: Array,
               ) -> tuple[Array, Array, Array, Array, Array]:
    """Mean step time with prompts amortised over outputs: (mean, decode, chunk, fraction, chunk size).

    Steps carrying prompt work take a whole prompt, or several when prompts arrive faster than one per
    step, up to the room the token budget leaves.
    """
    room = _chunk_room(model, running)
    prompt_tokens_per_step = running * shape.input_tokens / max(shape.output_tokens, 1.0)
    chunk = np.minimum(room, np.maximum(shape.input_tokens, prompt_tokens_per_step))
    decode, chunk_step = _step_times(model, shape, running, chunk)
    fraction = np.clip(prompt_tokens_per_step / chunk, 0.0, 1.0)
    mean = fraction * chunk_step + (1.0 - fraction) * decode
    return mean, decode, chunk_step, fraction, chunk


def _prefill_capacity_rate(model: ReplicaModel, shape: RequestShape, running: Array) -> Array:
    """Prompts per second the token budget admits with every step's spare room full of prompt tokens."""
    room = _chunk_room(model, running)
    _, full_step = _step_times(model, shape, running, room)
    return room / (shape.input_tokens * full_step)


def _own_prefill_s(shape: RequestShape, chunk: Array, chunk_step: Array) -> Array:
    """A prompt's own prefill: its chunks, at least one step; the last partial chunk is charged in
    proportion, which keeps latency continuous as the batch takes room from the token budget."""
    return np.maximum(1.0, shape.input_tokens / chunk) * chunk_step


def _tail_prefill_s(shape: RequestShape, chunk: Array, chunk_step: Array) -> Array:
    """A percentile-length prompt's own prefill: the chunks it needs at the steps' chunk size. It adds
    to the queueing delay instead of scaling it: a long prompt is slow at any load."""
    return np.maximum(1.0, shape.tail_input_tokens / chunk) * chunk_step


def _tpot_quantile(decode: Array, chunk_step: Array, fraction: Array, shape: RequestShape,
                   quantile: float) -> Array:
    """A request's TPOT averages its steps; its tail comes from how many carried a prefill chunk,
    which for short requests is a large share (kvscale.perfmodel.tails)."""
    share = chunk_share_quantile(fraction, shape.output_tokens, quantile)
    return decode + share * (chunk_step - decode)


def _closed_loop_rates(model: ReplicaModel, shape: RequestShape, running: Array) -> tuple[Array, Array]:
    """(decode-limited, prefill-limited) request rates with `running` sequences in the batch."""
    mean, _, chunk_step, _, chunk = _mean_step(model, shape, running)
    decode_limited = running / (_own_prefill_s(shape, chunk, chunk_step) + shape.decode_steps * mean)
    return decode_limited, _prefill_capacity_rate(model, shape, running)


def _sustained_running(model: ReplicaModel, shape: RequestShape, concurrency: Array) -> Array:
    """Sequences actually decoding at a concurrency: when prompts outrun the token budget the batch
    settles where prefill supply meets decode demand and further requests wait instead."""
    decode_limited, prefill_limited = _closed_loop_rates(model, shape, concurrency)
    prefill_bound = decode_limited > prefill_limited
    if not np.any(prefill_bound):
        return concurrency
    # Bisect over a range that does not depend on the offered concurrency, so every prefill-bound
    # concurrency settles on the very same batch.
    low = np.ones_like(concurrency)
    high = np.full_like(concurrency, float(model.setup.token_budget))
    for _ in range(_BISECTION_ITERATIONS):  # decode rate rises, prefill rate falls with n
        mid = (low + high) / 2.0
        d, p = _closed_loop_rates(model, shape, mid)
        below = d < p
        low, high = np.where(below, mid, low), np.where(below, high, mid)
    return np.where(prefill_bound, np.minimum(low, concurrency), concurrency)


def estimate_at_concurrency(model: ReplicaModel, shape: RequestShape, concurrency: ArrayLike,
                            quantile: float = 0.95) -> LoadEstimate:
    """Closed loop: `concurrency` requests always in flight (benchmark_serving --max-concurrency)."""
    offered = np.maximum(np.asarray(concurrency, dtype=np.float64), 1.0)
    running = _sustained_running(model, shape, offered)
    mean, decode, chunk_step, fraction, chunk = _mean_step(model, shape, running)
    decode_limited, prefill_limited = _closed_loop_rates(model, shape, running)
    rate = np.minimum(decode_limited, prefill_limited)
    in_batch_s = _own_prefill_s(shape, chunk, chunk_step)
    # Requests beyond the sustained batch wait for it: Little's law over everything offered.
    ttft = offered / rate - shape.decode_steps * mean
    ttft = np.maximum(ttft, in_batch_s)
    tpot_q = _tpot_quantile(decode, chunk_step, fraction, shape, quantile)
    return LoadEstimate(
        running_seqs=running,
        request_rate=rate,
        output_tokens_per_s=rate * shape.output_tokens,
        tpot_mean_s=mean,
        tpot_quantile_s=tpot_q,
        ttft_mean_s=ttft,
        ttft_quantile_s=ttft + _tail_prefill_s(shape, chunk, chunk_step) - in_batch_s,
        decode_step_s=decode,
        chunk_step_s=chunk_step,
        prefill_utilisation=fraction,
        stable=np.ones_like(running, dtype=bool),
    )


@dataclass(frozen=True)
class ObservedLoadEstimate:
    """What the model predicts for a replica seen running `running` sequences while taking `rate` new
    requests/s: the mean time per output token and a prompt's own prefill time (seconds)."""

    tpot_mean_s: float
    prefill_s: float
    decode_share: float  # of the mean inter-token time, the part that is decode work, not prompt chunks


def estimate_at_observed_load(model: ReplicaModel, shape: RequestShape, running: float, rate: float,
                              ) -> ObservedLoadEstimate:
    """The model at an observed batch and arrival rate, neither derived from the other.

    For calibration: under overload or bursts the running batch is not what Little's law gives for
    the finished rate, and prompt chunks, which stall every decode step they share, arrive at the
    observed rate, not at the closed loop's running x input / output per step.
    """
    batch = np.array([max(running, 1.0)], dtype=np.float64)
    room = _chunk_room(model, batch)
    decode = model.step_s(batch, shape.mean_context_tokens)
    mean = decode
    chunk = np.minimum(room, shape.input_tokens)
    chunk_step = decode
    for _ in range(_FIXED_POINT_ITERATIONS):  # prompt tokens per step = rate x input x step time
        per_step = rate * shape.input_tokens * mean
        chunk = np.minimum(room, np.maximum(shape.input_tokens, per_step))
        _, chunk_step = _step_times(model, shape, batch, chunk)
        fraction = np.clip(per_step / chunk, 0.0, 1.0)
        updated = fraction * chunk_step + (1.0 - fraction) * decode
        converged = float(np.max(np.abs(updated - mean))) < 1e-6 * float(np.max(mean))
        mean = updated
        if converged:
            break
    prefill = _own_prefill_s(shape, chunk, chunk_step)
    return ObservedLoadEstimate(tpot_mean_s=float(mean[0]), prefill_s=float(prefill[0]),
                                decode_share=float(decode[0] / mean[0]))


def concurrency_limit(shape: RequestShape, max_num_seqs: ArrayLike, kv_cache_tokens: ArrayLike,
                      oversubscribe: bool = False) -> Array:
    """Sequences a replica can run at once: the batch cap or what the KV cache holds.

    By default every sequence is budgeted its full length (prompt + output), so the cache never runs
    out and nothing is preempted: what an SLO plan needs. `oversubscribe` budgets the mean occupancy
    (prompt + half the output) as vLLM's on-demand allocation does when run flat out; it then
    preempts when sequences grow together, which throughput benchmarks tolerate and SLOs do not.
    """
    per_seq = shape.mean_context_tokens if oversubscribe else shape.input_tokens + shape.output_tokens
    by_cache = np.floor(np.asarray(kv_cache_tokens, dtype=np.float64) / per_seq)
    return np.maximum(np.minimum(np.asarray(max_num_seqs, dtype=np.float64), by_cache), 0.0)


def max_request_rate(model: ReplicaModel, shape: RequestShape, slots: ArrayLike) -> Array:
    """Highest sustainable arrival rate with `slots` sequences running (requests/s)."""
    return estimate_at_concurrency(model, shape, slots).request_rate


def estimate_at_rate(model: ReplicaModel, shape: RequestShape, request_rate: ArrayLike, slots: ArrayLike,
                     quantile: float = 0.95) -> LoadEstimate:
    """Open loop: Poisson arrivals at `request_rate` into a replica with `slots` concurrent sequences."""
    rate = np.asarray(request_rate, dtype=np.float64)
    cap = np.maximum(np.asarray(slots, dtype=np.float64), 1.0)
    rate, cap = np.broadcast_arrays(rate, cap)
    full = estimate_at_concurrency(model, shape, cap, quantile)
    service_full_s = cap / full.request_rate  # one slot's occupancy when every slot is busy

    running = np.minimum(np.maximum(rate * service_full_s, 1.0), cap)
    for _ in range(_FIXED_POINT_ITERATIONS):  # Little's law: running = rate × time in the batch
        mean, decode, chunk_step, fraction, chunk = _mean_step(model, shape, running)
        in_batch_s = _own_prefill_s(shape, chunk, chunk_step) + shape.decode_steps * mean
        updated = np.minimum(np.maximum(rate * in_batch_s, 1.0), cap)
        converged = np.max(np.abs(updated - running), initial=0.0) < _FIXED_POINT_TOLERANCE
        running = updated
        if converged:
            break
    mean, decode, chunk_step, fraction, chunk = _mean_step(model, shape, running)
    own_prefill = _own_prefill_s(shape, chunk, chunk_step)

    stable = rate < full.request_rate
    slot_wait = mmc_wait_quantile_s(cap, rate, service_full_s, quantile)
    prefill_rho = rate / _prefill_capacity_rate(model, shape, running)
    # Poisson arrivals; prefill service varies with prompt length (its squared CV matched to the
    # percentile prompt); the rest of the spread is learned online as a tail factor (calibration).
    prefill_wait = gg1_wait_quantile_s(prefill_rho, own_prefill, quantile,
                                       service_scv=shape.prompt_length_scv(quantile))
    alignment = mean / 2.0  # an arrival lands mid-step
    # The percentile TTFT is a long prompt prefilled without waiting, or a typical one after the
    # percentile wait, whichever is longer: the two rarely coincide, and a sum of percentiles would
    # leave queueing almost no budget wherever long prompts alone come near the SLO.
    tail_prefill = _tail_prefill_s(shape, chunk, chunk_step)
    ttft_q = np.where(stable, np.maximum(tail_prefill, own_prefill + slot_wait + prefill_wait) + alignment, np.inf)
    ttft_mean = np.where(stable, own_prefill + alignment, np.inf)
    tpot_q = _tpot_quantile(decode, chunk_step, fraction, shape, quantile)
    served = np.minimum(rate, full.request_rate)
    return LoadEstimate(
        running_seqs=running,
        request_rate=served,
        output_tokens_per_s=served * shape.output_tokens,
        tpot_mean_s=mean,
        tpot_quantile_s=tpot_q,
        ttft_mean_s=ttft_mean,
        ttft_quantile_s=ttft_q,
        decode_step_s=decode,
        chunk_step_s=chunk_step,
        prefill_utilisation=fraction,
        stable=stable,
    )


@dataclass(frozen=True)
class Goodput:
    """Highest arrival rate per replica that keeps both SLO percentiles, and what binds there."""

    request_rate: Array  # requests/s; 0 where even a trickle misses an SLO
    at_rate: LoadEstimate  # the estimate at that rate
    max_rate: Array  # saturation rate (slots full)
    binding: NDArray[np.str_]  # "tpot", "ttft" or "capacity"


_COARSE_GRID = np.concatenate(([1e-4], np.linspace(0.01, 0.999, 48)))
_FINE_STEPS = 24


def _last_compliant(rates: Array, estimate: LoadEstimate, ttft_slo_s: float, tpot_slo_s: float,
                    ) -> tuple[NDArray[np.bool_], NDArray[np.intp]]:
    """Per row: SLO compliance of each rate and the index of the first violation (len when none)."""
    ok = (estimate.ttft_quantile_s <= ttft_slo_s) & (estimate.tpot_quantile_s <= tpot_slo_s) & estimate.stable
    first_bad = np.where(ok.all(axis=1), ok.shape[1], np.argmin(ok, axis=1))
    return ok, first_bad


def estimate_goodput(model: ReplicaModel, shape: RequestShape, slots: ArrayLike, ttft_slo_s: float,
                     tpot_slo_s: float, quantile: float = 0.95) -> Goodput:
    """Goodput of a replica for each entry of `slots`: a coarse grid over fractions of saturation,
    then a fine grid between the last compliant and the first violating rate (latencies grow with load)."""
    cap = np.atleast_1d(np.maximum(np.asarray(slots, dtype=np.float64), 1.0))
    rows = np.arange(cap.size)
    saturation = max_request_rate(model, shape, cap)
    coarse = saturation[:, None] * _COARSE_GRID[None, :]
    ok, first_bad = _last_compliant(coarse, estimate_at_rate(model, shape, coarse, cap[:, None], quantile),
                                    ttft_slo_s, tpot_slo_s)
    feasible = first_bad > 0
    low = coarse[rows, np.maximum(first_bad - 1, 0)]
    high = np.where(first_bad < coarse.shape[1], coarse[rows, np.minimum(first_bad, coarse.shape[1] - 1)],
                    saturation * 0.9999)
    fine = low[:, None] + (high - low)[:, None] * np.linspace(0.0, 1.0, _FINE_STEPS)[None, :]
    fine_est = estimate_at_rate(model, shape, fine, cap[:, None], quantile)
    fine_ok, fine_bad = _last_compliant(fine, fine_est, ttft_slo_s, tpot_slo_s)
    best_rate = np.where(feasible, fine[rows, np.maximum(fine_bad - 1, 0)], 0.0)
    at = estimate_at_rate(model, shape, np.maximum(best_rate, 1e-9), cap, quantile)
    violation = (rows, np.minimum(fine_bad, _FINE_STEPS - 1))
    tpot_bad = fine_est.tpot_quantile_s[violation] > tpot_slo_s
    ttft_bad = fine_est.ttft_quantile_s[violation] > ttft_slo_s
    saturated = (first_bad >= coarse.shape[1]) & (fine_bad >= _FINE_STEPS)
    binding = np.where(saturated, "capacity", np.where(tpot_bad, "tpot", np.where(ttft_bad, "ttft", "capacity")))
    del ok, fine_ok
    return Goodput(request_rate=best_rate, at_rate=at, max_rate=saturation, binding=binding.astype(np.str_))
