"""Achieved bandwidth and compute from the engine's own work counters (vLLM's MFU metrics).

vLLM >= 0.17 started with --enable-mfu-metrics counts, per GPU, the FLOPs it computed and the bytes it
read and wrote (`vllm:estimated_*_per_gpu_total`, an analytic estimate per scheduled batch). Over a
window that is work per wall-clock second, which the load sets, not the hardware: a slow GPU that
keeps up does the same work per second as a fast one, only busier. Speed is work over the time spent
on it, so the counters are divided per engine step (`vllm:iteration_tokens_total` counts the steps)
and set against the observed step time, the mean inter-token time (every running sequence gets one
token per step).

A step is one of two kinds (as in kvscale.perfmodel.serving): decode-only steps stream the weights
and the KV cache and are memory-bound; steps that also carry a prompt chunk are compute-bound once
the chunk is large. The model at the observed batch and prompt load says how long each kind takes
relative to the other and how often chunks come; the observed mean step is split in those
proportions, and the fixed part of a step that no speed changes (per-step overhead, all-reduces) is
taken off. Then, per GPU:

    achieved bandwidth = bytes per step / memory time of a decode step
    achieved FLOP/s    = FLOPs of a chunk step / compute time of a chunk step

Every step streams the weights, so the bytes per step stand for a decode step's; FLOPs grow with the
tokens a step processes, so a chunk step's are the counted FLOPs per step x (chunk + batch) / (prompt
tokens per step + batch). Each is measured only where that kind of step takes most of the time and is
bound by what it measures; otherwise it is None and calibration keeps its latency fit for it. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvscale.perfmodel import ReplicaModel, RequestShape, build_replica_model

# A speed factor this large takes that resource out of the roofline: what is left of a step is the
# part no speed factor changes, or what the other resource alone would take.
_UNBOUNDED = 1e9
# The kind of step measured must take at least this share of the window's time...
MIN_STEP_SHARE_FOR_FIT = 0.5
# ... and be bound by what is measured: the other resource alone would take at most this share of its
# time (the roofline's max() hides one behind the other).
MAX_OTHER_BOUND_SHARE = 0.5


@dataclass(frozen=True)
class EngineWork:
    """What one replica's engine did per second of a window, per GPU, by its own count."""

    flops_per_s: float
    hbm_bytes_per_s: float  # read + written
    steps_per_s: float  # engine steps (scheduler iterations)


@dataclass(frozen=True)
class AchievedSpeeds:
    """Per-GPU speeds measured in one window; None where the window cannot tell."""

    hbm_bandwidth_bytes_per_s: float | None
    flops_per_s: float | None


@dataclass(frozen=True)
class _Steps:
    """The model's mean step at the observed load: its two kinds, how often chunks come, fixed parts."""

    decode_s: float
    chunk_s: float
    chunk_share: float  # of steps, the ones that carry a prompt chunk
    chunk_tokens: float
    prompt_tokens_per_step: float
    decode_fixed_s: float
    chunk_fixed_s: float

    @property
    def mean_s(self) -> float:
        return self.chunk_share * self.chunk_s + (1.0 - self.chunk_share) * self.decode_s


def _with_speed(model: ReplicaModel, *, decode: float = 1.0, prefill: float = 1.0) -> ReplicaModel:
    efficiency = model.setup.efficiency.scaled(decode=decode, prefill=prefill)
    return build_replica_model(replace(model.setup, efficiency=efficiency))


def _step_s(model: ReplicaModel, shape: RequestShape, running: float, chunk_tokens: float) -> float:
    """A step decoding `running` sequences and computing `chunk_tokens` prompt tokens (0: decode only);
    each computed prompt token attends to the cached prefix and about half of the computed part."""
    computed = _computed_prompt_tokens(shape)
    cached = shape.input_tokens - computed
    pairs = chunk_tokens * (max(cached, 0.0) + computed / 2.0)
    return float(model.step_s(running, shape.mean_context_tokens, chunk_tokens, pairs, chunk_tokens / computed))


