"""Continuous batching at a load: TPOT and TTFT means and percentiles, throughput, goodput under SLOs.

A replica keeps up to `max_num_seqs` sequences running. Every step decodes one token for each and,
with chunked prefill, spends the rest of the token budget on waiting prompts, oldest first; so
prompts queue behind each other and slow the decodes they share steps with. Two ways of applying
load, as the benchmark tools do: a closed loop (`estimate_at_concurrency`: C clients, the next
request when one ends) and an open loop (`estimate_at_rate`: Poisson arrivals). Arrivals wait for a
free slot (M/M/c over the slots), then for the prompt work ahead of them (an M/G/1 queue on prompt
tokens; arrivals burstier than Poisson wait longer by Kingman's GI/G/1 factor); the latency
percentiles are taken over the mix of prompt and output lengths (kvscale.perfmodel.latency), and
prefix-cached prompt tokens are neither computed nor held twice.
The planner and the autoscaler's goodput both go through `estimate_goodput`, the open loop.
All functions broadcast over numpy arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kvscale.perfmodel.distributions import lognormal_strata, percentile_strata
from kvscale.perfmodel.latency import mg1_wait, output_interval_strata, tpot_quantile_s, ttft_quantile_s
from kvscale.perfmodel.queueing import mmc_wait_mean_s, mmc_wait_quantile_s
from kvscale.perfmodel.replica import ReplicaModel

Array = NDArray[np.float64]
_FIXED_POINT_ITERATIONS = 40
_FIXED_POINT_TOLERANCE = 1e-2  # sequences
_BISECTION_ITERATIONS = 24
# The damped closed-loop iteration stops at _FIXED_POINT_TOLERANCE; 12 rounds left prefill-bound batches
# unconverged (throughput 0.03% lower at 298 clients than at 270: hypothesis found it), 30 settle them.
_CLOSED_LOOP_ITERATIONS = 40


@dataclass(frozen=True)
class RequestShape:
    """Mean request: prompt and output lengths in tokens; optionally the prompt length at the SLO
    percentile, whose own prefill sets the TTFT tail at low load (vLLM's request_prompt_tokens)."""

    input_tokens: float
    output_tokens: float
    input_tokens_tail: float | None = None
    prefix_cache_hit_rate: float = 0.0  # share of prompt tokens whose KV the prefix cache already holds
    output_tokens_scv: float | None = None  # squared CV of output lengths; None: geometric (max entropy)
    # Known quantiles of the lengths, (probability, tokens): where given, they shape the length mixes
    # the latency percentiles are computed over, instead of the assumed families.
    input_percentiles: tuple[tuple[float, float], ...] = ()
    output_percentiles: tuple[tuple[float, float], ...] = ()
    tail_quantile: float = 0.95  # the percentile `input_tokens_tail` is at

    @classmethod
    def with_assumed_tail(cls, input_tokens: float, output_tokens: float, quantile: float,
                          max_prompt_tokens: float | None = None) -> RequestShape:
        """A shape known only by its means: prompt lengths taken as exponential (the maximum-entropy
        guess, as for output lengths in kvscale.perfmodel.latency; both Azure traces are close to it,
        squared CV 0.92), so the percentile prompt is -ln(1 - q) x the mean, within the longest prompt."""
        tail = input_tokens * -math.log(max(1.0 - quantile, 1e-9))
        if max_prompt_tokens is not None:
            tail = min(tail, max(max_prompt_tokens, input_tokens))
        return cls(input_tokens, output_tokens, max(tail, input_tokens), tail_quantile=quantile)

    def rescaled(self, input_tokens: float, output_tokens: float) -> RequestShape:
        """The same length mix around other means: the tail and the stated percentiles in proportion."""
        in_ratio = input_tokens / max(self.input_tokens, 1e-9)
        out_ratio = output_tokens / max(self.output_tokens, 1e-9)
        return replace(self, input_tokens=input_tokens, output_tokens=output_tokens,
                       input_tokens_tail=None if self.input_tokens_tail is None else self.input_tokens_tail * in_ratio,
                       input_percentiles=tuple((p, v * in_ratio) for p, v in self.input_percentiles),
                       output_percentiles=tuple((p, v * out_ratio) for p, v in self.output_percentiles))

    @property
    def tail_input_tokens(self) -> float:
        """The prompt length the TTFT percentile is computed for: the tail, never below the mean."""
        return max(self.input_tokens, self.input_tokens_tail or 0.0)

    @property
    def cached_input_tokens(self) -> float:
        """Prompt tokens whose KV the prefix cache serves: not computed, but attended and read."""
        return self.input_tokens * self.prefix_cache_hit_rate

    @property
    def computed_input_tokens(self) -> float:
        """Prompt tokens the engine computes (the rest come from the prefix cache); at least one."""
        return max(self.input_tokens - self.cached_input_tokens, 1.0)

    @property
    def mean_context_tokens(self) -> float:
        """Mean cache length of a decoding sequence over the steps it decodes in: its prompt and the
        outputs so far. A request of n outputs decodes in n steps, so over a spread of lengths the
        outputs held average E[n(n - 1)] / 2E[n] = ((1 + SCV) x mean - 1) / 2: a whole mean output for
        geometric lengths, half of it for fixed ones. The spread counts where it is stated (output
        percentiles or SCV); a shape known by its means keeps half the mean output."""
        return self.input_tokens + _decoded_outputs_held(self.output_tokens, self.output_tokens_scv,
                                                         self.output_percentiles)

    @property
    def decode_steps(self) -> float:
        return max(self.output_tokens - 1.0, 0.0)


@lru_cache(maxsize=512)
def _decoded_outputs_held(mean_output_tokens: float, output_scv: float | None,
                          output_percentiles: tuple[tuple[float, float], ...]) -> float:
    """Outputs a decoding sequence holds on average over its decode steps (RequestShape.mean_context_tokens)."""
    if output_scv is None and not output_percentiles:
        return mean_output_tokens / 2.0
    intervals, weights = output_interval_strata(mean_output_tokens, output_scv, output_percentiles)
    lengths = intervals + 1.0
    scv = float(np.dot(weights, lengths**2) / np.dot(weights, lengths) ** 2) - 1.0
    return max(((1.0 + scv) * mean_output_tokens - 1.0) / 2.0, 0.0)


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
    prefill_wait_mean_s: Array  # waiting for the prompt work ahead (and for a batch slot)


def _step_times(model: ReplicaModel, shape: RequestShape, running: Array, chunk_tokens: Array,
                ) -> tuple[Array, Array]:
    """(decode-only step, step that also carries `chunk_tokens` prompt tokens) at `running` sequences."""
    ctx = shape.mean_context_tokens
    decode = model.step_s(running, ctx)
    computed = shape.computed_input_tokens
    chunk_step = model.step_s(running, ctx, chunk_tokens, chunk_tokens * prompt_attention_tokens(shape),
                              chunk_tokens / computed)
    return decode, chunk_step


def _chunk_room(model: ReplicaModel, running: Array) -> Array:
    """Prompt tokens a step can still take after one decode token per running sequence."""
    return np.maximum(float(model.setup.token_budget) - running, 1.0)


def _mean_step(model: ReplicaModel, shape: RequestShape, running: Array,
               ) -> tuple[Array, Array, Array, Array, Array]:
    """Mean step time with prompts amortised over outputs: (mean, decode, chunk, fraction, chunk size).

    Steps carrying prompt work take a whole prompt, or several when prompts arrive faster than one per
    step, up to the room the token budget leaves. A step's time is convex in its prompt tokens (a few
    hide under the decode's weight reads, many are compute-bound), so over a mix of prompt lengths a
    prompt adds more than the mean prompt does (a tenth more for exponential lengths of 500 computed
    tokens beside 60 decodes: `_prompt_mix_excess`).
    """
    room = _chunk_room(model, running)
    computed = shape.computed_input_tokens
    prompt_tokens_per_step = running * computed / max(shape.output_tokens, 1.0)
    chunk = np.minimum(room, np.maximum(computed, prompt_tokens_per_step))
    decode, chunk_step = _step_times(model, shape, running, chunk)
    fraction = np.clip(prompt_tokens_per_step / chunk, 0.0, 1.0)
    excess = _prompt_mix_excess(model, shape, running, decode, room)
    # The excess is the mix's spread; a step that carries k prompts' tokens has 1/k of it.
    prompts_per_step = np.maximum(prompt_tokens_per_step / computed, 1.0)
    mean = decode + fraction * (chunk_step - decode) * (1.0 + excess / prompts_per_step)
    return mean, decode, chunk_step, fraction, chunk


def _prompt_mix_excess(model: ReplicaModel, shape: RequestShape, running: Array, decode_s: Array,
                       room: Array) -> Array:
    """How much more a prompt of the length mix adds to the steps it shares, on average, than the mean
    prompt does (a share; 0 for prompts of one length), each prompt in steps of its own."""
    weights, _, chunks, own_step = _prompt_strata_steps(model, shape, running, room, np.zeros_like(running))
    over_mix = np.sum(chunks * (own_step - decode_s[..., None]) * weights, axis=-1)
    alone = np.minimum(room, shape.computed_input_tokens)
    _, alone_step = _step_times(model, shape, running, alone)
    at_mean = np.maximum(1.0, shape.computed_input_tokens / alone) * (alone_step - decode_s)
    return np.where(at_mean > 0.0, np.maximum(over_mix / np.maximum(at_mean, 1e-300) - 1.0, 0.0), 0.0)


def _prompt_strata_steps(model: ReplicaModel, shape: RequestShape, running: Array, room: Array,
                         prompt_tokens_per_step: Array) -> tuple[Array, Array, Array, Array]:
    """Per prompt stratum (last axis): (probabilities, computed tokens, steps its chunks take, the time of
    each). A prompt's chunks are as large as itself or the prompt load per step, within the room."""
    lengths, weights = prompt_strata(shape)
    computed = computed_prompt_tokens(shape, lengths)
    own_chunk = np.minimum(room[..., None], np.maximum(computed, prompt_tokens_per_step[..., None]))
    own_step = model.step_s(running[..., None], shape.mean_context_tokens, own_chunk,
                            own_chunk * (lengths - computed / 2.0), own_chunk / computed)
    return weights, computed, np.maximum(1.0, computed / own_chunk), own_step


def _prefill_capacity_rate(model: ReplicaModel, shape: RequestShape, running: Array) -> Array:
    """Prompts per second the token budget admits with every step's spare room full of prompt tokens."""
    room = _chunk_room(model, running)
    _, full_step = _step_times(model, shape, running, room)
    return room / (shape.computed_input_tokens * full_step)


def _own_prefill_s(shape: RequestShape, chunk: Array, chunk_step: Array) -> Array:
    """A mean prompt's own prefill: its chunks, at least one step; the last partial chunk is charged
    in proportion, which keeps latency continuous as the batch takes room from the token budget."""
    return np.maximum(1.0, shape.computed_input_tokens / chunk) * chunk_step


def _length_biased_step_s(mean_s: Array, fraction: Array, chunk_step_s: Array, decode_s: Array) -> Array:
    """The mean length of the step a request arrives during: a long step is more likely to be the one in
    progress (E[d²] / E[d] over chunk and decode-only steps)."""
    return (fraction * chunk_step_s ** 2 + (1.0 - fraction) * decode_s ** 2) / mean_s


def _shared_prefill_s(model: ReplicaModel, shape: RequestShape, running: Array, room: Array, rate: float,
                      step_in_progress_s: Array) -> Array:
    """Mean of vLLM's prefill time (a prompt's first scheduled step to its first token) over the prompt mix.

    A step ends for everything it carries. Besides its own tokens, a prompt's first step carries the prompts
    that arrived at `rate` during the step in progress when it did (`step_in_progress_s` long) and the
    rest of any longer prompt that step left unfinished: those are scheduled first. So a prompt's chunks
    carry its own tokens and theirs, in full steps of the room the decodes leave and a last one of what
    remains, each a whole step however few tokens it holds. Averaged per prompt length, since a step's time
    is convex in its tokens (a few hide under the decode's weight reads)."""
    lengths, weights = prompt_strata(shape)
    computed = computed_prompt_tokens(shape, lengths)
    attention = prompt_attention_tokens(shape)
    full_room = room[..., None]
    ctx = shape.mean_context_tokens
    batch = running[..., None]
    arrived = rate * step_in_progress_s[..., None] * shape.computed_input_tokens
    full_step = model.step_s(batch, ctx, full_room, full_room * attention, full_room / shape.computed_input_tokens)
    # What a step in progress leaves unfinished: per second, rate x E[spill] prompt tokens pass through full steps
    # (a prompt's work beyond the room), so a prompt arrives during one with probability rate x E[spill] / room x
    # full step, and finds up to a room of it left. The spill grows with what is left; two rounds settle it.
    unfinished = np.zeros_like(arrived)
    for _ in range(2):
        spill = np.sum(np.maximum(computed + arrived + unfinished - full_room, 0.0) * weights, axis=-1, keepdims=True)
        unfinished = np.minimum(rate * full_step * spill, full_room)
    others = arrived + unfinished
    work = computed + others
    per_token_pairs = (computed * (lengths - computed / 2.0) + others * attention) / work
    full_steps = np.floor(work / full_room)
    rest = work - full_steps * full_room
    rest_step = model.step_s(batch, ctx, rest, rest * per_token_pairs, np.minimum(rest / computed, rest))
    by_length = full_steps * full_step + np.where(rest > 0.0, rest_step, 0.0)
    return np.asarray(np.sum(by_length * weights, axis=-1))


@dataclass(frozen=True)
class _Steps:
    """What a replica's steps look like with `running` sequences in the batch."""

    running: Array
    mean_s: Array
    decode_s: Array
    chunk_s: Array
    fraction: Array
    chunk_tokens: Array
    own_prefill_s: Array  # per prompt stratum (last axis): the prompt's own chunks
    queue_s_per_token: Array  # server time per computed prompt token with full chunks
    full_step_s: Array  # a step whose spare room is all prompt tokens
    decode_slope_s: Array  # what one more decoding sequence adds to a step
    computed_tokens: Array  # per prompt stratum (last axis)
    weights: Array  # each stratum's probability
    prompt_extra_s: Array  # per prompt stratum: what its chunks add to the steps decoders share with it

    @property
    def own_prefill_mean_s(self) -> Array:
        return np.asarray(np.sum(self.own_prefill_s * self.weights, axis=-1))

    @property
    def _computed_moments(self) -> tuple[float, float]:
        return (float(np.dot(self.computed_tokens, self.weights)),
                float(np.dot(self.computed_tokens ** 2, self.weights)))

    @property
    def prompt_work_moments_s(self) -> tuple[Array, Array]:
        """(mean, second moment) of one prompt's service time in the prefill queue."""
        mean_c, second_c = self._computed_moments
        return self.queue_s_per_token * mean_c, self.queue_s_per_token ** 2 * second_c


@lru_cache(maxsize=512)
def prompt_strata(shape: RequestShape) -> tuple[Array, Array]:
    """Prompt lengths and their probabilities: through the known percentiles, else a lognormal with
    the shape's mean and tail prompt (a single length when they are equal)."""
    if shape.input_percentiles:
        return percentile_strata(shape.input_percentiles)
    return lognormal_strata(shape.input_tokens, shape.tail_input_tokens, shape.tail_quantile)


def computed_prompt_tokens(shape: RequestShape, lengths: Array) -> Array:
    """Prompt tokens computed, per prompt length: the prefix cache serves a shared prefix of the
    same size to every prompt (a system prompt, the conversation so far), the hit rate's share of the
    mean prompt, so long prompts compute most of their length and short ones little."""
    cached = shape.prefix_cache_hit_rate * float(shape.input_tokens)
    return np.maximum(lengths - cached, 1.0)


@lru_cache(maxsize=512)
def prompt_attention_tokens(shape: RequestShape) -> float:
    """Keys a computed prompt token attends to, on average over prompt tokens: the cached prefix and
    half the computed part of its prompt, weighted by length (long prompts hold most tokens, and
    their attention grows with their square)."""
    lengths, weights = prompt_strata(shape)
    computed = computed_prompt_tokens(shape, lengths)
    return float(np.dot(weights, computed * (lengths - computed / 2.0)) / np.dot(weights, computed))


def _steps(model: ReplicaModel, shape: RequestShape, running: Array, quantile: float) -> _Steps:
    mean, decode, chunk_step, fraction, chunk = _mean_step(model, shape, running)
    room = _chunk_room(model, running)
    _, full_step = _step_times(model, shape, running, room)
    per_step = running * shape.computed_input_tokens / max(shape.output_tokens, 1.0)
    weights, computed, chunks, own_step = _prompt_strata_steps(model, shape, running, room, per_step)
    return _Steps(running=running, mean_s=mean, decode_s=decode, chunk_s=chunk_step, fraction=fraction,
                  chunk_tokens=chunk, own_prefill_s=chunks * own_step, queue_s_per_token=full_step / room,
                  full_step_s=full_step, decode_slope_s=model.step_s(running + 1.0, shape.mean_context_tokens) - decode,
                  computed_tokens=computed, weights=weights, prompt_extra_s=chunks * (own_step - decode[..., None]))


def _tpot(steps: _Steps, others_rate: Array, ttft_mean_s: Array, shape: RequestShape, quantile: float,
          overhead_s: float, batch_sd_s: ArrayLike = 0.0, batch_relaxation_s: ArrayLike = 1.0,
          ) -> tuple[Array, Array]:
    """(mean, quantile) TPOT of a request while other requests' prompts arrive at `others_rate`. The
    prompts that arrived during the engine's part of its TTFT (the API's `overhead_s` aside) queue behind
    it and run mostly in its decode steps (kvscale.perfmodel.latency.tpot_quantile_s); the batch it finds
    varies by `batch_sd_s` of step time (an open loop's: `_batch_fluctuation`)."""
    extra_mean = np.sum(steps.prompt_extra_s * steps.weights, axis=-1)
    queued_window = np.maximum(np.where(np.isfinite(ttft_mean_s), ttft_mean_s, 0.0) - overhead_s, 0.0)
    mean = steps.decode_s + others_rate * steps.mean_s * extra_mean
    return mean, tpot_quantile_s(steps.decode_s, steps.decode_slope_s, steps.mean_s, steps.full_step_s, others_rate,
                                 queued_window, steps.prompt_extra_s, steps.weights, shape.output_tokens,
                                 shape.output_tokens_scv, quantile, shape.output_percentiles, batch_sd_s,
                                 batch_relaxation_s)


def _batch_fluctuation(steps: _Steps, shape: RequestShape, slots: Array) -> tuple[Array, Array]:
    """(sd of the decode step time the running batch sets, how fast it relaxes in seconds) under Poisson
    arrivals. The batch is Poisson about its mean (Little's law; infinite-server) and widened by its
    feedback on itself: a larger batch makes slower steps, which keep every sequence longer. With kappa the
    batch's share of a decode step (slope x running / step), a birth-death process linearised about its mean
    has variance running / (1 - kappa) and relaxes in a life / (1 - kappa). The batch cannot grow past its
    slots (arrivals beyond them wait for a slot instead), so its spread stops there."""
    kappa = np.clip(steps.decode_slope_s * steps.running / np.maximum(steps.decode_s, 1e-12), 0.0, 0.9)
    spread_seqs = np.minimum(np.sqrt(steps.running / (1.0 - kappa)), np.maximum(slots - steps.running, 0.0))
    life_s = shape.decode_steps * steps.mean_s + steps.own_prefill_mean_s
    return steps.decode_slope_s * spread_seqs, life_s / (1.0 - kappa)


def _ttft_overhead_s(model: ReplicaModel) -> float:
    return model.setup.efficiency.ttft_overhead_s(model.arch.num_layers)


def _wait_decay(wait_probability: Array, mean_wait_s: Array) -> Array:
    """Decay rate of the exponential tail of a wait that, when it happens (with `wait_probability`),
    averages the Pollaczek-Khinchine mean over that probability; 0 where there is no finite wait."""
    with np.errstate(divide="ignore", invalid="ignore"):
        decay = wait_probability / mean_wait_s
    return np.where(np.isfinite(decay) & (mean_wait_s > 0), decay, 0.0)


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


def _closed_loop_rate(concurrency: Array, cap: Array, cycle_s: Array, work_mean_s: Array, work_second_s2: Array,
                      ) -> Array:
    """The completion rate X of `concurrency` clients: X (wait(X) + cycle) = concurrency, where the
    prefill wait is the M/G/1 mean at the rate the others send (arrival theorem: a request finds
    the system as if it had one client fewer); at most `cap` (the saturated rate)."""
    others = (concurrency - 1.0) / concurrency
    low = np.zeros_like(cap)
    high = cap.copy()
    for _ in range(_BISECTION_ITERATIONS * 2):
        mid = (low + high) / 2.0
        _, wait = mg1_wait(others * mid, work_mean_s, work_second_s2)
        short = mid * (wait + cycle_s) < concurrency
        low, high = np.where(short, mid, low), np.where(short, high, mid)
    _, at_cap = mg1_wait(others * cap, work_mean_s, work_second_s2)
    return np.where(cap * (at_cap + cycle_s) <= concurrency, cap, low)


def estimate_at_concurrency(model: ReplicaModel, shape: RequestShape, concurrency: ArrayLike,
                            quantile: float = 0.95, slots: ArrayLike | None = None) -> LoadEstimate:
    """Closed loop: `concurrency` clients, each sending its next request when its last one ends
    (`vllm bench serve --max-concurrency`, genai-perf/AIPerf concurrency sweeps). At most `slots`
    sequences run at once (max-num-seqs or what the KV cache holds; unlimited when None): the
    clients beyond them wait for one to finish."""
    offered = np.maximum(np.asarray(concurrency, dtype=np.float64), 1.0)
    admitted = offered if slots is None else np.minimum(offered, np.maximum(np.asarray(slots, dtype=np.float64), 1.0))
    sustained = _sustained_running(model, shape, admitted)
    running = sustained
    for _ in range(_CLOSED_LOOP_ITERATIONS):
        # Clients whose prompt waits for prefill are not in the batch yet: fewer decoders, more room.
        steps = _steps(model, shape, running, quantile)
        decode_limited, prefill_limited = _closed_loop_rates(model, shape, running)
        cap = np.minimum(decode_limited, prefill_limited)
        # A client's next request lands while the step after its last token runs (the engine does not
        # wait for it): it waits out that step unless it is alone.
        alignment = steps.mean_s * (1.0 - 1.0 / offered) + _ttft_overhead_s(model)
        cycle = steps.own_prefill_mean_s + alignment + shape.decode_steps * steps.mean_s
        work_mean, work_second = steps.prompt_work_moments_s
        rate = _closed_loop_rate(offered, cap, cycle, work_mean, work_second)
        _, queued_s = mg1_wait(rate * (offered - 1.0) / offered, work_mean, work_second)
        in_batch = np.clip(admitted - rate * np.where(np.isfinite(queued_s), queued_s, 0.0), 1.0, sustained)
        if np.max(np.abs(in_batch - running), initial=0.0) < _FIXED_POINT_TOLERANCE:
            break
        running = (running + in_batch) / 2.0
    others = rate * (offered - 1.0) / offered
    rho, wait = mg1_wait(others, work_mean, work_second)
    saturated = rate >= cap * (1.0 - 1e-9)
    # Saturated, requests beyond the sustained batch wait their turn (Little's law over all offered):
    # in a closed loop that queue is the same length for every request, not a random wait.
    backlog = np.maximum(offered / rate - shape.decode_steps * steps.mean_s - steps.own_prefill_mean_s - alignment,
                         0.0)
    wait = np.where(saturated | ~np.isfinite(wait), backlog, wait)
    busy = np.where(saturated, 0.0, np.minimum(rho, 1.0))
    shift = steps.full_step_s / 2.0
    wait = np.where(saturated, wait, wait + busy * shift)
    fixed = alignment + np.where(saturated, backlog, 0.0)
    ttft_q = ttft_quantile_s(steps.own_prefill_s, steps.weights, busy, _wait_decay(busy, wait - busy * shift), shift,
                             fixed, quantile)
    ttft_mean = steps.own_prefill_mean_s + alignment + wait
    tpot_mean, tpot_q = _tpot(steps, others, ttft_mean, shape, quantile, _ttft_overhead_s(model))
    return LoadEstimate(
        running_seqs=running,
        request_rate=rate,
        output_tokens_per_s=rate * shape.output_tokens,
        tpot_mean_s=tpot_mean,
        tpot_quantile_s=tpot_q,
        ttft_mean_s=ttft_mean,
        ttft_quantile_s=ttft_q,
        decode_step_s=steps.decode_s,
        chunk_step_s=steps.chunk_s,
        prefill_utilisation=steps.fraction,
        stable=np.ones_like(running, dtype=bool),
        prefill_wait_mean_s=wait,
    )


def first_wave_ttft_mean_s(model: ReplicaModel, shape: RequestShape, clients: float) -> float:
    """Mean TTFT of the first prompts of a closed-loop run whose `clients` all send at once on an idle
    replica (`vllm bench serve --max-concurrency C --request-rate inf` and the harnesses built on it):
    they queue for the token budget oldest first, and each prompt prefilled joins the decodes that take
    one token of every later step's budget. Steady state is `estimate_at_concurrency`'s business; this is
    the start-up it leaves out."""
    count = max(round(clients), 1)
    prompt = float(shape.computed_input_tokens)
    attention = prompt_attention_tokens(shape)
    budget = float(model.setup.token_budget)
    total = count * prompt
    done_tokens, elapsed_s, prefilled = 0.0, 0.0, 0
    ttfts: list[float] = []
    while prefilled < count:
        chunk = min(max(budget - prefilled, 1.0), total - done_tokens)
        elapsed_s += float(model.step_s(float(prefilled), shape.input_tokens, chunk, chunk * attention,
                                        chunk / prompt))
        done_tokens += chunk
        # the last chunk ends the wave whatever the rounding of the tokens counted
        finished = count if done_tokens >= total - 1e-6 else min(count, math.floor(done_tokens / prompt + 1e-9))
        ttfts.extend([elapsed_s] * (finished - prefilled))
        prefilled = finished
    return sum(ttfts) / count + _ttft_overhead_s(model)


def run_ttft_mean_s(model: ReplicaModel, shape: RequestShape, clients: float, requests: float,
                    steady_ttft_mean_s: float) -> float:
    """Mean TTFT over a closed-loop run of `requests` requests from `clients` clients that start together:
    the first wave's (first_wave_ttft_mean_s), then the steady state's for the rest. What a benchmark's
    'Mean TTFT' reports; a median over many waves is the steady state's."""
    wave = min(max(clients, 1.0), requests)
    return (wave * first_wave_ttft_mean_s(model, shape, wave) + (requests - wave) * steady_ttft_mean_s) / requests


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
    prefill = _shared_prefill_s(model, shape, batch, room, rate,
                                _length_biased_step_s(mean, fraction, chunk_step, decode))
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
    # Prefix-cached prompt blocks are shared between the sequences that hit them: a sequence holds
    # only its computed prompt tokens and its outputs of its own.
    own = shape.computed_input_tokens if shape.prefix_cache_hit_rate > 0 else shape.input_tokens
    per_seq = own + shape.output_tokens / 2.0 if oversubscribe else own + shape.output_tokens
    by_cache = np.floor(np.asarray(kv_cache_tokens, dtype=np.float64) / per_seq)
    return np.maximum(np.minimum(np.asarray(max_num_seqs, dtype=np.float64), by_cache), 0.0)


def max_request_rate(model: ReplicaModel, shape: RequestShape, slots: ArrayLike) -> Array:
    """Highest sustainable arrival rate with `slots` sequences running (requests/s)."""
    return estimate_at_concurrency(model, shape, slots).request_rate


def _saturated_rate(model: ReplicaModel, shape: RequestShape, slots: Array) -> Array:
    """Completions/s with every slot busy and no client think time: the open loop's ceiling."""
    running = _sustained_running(model, shape, slots)
    decode_limited, prefill_limited = _closed_loop_rates(model, shape, running)
    return np.minimum(decode_limited, prefill_limited)


def estimate_at_rate(model: ReplicaModel, shape: RequestShape, request_rate: ArrayLike, slots: ArrayLike,
                     quantile: float = 0.95, arrival_scv: float = 1.0) -> LoadEstimate:
    """Open loop: Poisson arrivals at `request_rate` into a replica with `slots` concurrent sequences
    (`vllm bench serve --request-rate`). `arrival_scv` > 1: burstier arrivals (the squared coefficient
    of variation of the gaps between them), whose prefill queue waits longer (Kingman's GI/G/1 factor)."""
    rate = np.asarray(request_rate, dtype=np.float64)
    cap = np.maximum(np.asarray(slots, dtype=np.float64), 1.0)
    rate, cap = np.broadcast_arrays(rate, cap)
    full_rate = _saturated_rate(model, shape, cap)
    service_full_s = cap / full_rate  # one slot's occupancy when every slot is busy

    running = np.minimum(np.maximum(rate * service_full_s, 1.0), cap)
    in_batch_s = service_full_s
    for _ in range(_FIXED_POINT_ITERATIONS):  # Little's law: running = rate × time in the batch
        mean, _, chunk_step, _, chunk = _mean_step(model, shape, running)
        # A prompt joins the batch with its first chunk, often a remainder of a step older prompts
        # fill, and leaves prefill with the step its last chunk ends, which younger ones fill: when
        # prompts queue, that is half a full step more in the batch (as in the TTFT's shift).
        room = _chunk_room(model, running)
        _, full_step = _step_times(model, shape, running, room)
        busy = np.minimum(rate * shape.computed_input_tokens * full_step / room, 1.0)
        in_batch_s = _own_prefill_s(shape, chunk, chunk_step) + busy * full_step / 2.0 + shape.decode_steps * mean
        updated = np.minimum(np.maximum(rate * in_batch_s, 1.0), cap)
        converged = np.max(np.abs(updated - running), initial=0.0) < _FIXED_POINT_TOLERANCE
        running = updated
        if converged:
            break
    steps = _steps(model, shape, running, quantile)

    stable = rate < full_rate
    slot_wait_q = mmc_wait_quantile_s(cap, rate, service_full_s, quantile)
    slot_wait_mean = mmc_wait_mean_s(cap, rate, service_full_s)
    work_mean, work_second = steps.prompt_work_moments_s
    rho, wait = mg1_wait(rate, work_mean, work_second)
    if arrival_scv != 1.0:
        # GI/G/1 (Kingman): the M/G/1 wait times (c_a^2 + c_s^2) / (1 + c_s^2).
        service_scv = np.maximum(work_second / np.maximum(work_mean, 1e-12) ** 2 - 1.0, 0.0)
        wait = wait * (arrival_scv + service_scv) / (1.0 + service_scv)
    # An arrival that finds no prompt work ahead still waits out the decode step in progress (the
    # prompt work in progress is the queue's): busy share x decode-only share x half that step.
    busy = np.clip(rate * in_batch_s, 0.0, 1.0)
    alignment = busy * (1.0 - steps.fraction) * steps.decode_s ** 2 / (2.0 * steps.mean_s) + _ttft_overhead_s(model)
    stable = stable & np.isfinite(wait)
    busy = np.minimum(rho, 1.0)
    shift = steps.full_step_s / 2.0
    ttft_q = np.where(stable, ttft_quantile_s(steps.own_prefill_s, steps.weights, busy, _wait_decay(busy, wait), shift,
                                              alignment + slot_wait_q, quantile), np.inf)
    wait = wait + busy * shift
    ttft_mean = np.where(stable, steps.own_prefill_mean_s + wait + alignment + slot_wait_mean, np.inf)
    served = np.minimum(rate, full_rate)
    batch_sd, batch_relaxation = _batch_fluctuation(steps, shape, cap)
    tpot_mean, tpot_q = _tpot(steps, served, ttft_mean, shape, quantile, _ttft_overhead_s(model), batch_sd,
                              batch_relaxation)
    return LoadEstimate(
        running_seqs=running,
        request_rate=served,
        output_tokens_per_s=served * shape.output_tokens,
        tpot_mean_s=tpot_mean,
        tpot_quantile_s=tpot_q,
        ttft_mean_s=ttft_mean,
        ttft_quantile_s=ttft_q,
        decode_step_s=steps.decode_s,
        chunk_step_s=steps.chunk_s,
        prefill_utilisation=steps.fraction,
        stable=stable,
        prefill_wait_mean_s=np.where(stable, wait + slot_wait_mean, np.inf),
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
# Two passes: a goodput within 0.004% of saturation, not the 0.1% one pass leaves. At 0.1% the plan and the
# autoscaler, which search grids of their own, disagreed on whether one TP8 replica of the 70B example carries
# its 11.0 req/s (10.998 against 11.010 req/s).
_FINE_PASSES = 2


def _last_compliant(rates: Array, estimate: LoadEstimate, ttft_slo_s: float, tpot_slo_s: float,
                    ) -> tuple[NDArray[np.bool_], NDArray[np.intp]]:
    """Per row: SLO compliance of each rate and the index of the first violation (len when none)."""
    ok = (estimate.ttft_quantile_s <= ttft_slo_s) & (estimate.tpot_quantile_s <= tpot_slo_s) & estimate.stable
    first_bad = np.where(ok.all(axis=1), ok.shape[1], np.argmin(ok, axis=1))
    return ok, first_bad


def estimate_goodput(model: ReplicaModel, shape: RequestShape, slots: ArrayLike, ttft_slo_s: float,
                     tpot_slo_s: float, quantile: float = 0.95, arrival_scv: float = 1.0) -> Goodput:
    """Goodput of a replica for each entry of `slots`: a coarse grid over fractions of saturation,
    then a fine grid between the last compliant and the first violating rate (latencies grow with load).
    `arrival_scv`: as estimate_at_rate's (1: Poisson)."""
    cap = np.atleast_1d(np.maximum(np.asarray(slots, dtype=np.float64), 1.0))
    rows = np.arange(cap.size)
    saturation = max_request_rate(model, shape, cap)
    coarse = saturation[:, None] * _COARSE_GRID[None, :]
    coarse_est = estimate_at_rate(model, shape, coarse, cap[:, None], quantile, arrival_scv)
    ok, first_bad = _last_compliant(coarse, coarse_est, ttft_slo_s, tpot_slo_s)
    feasible = first_bad > 0
    low = coarse[rows, np.maximum(first_bad - 1, 0)]
    high = np.where(first_bad < coarse.shape[1], coarse[rows, np.minimum(first_bad, coarse.shape[1] - 1)],
                    saturation * 0.9999)
    for _ in range(_FINE_PASSES):  # each pass narrows the bracket to one of its steps
        fine = low[:, None] + (high - low)[:, None] * np.linspace(0.0, 1.0, _FINE_STEPS)[None, :]
        fine_est = estimate_at_rate(model, shape, fine, cap[:, None], quantile, arrival_scv)
        fine_ok, fine_bad = _last_compliant(fine, fine_est, ttft_slo_s, tpot_slo_s)
        low, high = (fine[rows, np.maximum(fine_bad - 1, 0)],
                     np.where(fine_bad < _FINE_STEPS, fine[rows, np.minimum(fine_bad, _FINE_STEPS - 1)], high))
    best_rate = np.where(feasible, fine[rows, np.maximum(fine_bad - 1, 0)], 0.0)
    at = estimate_at_rate(model, shape, np.maximum(best_rate, 1e-9), cap, quantile, arrival_scv)
    violation = (rows, np.minimum(fine_bad, _FINE_STEPS - 1))
    tpot_bad = fine_est.tpot_quantile_s[violation] > tpot_slo_s
    ttft_bad = fine_est.ttft_quantile_s[violation] > ttft_slo_s
    saturated = (first_bad >= coarse.shape[1]) & (fine_bad >= _FINE_STEPS)
    binding = np.where(saturated, "capacity", np.where(tpot_bad, "tpot", np.where(ttft_bad, "ttft", "capacity")))
    del ok, fine_ok
    return Goodput(request_rate=best_rate, at_rate=at, max_rate=saturation, binding=binding.astype(np.str_))
