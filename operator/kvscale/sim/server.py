"""One continuous-batching server (a vLLM-like engine), stepped on the performance model.

Every engine step decodes one token for each running sequence that has finished its prompt and
fills the rest of the token budget with prompt chunks (chunked prefill): first the prompts already
started, oldest first, then new requests from the waiting queue while fewer than max-num-seqs run.
The KV cache holds `kv_cache_tokens` tokens; when the running sequences' next tokens do not fit, the
newest sequence is preempted and recomputed later (vLLM's recompute preemption). A step's duration is
`ReplicaModel.step_s` of the "true" server.

Speed: nothing is done per token. A decoding sequence's finish step is known when its prompt
completes, the decoders' total context is one running sum, and stretches of decode-only steps between
events (a completion, a full cache, the caller's horizon) are summed in closed form.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kvscale.perfmodel import ReplicaModel


@dataclass(frozen=True)
class ServerForm:
    """How the simulated servers differ from the planner's model in form, beyond its scale factors (the
    model knows neither): attention that costs more per token as contexts grow (paged attention reads more
    scattered blocks and splits long sequences), and a per-step overhead that varies from step to step
    (the scheduler, sampling and Python between kernels), which lengthens the TPOT tail, not the mean."""

    attention_growth_tokens: float | None = None  # decode attention per token x (1 + mean context / this)
    overhead_jitter_cv: float = 0.0  # coefficient of variation of each step's overhead (gamma, same mean)
    seed: int = 0

    @property
    def describe(self) -> str:
        growth = (f"decode attention per token x (1 + mean context / {self.attention_growth_tokens:g})"
                  if self.attention_growth_tokens else "attention as modelled")
        return f"{growth}; step overhead with CV {self.overhead_jitter_cv:g} (gamma)"


MODEL_FORM = ServerForm()
# The benchmarks' servers: at a 4k-token mean context decode attention costs 25% more per token than the
# model says, and step overheads vary with a CV of 0.5.
MEASURED_LIKE_FORM = ServerForm(attention_growth_tokens=16_384.0, overhead_jitter_cv=0.5)
SERVER_FORMS = {"model": MODEL_FORM, "measured-like": MEASURED_LIKE_FORM}  # by `kvscale simulate --server-form`


class StepCost:
    """Step durations of one ReplicaModel, split into cached parts that sum to exactly `step_s`.

    step_s(d, ctx, p, pairs, ps) = S(d + p, d + min(ps, p)) + a·d·eff(ctx) + b·pairs, where S(t, r) is
    a step of t tokens producing r logit rows with no attention (the weights, the LM head, all-reduces
    and the fixed overhead), a the decode-attention cost per attended token and b the prefill-attention
    cost per (query, key) pair. S comes from `step_s` itself, one vectorised row per r, filled on use.
    """

    _PROBE_CONTEXT = 4096.0
    _PROBE_PAIRS = 1e6

    def __init__(self, model: ReplicaModel, max_tokens: int, form: ServerForm = MODEL_FORM) -> None:
        self.model = model
        self.max_tokens = int(max_tokens)
        self.form = form
        self._rng = np.random.default_rng(form.seed)
        self._overhead_s = model.setup.efficiency.step_overhead_s
        self.sliding = bool(model.arch.num_sliding_layers)
        base = float(model.step_s(1.0, 0.0)[()])
        effective = float(model.effective_context(self._PROBE_CONTEXT)[()])
        self.decode_attention_s_per_token = (float(model.step_s(1.0, self._PROBE_CONTEXT)[()]) - base) / effective
        empty = float(model.step_s(0.0, 0.0)[()])
        self.prefill_attention_s_per_pair = (float(model.step_s(0.0, 0.0, 0.0, self._PROBE_PAIRS)[()]) - empty
                                             ) / self._PROBE_PAIRS
        self._rows: dict[int, list[float]] = {}

    def _row(self, logit_rows: int) -> list[float]:
        row = self._rows.get(logit_rows)
        if row is None:
            tokens = np.arange(self.max_tokens + 1, dtype=np.float64)
            decode = np.full_like(tokens, float(logit_rows))
            row = self.model.step_s(decode, 0.0, np.maximum(tokens - logit_rows, 0.0), 0.0, 0.0).tolist()
            self._rows[logit_rows] = row
        return row

    def step_s(self, decode_seqs: int, decode_context_tokens: float, prefill_tokens: int = 0,
               prefill_attention_pairs: float = 0.0, prefill_seqs: int = 0) -> float:
        """One step; `decode_context_tokens` is the decoders' total (not mean) attended context."""
        tokens = decode_seqs + prefill_tokens
        rows = decode_seqs + min(prefill_seqs, prefill_tokens)
        if tokens > self.max_tokens:
            linear = float(self.model.step_s(float(rows), 0.0, float(tokens - rows))[()])
        else:
            linear = self._row(rows)[tokens]
        if decode_seqs and self.sliding:
            mean = decode_context_tokens / decode_seqs
            attended = decode_seqs * float(self.model.effective_context(mean)[()])
        else:
            attended = decode_context_tokens
        if decode_seqs and self.form.attention_growth_tokens:
            attended *= 1.0 + decode_context_tokens / decode_seqs / self.form.attention_growth_tokens
        return (linear + self.decode_attention_s_per_token * attended
                + self.prefill_attention_s_per_pair * prefill_attention_pairs)

    def overhead_noise_s(self, steps: int) -> float:
        """The step overheads' deviation from their mean over `steps` steps (0 without jitter): the sum of
        `steps` gamma draws of mean 1 is one gamma draw of shape `steps` times theirs."""
        cv = self.form.overhead_jitter_cv
        if cv <= 0.0 or steps <= 0:
            return 0.0
        shape = 1.0 / (cv * cv)
        return float(self._rng.gamma(shape * steps, 1.0 / shape) - steps) * self._overhead_s