def _computed_prompt_tokens(shape: RequestShape) -> float:
    """Prompt tokens the engine computes: those the prefix cache does not serve; at least one."""
    return max(shape.input_tokens * (1.0 - shape.prefix_cache_hit_rate), 1.0)


def _observed_steps(model: ReplicaModel, shape: RequestShape, running: float, rate: float,
                    steps_per_s: float) -> _Steps:
    """The mean step with the observed prompt load: the prompt tokens arriving per second spread over
    the steps the engine took, in chunks of at least one prompt and at most the token budget's room."""
    batch = max(running, 1.0)
    per_step = rate * _computed_prompt_tokens(shape) / steps_per_s
    room = max(float(model.setup.token_budget) - batch, 1.0)
    chunk = min(room, max(_computed_prompt_tokens(shape), per_step))
    fixed = _with_speed(model, decode=_UNBOUNDED, prefill=_UNBOUNDED)
    return _Steps(decode_s=_step_s(model, shape, batch, 0.0), chunk_s=_step_s(model, shape, batch, chunk),
                  chunk_share=min(per_step / chunk, 1.0), chunk_tokens=chunk, prompt_tokens_per_step=per_step,
                  decode_fixed_s=_step_s(fixed, shape, batch, 0.0), chunk_fixed_s=_step_s(fixed, shape, batch, chunk))


def _bound_by(model: ReplicaModel, shape: RequestShape, batch: float, chunk_tokens: float, step_s: float,
              fixed_s: float, *, memory: bool) -> bool:
    """Whether a step is bound by memory (or compute): the other resource alone, made the only limit,
    would take at most MAX_OTHER_BOUND_SHARE of the step's variable time."""
    other_only = _with_speed(model, decode=_UNBOUNDED) if memory else _with_speed(model, prefill=_UNBOUNDED)
    return _step_s(other_only, shape, batch, chunk_tokens) - fixed_s <= MAX_OTHER_BOUND_SHARE * (step_s - fixed_s)


def estimate_achieved_speeds(model: ReplicaModel, shape: RequestShape, running: float, rate: float,
                             tpot_mean_s: float, work: EngineWork) -> AchievedSpeeds:
    """Per-GPU bandwidth and FLOP/s one replica achieved over a window (see the module's doc).

    `model` is the replica at the current calibration, `running` and `rate` the window's mean batch and
    finished requests/s per replica, `tpot_mean_s` its mean inter-token time, `work` its counters.
    """
    if tpot_mean_s <= 0.0 or work.steps_per_s <= 0.0:
        return AchievedSpeeds(None, None)
    batch = max(running, 1.0)
    steps = _observed_steps(model, shape, batch, max(rate, 0.0), work.steps_per_s)
    scale = tpot_mean_s / steps.mean_s  # the observed mean step, split as the model splits its own
    bandwidth = None
    decode_time_share = (1.0 - steps.chunk_share) * steps.decode_s / steps.mean_s
    memory_s = steps.decode_s * scale - steps.decode_fixed_s
    if (decode_time_share >= MIN_STEP_SHARE_FOR_FIT and memory_s > 0.0
            and _bound_by(model, shape, batch, 0.0, steps.decode_s, steps.decode_fixed_s, memory=True)):
        bandwidth = work.hbm_bytes_per_s / work.steps_per_s / memory_s
    flops = None
    chunk_time_share = steps.chunk_share * steps.chunk_s / steps.mean_s
    compute_s = steps.chunk_s * scale - steps.chunk_fixed_s
    if (chunk_time_share >= MIN_STEP_SHARE_FOR_FIT and compute_s > 0.0
            and _bound_by(model, shape, batch, steps.chunk_tokens, steps.chunk_s, steps.chunk_fixed_s, memory=False)):
        tokens_in_chunk_steps = (steps.chunk_tokens + batch) / (steps.prompt_tokens_per_step + batch)
        flops = work.flops_per_s / work.steps_per_s * tokens_in_chunk_steps / compute_s
    return AchievedSpeeds(hbm_bandwidth_bytes_per_s=bandwidth, flops_per_s=flops)