class RequestLog:
    """Per-request outcomes (NaN until they happen) and the order in which events happened."""

    def __init__(self, arrival_s: NDArray[np.float64], input_tokens: NDArray[np.int64],
                 output_tokens: NDArray[np.int64], prefix_group: NDArray[np.int64] | None = None,
                 prefix_tokens: NDArray[np.int64] | None = None) -> None:
        n = arrival_s.size
        self.arrival_s = arrival_s
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.prefix_group = prefix_group
        self.prefix_tokens = prefix_tokens
        # vLLM's prefix_cache_queries / prefix_cache_hits counters: prompt tokens looked up, found.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.scheduled_s = np.full(n, np.nan)  # first time an engine step took some of its prompt
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.dropped = np.zeros(n, dtype=bool)
        self.first_token_order: list[int] = []  # request ids in the order their first token came
        self.finish_order: list[int] = []
        self.preemptions = 0


class _Seq:
    """A request inside one engine."""

    __slots__ = ("base", "computed", "emitted", "epoch", "out", "prompt", "req", "shared", "target")

    def __init__(self, req: int, prompt: int, out: int) -> None:
        self.req = req
        self.prompt = prompt
        self.out = out
        self.emitted = 0  # tokens produced so far (valid while not decoding)
        self.computed = 0  # prompt tokens (plus recomputed outputs) whose KV is in the cache
        self.target = prompt  # tokens this prefill must compute
        self.base = 0  # while decoding: KV tokens = base + engine steps
        self.epoch = 0  # bumped when a sequence leaves the decoders (invalidates its heap entry)
        self.shared = 0  # prompt tokens served by the prefix cache: attended, but blocks it shares


class Replica:
    """A serving replica: its engine state, clock and accounting."""

    def __init__(self, index: int, cost: StepCost, log: RequestLog, *, token_budget: int, max_num_seqs: int,
                 kv_cache_tokens: int, started_s: float, ready_s: float) -> None:
        self.index = index
        self.cost = cost
        self.log = log
        self.token_budget = int(token_budget)
        self.max_num_seqs = int(max_num_seqs)
        self.kv_cache_tokens = int(kv_cache_tokens)
        self.started_s = started_s
        self.ready_s = ready_s
        self.stopped_s: float | None = None
        self.draining = False
        self.clock = ready_s
        self.steps = 0
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []  # admission order: the last is preempted first
        self.prefilling: list[_Seq] = []  # running sequences still computing their prompt, oldest first
        self.prefill_kv = 0  # KV tokens held by prefilling sequences
        self.decoders = 0
        self.decode_base = 0  # decoders' KV tokens = decode_base + decoders * steps
        self.shared_kv = 0  # of those and the prefilling ones, tokens in shared prefix blocks (held once)
        self.finishing: list[tuple[int, int, int, _Seq]] = []  # (finish step, epoch, req, seq)
        self.preemptions = 0
        self.busy_s = 0.0
        self.running_seq_s = 0.0  # integral of the running batch over time (for window averages)
        # Outside the engine: the API server's share of every request (HTTP, tokenization, the
        # hand-off); the client sees its tokens this much later than the engine makes them.
        self.response_delay_s = cost.model.setup.efficiency.ttft_overhead_s(cost.model.arch.num_layers)
        # The prefix cache: groups whose prefix KV the engine still holds, least recently used first.
        # Their blocks live in what the running sequences leave free; this many tokens at most.
        self.prefix_cache: OrderedDict[int, int] = OrderedDict()
        self.prefix_cache_capacity_tokens = self.kv_cache_tokens // 4

    # --- what the router and the metrics see -----------------------------------------------------
    @property
    def outstanding(self) -> int:
        return len(self.running) + len(self.waiting)

    @property
    def kv_used_tokens(self) -> int:
        return self.decode_base + self.decoders * self.steps + self.prefill_kv - self.shared_kv

    @property
    def kv_usage(self) -> float:
        return self.kv_used_tokens / self.kv_cache_tokens if self.kv_cache_tokens else 0.0

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def submit(self, req: int, prompt: int, out: int) -> None:
        self.waiting.append(_Seq(req, prompt, out))

    # --- time ----------------------------------------------------------------------------------
    def advance(self, until_s: float) -> None:
        """Run engine steps while the clock is before `until_s` (the last step may end after it)."""
        while self.clock < until_s:
            if not self.running and not self.waiting:
                self.clock = until_s
                return
            if not self._decode_stretch(until_s):
                self._step()

    def _preempt_newest(self) -> None:
        seq = self.running.pop()
        self._release_shared(seq)
        if seq.computed >= seq.target:  # decoding: its KV and progress follow from the step count
            self.decoders -= 1
            self.decode_base -= seq.base
            seq.emitted = seq.base + self.steps - seq.prompt + 1
            seq.epoch += 1
        else:
            self.prefilling.remove(seq)
            self.prefill_kv -= seq.computed
        seq.computed = 0
        seq.target = seq.prompt + seq.emitted
        self.waiting.appendleft(seq)
        self.preemptions += 1
        self.log.preemptions += 1

    def _step(self) -> None:
        cap = self.kv_cache_tokens
        while True:
            used = self.decode_base + self.decoders * self.steps + self.prefill_kv - self.shared_kv
            if self.decoders and used + self.decoders > cap:
                self._preempt_newest()
                continue
            budget = self.token_budget - self.decoders
            free = cap - used - self.decoders
            chunks: list[tuple[_Seq, int]] = []
            for seq in self.prefilling:
                if budget <= 0 or free <= 0:
                    break
                take = min(seq.target - seq.computed, budget, free)
                chunks.append((seq, take))
                budget -= take
                free -= take
            while self.waiting and budget > 0 and free > 0 and len(self.running) < self.max_num_seqs:
                seq = self.waiting.popleft()
                if seq.computed == 0:
                    self._look_up_prefix(seq)
                take = min(seq.target - seq.computed, budget, free)
                self.running.append(seq)
                self.prefilling.append(seq)
                if seq.emitted == 0 and math.isnan(self.log.scheduled_s[seq.req]):
                    self.log.scheduled_s[seq.req] = self.clock
                chunks.append((seq, take))
                budget -= take
                free -= take
            if chunks or self.decoders:
                break
            self._preempt_newest()  # only partial prompts hold the cache: free room by recomputing one

        prefill_tokens = 0
        pairs = 0.0
        for seq, take in chunks:
            prefill_tokens += take
            pairs += take * seq.computed + take * take / 2.0
        decoders = self.decoders
        context = self.decode_base + decoders * (self.steps + 1)
        dt = self.cost.step_s(decoders, context, prefill_tokens, pairs, len(chunks))
        dt = max(dt + self.cost.overhead_noise_s(1), 0.5 * dt)
        self.clock += dt
        self.busy_s += dt
        self.running_seq_s += len(self.running) * dt
        self.steps += 1
        for seq, take in chunks:
            seq.computed += take
            self.prefill_kv += take
            if seq.computed >= seq.target:
                self._prefill_done(seq)
        self._finish_due()

    def _look_up_prefix(self, seq: _Seq) -> None:
        """Start a prompt past the prefix the cache holds (at least its last token is computed, as in
        vLLM). The prefix's blocks are shared: attended by the sequence, held once (kept within
        `prefix_cache_capacity_tokens`, not counted against the running sequences)."""
        log = self.log
        self.log.prefix_cache_queries += seq.target
        if log.prefix_group is None or log.prefix_tokens is None:
            return
        group = int(log.prefix_group[seq.req])
        if group < 0 or group not in self.prefix_cache:
            return
        self.prefix_cache.move_to_end(group)
        hit = min(int(log.prefix_tokens[seq.req]), seq.target - 1)
        seq.computed = hit
        seq.shared = hit
        self.prefill_kv += hit
        self.shared_kv += hit
        log.prefix_cache_hits += hit

    def _release_shared(self, seq: _Seq) -> None:
        self.shared_kv -= seq.shared
        seq.shared = 0

    def _remember_prefix(self, seq: _Seq) -> None:
        log = self.log
        if log.prefix_group is None or log.prefix_tokens is None:
            return
        group = int(log.prefix_group[seq.req])
        if group < 0:
            return
        self.prefix_cache[group] = int(log.prefix_tokens[seq.req])
        self.prefix_cache.move_to_end(group)
        while sum(self.prefix_cache.values()) > self.prefix_cache_capacity_tokens and len(self.prefix_cache) > 1:
            self.prefix_cache.popitem(last=False)

    def _prefill_done(self, seq: _Seq) -> None:
        self._remember_prefix(seq)
        self.prefilling.remove(seq)
        self.prefill_kv -= seq.target
        log = self.log
        if seq.emitted == 0:
            log.first_token_s[seq.req] = self.clock + self.response_delay_s
            log.first_token_order.append(seq.req)
        seq.emitted += 1
        if seq.emitted >= seq.out:
            self._finish(seq)
            return
        self.decoders += 1
        seq.base = seq.target - self.steps
        self.decode_base += seq.base
        heapq.heappush(self.finishing, (self.steps + seq.out - seq.emitted, seq.epoch, seq.req, seq))

    def _finish(self, seq: _Seq) -> None:
        self._release_shared(seq)
        self.running.remove(seq)
        self.log.finish_s[seq.req] = self.clock + self.response_delay_s
        self.log.finish_order.append(seq.req)

    def _finish_due(self) -> None:
        heap = self.finishing
        while heap and heap[0][0] <= self.steps:
            _, epoch, _, seq = heapq.heappop(heap)
            if epoch != seq.epoch:
                continue  # preempted after this entry was made
            self.decoders -= 1
            self.decode_base -= seq.base
            seq.epoch += 1
            self._finish(seq)

    def _next_finish_step(self) -> int | None:
        heap = self.finishing
        while heap and heap[0][1] != heap[0][3].epoch:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _decode_stretch(self, until_s: float) -> bool:
        """Run several decode-only steps at once when nothing can change before the next event."""
        if self.prefilling or not self.decoders:
            return False
        used = self.kv_used_tokens
        free = self.kv_cache_tokens - used
        if self.waiting and free > self.decoders and len(self.running) < self.max_num_seqs:
            return False  # the next step admits a prompt
        finish = self._next_finish_step()
        n = self.decoders
        k_limit = min(finish - self.steps if finish is not None else 1 << 30, free // n)
        if k_limit < 2:
            return False
        context = self.decode_base + n * (self.steps + 1)
        first = self.cost.step_s(n, context)
        delta = self.cost.step_s(n, context + n) - first  # steps grow linearly with the context
        remaining = until_s - self.clock
        if delta > 1e-15:
            half = first - delta / 2.0
            k_time = math.ceil((-half + math.sqrt(half * half + 2.0 * delta * remaining)) / delta)
        else:
            k_time = math.ceil(remaining / first)
        k = min(k_limit, max(k_time, 1))
        if k < 2:
            return False
        last = self.cost.step_s(n, context + n * (k - 1))
        elapsed = k * (first + last) / 2.0
        elapsed = max(elapsed + self.cost.overhead_noise_s(k), 0.5 * elapsed)
        self.clock += elapsed
        self.busy_s += elapsed
        self.running_seq_s += len(self.running) * elapsed
        self.steps += k
        self._finish_due()
        return True
