"""The generation engine: one decode thread per LLM version, continuous batching.

Each step: drop sequences whose clients went away, let waiting sequences into the running set
while that raises measured tokens/s within the latency target (:mod:`~ortserve.llm.running_set`),
run one decode step for every decoding row, then prefill waiting prompts in chunks under a
per-step budget (:mod:`~ortserve.llm.prefill`), so a long prompt never stalls the streams already
running; with a step graph (:mod:`~ortserve.llm.fusion`) the first chunk runs with the decode, in
one run. A prefilled sequence decodes from the next step on; finished ones leave at once. Keys
and values live in a :mod:`~ortserve.llm.kv_backend`; when it runs short the newest sequences are
preempted and resume later from where they were, without repeating a token.

The waiting queue is bounded by expected wait: a request that could not get its first token
within ``max_queue_wait_s`` (or its own deadline) is refused at once with 429 and Retry-After.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from ortserve.errors import Overloaded
from ortserve.llm.forks import start_forks
from ortserve.llm.itl_guard import ItlGuard
from ortserve.llm.kv_backend import DecoderSession, KvBackend, KvFull, fusing, make_backend
from ortserve.llm.kv_reuse import remember
from ortserve.llm.limits import MIN_CHUNK_TOKENS, PREFILL_SHARE, EngineLimits
from ortserve.llm.prefill import ChunkCost, PrefillPlanner, RidingChunk, next_chunk, plan_riding, ride
from ortserve.llm.prefix_cache import PrefixCache
from ortserve.llm.running_set import RunningSetSize, default_itl_target_s
from ortserve.llm.sampler import sample_batch
from ortserve.llm.scheduler import StepCostModel, WaitingQueue
from ortserve.llm.sequence import GenerationEvent, Sequence
from ortserve.llm.warmup import measure

__all__ = ["PREFILL_SHARE", "DecoderSession", "EngineLimits", "GenerationEngine", "StepSink"]

logger = logging.getLogger(__name__)

GIL_SWITCH_S = 0.001
"""The interpreter's switch interval once an engine runs (process-wide, never raised): the decode
thread takes the GIL back after every model call, and at the default 5 ms a busy event loop
could hold each hand-over that long (benchmarks/RESULTS.md, issue 35)."""

F32 = npt.NDArray[np.float32]
StepSink = Callable[[list[tuple[Sequence, GenerationEvent]]], None]
"""Receives, on the engine thread, every event of one step (posts them to the event loop)."""
Events = list[tuple[Sequence, GenerationEvent | None]]


class GenerationEngine:
    """Owns the decode thread, the waiting queue, the running set and the prefix cache.

    Args:
        decoder: the session adapter.
        limits: admission and batch bounds.
        cache: the prefix cache (used by the decode thread only).
        sink: where each step's events go.
        clock: monotonic seconds (injected: fake-clock tests).
        backend: where keys and values live (default: chosen by the graph's layout).
    """

    def __init__(
        self,
        decoder: DecoderSession,
        limits: EngineLimits,
        cache: PrefixCache,
        sink: StepSink,
        clock: Callable[[], float] = time.perf_counter,
        backend: KvBackend | None = None,
    ) -> None:
        self.decoder = decoder
        self.limits = limits
        self.cache = cache
        self._sink = sink
        self._clock = clock
        self.backend = backend or make_backend(decoder, limits.max_context_len, limits.kv_pool_bytes)
        self._fusing = fusing(self.backend)  # runs decode and first chunk as one (llm/fusion.py)
        self._waiting = WaitingQueue()
        self._prefilling: list[Sequence] = []
        self._order: dict[Sequence, int] = {}
        self._admitted = 0
        self._wake = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._full = False
        self.size = RunningSetSize(limits.max_num_seqs)
        self.cost = StepCostModel(0.005, 0.0002)
        self.max_itl_s = limits.max_itl_ms / 1000.0 or 0.05
        self.planner = PrefillPlanner(limits)
        self.guard = ItlGuard()
        """Scales the target each step's prefill aims at, from the gaps streams saw."""
        self._last_emit: float | None = None
        self.running = 0
        self.steps = 0
        self.kv_bytes = 0
        self.step_seconds = 0.0
        self.preemptions = 0
        self.refused = 0
        self.riding_steps = 0
        """Steps whose first prompt chunk ran with the decode, in one run of the step graph."""
        self.timeline: list[tuple[float, float, int, int, int, int]] | None = None
        """When a list, per step: start, seconds, decoded, prefilled, waiting, prefilling."""

    # -- any thread -----------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def expected_wait_s(self) -> float:
        """What a new request of average size would wait for its first token now."""
        return self._waiting.expected_wait(
            len(self._waiting), 0, self._full, self.planner.wall_token_s(), self._clock()
        )

    def start(self, name: str) -> None:
        if sys.getswitchinterval() > GIL_SWITCH_S:
            sys.setswitchinterval(GIL_SWITCH_S)
        self._thread = threading.Thread(target=self._run, name=f"llm-{name}", daemon=True)
        self._thread.start()

    def submit(self, sequence: Sequence) -> None:
        """Queue a sequence (any thread).

        Raises:
            Overloaded: the queue is full, or the sequence could not get its first token within
                ``max_queue_wait_s`` or its deadline (Retry-After: the excess wait).
        """
        with self._wake:
            try:
                self._waiting.push_within(
                    sequence, self.limits, self._full, self.planner.wall_token_s(), self._clock()
                )
            except Overloaded:
                self.refused += 1
                raise
            self._wake.notify()

    def idle(self) -> bool:
        return not self._waiting and self.running == 0

    def close(self) -> None:
        """Stop the thread after its current step; what it holds ends with "abort"."""
        with self._wake:
            self._closing = True
            self._wake.notify()

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def warm_up(self, prompt_tokens: int = 64, steps: int = 9) -> None:
        """Run prefills and decode steps before the version is ready (not on the thread), and
        take the automatic defaults from their times (:func:`~ortserve.llm.warmup.measure`)."""
        cost = measure(self.decoder, self.limits.max_context_len, prompt_tokens, steps)
        self.tune(cost.one_row_s, cost.prefill_token_s, cost.row_s, cost.chunk_fixed_s, cost.riding_token_s)

    def itl_target_s(self) -> float:
        """``max_itl_ms``, or one from the one-row step and the smallest chunk measured at load
        (:func:`~ortserve.llm.running_set.default_itl_target_s`). Fixed: a target that
        followed the fitted step grew with the batch it was meant to bound (the fit put the
        rows' cost in its intercept, the target rose, more rows came in)."""
        return self.max_itl_s

    def tune(
        self,
        one_row_s: float,
        prefill_token_s: float,
        row_s: float | None = None,
        chunk_fixed_s: float = 0.0,
        riding_token_s: float | None = None,
    ) -> None:
        """Set the cost models' priors and the automatic defaults from measured costs
        (``row_s``: what one more decoding row adds to a step; ``chunk_fixed_s``: what a
        prefill chunk pays whatever its length, ``prefill_token_s`` then the rest per token;
        ``riding_token_s``: a token of a chunk run with the decode)."""
        self.cost = StepCostModel(one_row_s, prefill_token_s, row_s)
        if not self.limits.max_itl_ms:
            smallest = ChunkCost(chunk_fixed_s, prefill_token_s).seconds(MIN_CHUNK_TOKENS)
            self.max_itl_s = default_itl_target_s(one_row_s, smallest)
        self.planner.tune(one_row_s, prefill_token_s, chunk_fixed_s, self.max_itl_s, riding_token_s)

    # -- the decode thread ---------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._waiting and not self._busy() and not self._closing:
                    timeout = self._next_expiry()
                    if not self._wake.wait(timeout) and timeout is not None:
                        self.cache.expire()
                        self._account()
                if self._closing:
                    break
            self.step()
        with self._wake:
            waiting = self._waiting.drain()
        self.running = 0
        self._emit(self._end_all("abort", "the model was unloaded", waiting))

    def _end_all(self, reason: str, error: str, waiting: list[Sequence]) -> Events:
        """End every running sequence, and ``waiting``, with ``reason``; their last events."""
        ended = self.backend.decoding() + self._prefilling + waiting
        for sequence in ended:
            self.backend.release(sequence)
            sequence.abort(reason, error)
        self._prefilling.clear()
        return [(s, s.take_event()) for s in ended]

    def _busy(self) -> bool:
        return bool(self._prefilling) or bool(self.backend.decoding())

    def _next_expiry(self) -> float | None:
        due = self.cache.next_expiry()
        return None if due is None else max(due, 0.0) + 0.01

    def _account(self) -> None:
        self.running = len(self.backend.decoding()) + len(self._prefilling)
        self._waiting.backlog_tokens = sum(s.length - s.kv_tokens for s in self._prefilling)
        self.kv_bytes = self.backend.nbytes + self.cache.bytes_used

    def step(self) -> None:
        """One engine step (the thread's loop body; fake-clock tests call it directly)."""
        started = self._clock()
        events: Events = []
        try:
            with self._wake:
                self._admit(events)
            self._drop_cancelled(events)
            decode_started = self._clock()
            decoded, held, riding = self._decode(events)
            decode_s = self._clock() - decode_started
            prefilled = self._prefill(events, decode_s if decoded else 0.0, riding)
            if riding is not None:  # the decode alone is what the step model learns
                decode_s -= self.planner.riding_cost.seconds(riding.chunk.stop - riding.chunk.start)
        except Exception:
            logger.exception("generation step failed; its sequences end with an error")
            events += self._end_all("error", "internal error in the generation step", [])
            decoded = held = prefilled = 0
            riding = None
            decode_s = 0.0
        elapsed = self._clock() - started
        if self.timeline is not None:
            self.timeline.append(
                (started, elapsed, decoded, prefilled, len(self._waiting), len(self._prefilling))
            )
        if self.size.after_step(decoded, decode_s, self.itl_target_s()):
            self._preempt_newest()  # paused: resumes where it was, as after a memory preemption
        if decoded and riding is None:
            # The decode alone, from steps no chunk rode with: fitted on whole steps, the fit put
            # the cost on the prefill term under overload and predicted 50 rows as cheap as 20; a
            # riding step's run less a chunk price measured at load erred with the chunk's size.
            self.cost.observe(decoded, held, 0, decode_s)
        self._emit(events)
        ended = self._clock()
        if decoded and self._last_emit is not None:
            # What a running stream saw: the previous step's events to this step's.
            self.guard.observe(ended - self._last_emit, self.itl_target_s())
        self._last_emit = ended
        self.steps += 1
        self.step_seconds += elapsed
        self._account()

    def _admit(self, events: Events) -> None:
        """Move waiting sequences into the running set while that pays (lock held)."""
        self._full = False
        self.size.reserve_s = self.planner.smallest_s(self._fusing is not None)
        while self._waiting:
            sequence = self._waiting.peek()
            if sequence.cancelled:
                self._waiting.pop()
                sequence.abort()
                events.append((sequence, sequence.take_event()))
                continue
            running = self.backend.decoding() + self._prefilling
            if self.size.is_full(self.cost, running, sequence, self.itl_target_s()):
                self._full = True
                return
            try:
                self.backend.admit(sequence, sequence.length)
            except KvFull:
                self._full = True
                if running:
                    return
                self._waiting.pop()
                sequence.abort("length", "the prompt does not fit the keys and values budget")
                events.append((sequence, sequence.take_event()))
                continue
            self._waiting.pop()
            self._admitted += 1
            self._order[sequence] = self._admitted
            sequence.admitted_at = self._clock()
            self._prefilling.append(sequence)

    def _drop_cancelled(self, events: Events) -> None:
        for sequence in self.backend.decoding() + self._prefilling:
            if sequence.cancelled:
                self._leave(sequence)
                sequence.abort()
                events.append((sequence, sequence.take_event()))

    def _leave(self, sequence: Sequence) -> None:
        self.backend.release(sequence)
        self._order.pop(sequence, None)
        if sequence in self._prefilling:
            self._prefilling.remove(sequence)

    def _preempt_newest(self, keep: Sequence | None = None) -> bool:
        """Give up the newest decoding sequence's keys and values; it waits at the front."""
        candidates = [s for s in self.backend.decoding() if s is not keep]
        if not candidates:
            return False
        victim = max(candidates, key=lambda s: self._order.get(s, 0))
        self._remember(victim, victim.kv_tokens)
        self._leave(victim)
        victim.kv_tokens = 0
        victim.preempted += 1
        self.preemptions += 1
        self._requeue(victim)
        return True

    def _decode(self, events: Events) -> tuple[int, int, RidingChunk | None]:
        """One token for every decoding row, with the first prompt's chunk in the same run when
        the backend can (:func:`~ortserve.llm.prefill.plan_riding`); returns (rows, the tokens
        they held, the chunk that rode)."""
        while self.backend.decoding():
            try:
                self.backend.grow()
                break
            except KvFull:
                if not self._preempt_newest():
                    raise
        rows = self.backend.decoding()
        if not rows:
            return 0, 0, None
        held = sum(s.length for s in rows)
        riding = ran = None
        if self._prefilling and self._fusing is not None:
            riding = plan_riding(
                self.planner, self.cost, self.cache, rows, held, self._prefilling,
                self.itl_target_s() * self.guard.scale, self._clock(),
            )  # fmt: skip
            ran = ride(self._fusing, riding) if riding is not None else None
        if ran is None:  # no chunk rode (none planned, or no room: the separate prefill preempts)
            riding, (rows, logits) = None, self.backend.decode()
        else:
            rows, logits = ran
            self.riding_steps += 1
        finished = 0
        draws = sample_batch([s.sampler for s in rows], logits)  # one pass for all rows
        for index, sequence in enumerate(rows):
            sequence.kv_tokens = sequence.length
            sequence.accept_draw(draws[index])
            events.append((sequence, sequence.take_event()))
            if sequence.finish_reason is not None:
                finished += 1
                self._remember(sequence, sequence.kv_tokens)
                self._leave(sequence)
        with self._wake:
            self._waiting.finished(finished, self._clock())
        return len(rows), held, riding

    def _prefill(self, events: Events, decode_s: float, riding: RidingChunk | None) -> int:
        """Prefill prompts in admission order, in chunks that fit the step's room (or
        ``prefill_budget`` tokens in all when the chunk is configured or nobody decodes);
        ``riding``: the first chunk, planned before and run with the decode."""
        target_s = self.itl_target_s() * self.guard.scale
        if riding is not None:
            budget, room = riding.budget, riding.room
        else:
            decoding = self.backend.decoding()
            budget, room = self.planner.budget(
                decode_s, self.cost, decoding, self._prefilling, target_s, self._clock()
            )
        done = 0
        for sequence in list(self._prefilling):
            if room is not None and done:  # a further chunk pays its own fixed part
                budget = min(budget, self.planner.chunk_cost.tokens_within(room))
            if budget <= 0:
                break
            if riding is not None and sequence is riding.chunk.sequence and riding.logits is not None:
                chunk, logits = riding.chunk, riding.logits
                start, stop, target = chunk.start, chunk.stop, chunk.target
                if room is not None:  # what the run beyond its prediction took is gone too
                    room = min(room - self.planner.riding_cost.seconds(stop - start), target_s - decode_s)
            else:
                chunk = next_chunk(self.cache, sequence, budget)
                start, stop, target = chunk.start, chunk.stop, chunk.target
                try:
                    began = self._clock()
                    logits = self.backend.prefill(sequence, start, stop, chunk.prefix)
                    self.planner.chunk_cost.observe(stop - start, self._clock() - began)
                except KvFull:
                    sequence.kv_tokens = chunk.before
                    if self._preempt_newest(sequence):
                        break
                    self._leave(sequence)
                    sequence.abort("length", "the sequence does not fit the keys and values budget")
                    events.append((sequence, sequence.take_event()))
                    continue
                if room is not None:
                    room -= self.planner.chunk_cost.seconds(stop - start)
            sequence.kv_tokens = stop
            budget -= stop - start
            done += stop - start
            if stop < target:
                break
            self._prefilling.remove(sequence)
            if sequence.output:
                self.backend.activate(sequence)
                continue
            self._remember(sequence, stop)
            self._fork(sequence, stop, logits, events)
            sequence.accept(logits)
            events.append((sequence, sequence.take_event()))
            if sequence.finish_reason is None:
                self.backend.activate(sequence)
            else:
                self._leave(sequence)
        return done

    def _fork(self, sequence: Sequence, length: int, logits: F32, events: Events) -> None:
        """Start the request's other choices from this prefill (:mod:`~ortserve.llm.forks`)."""
        places = self.limits.max_num_seqs - len(self.backend.decoding()) - len(self._prefilling) - 1
        for fork in start_forks(self.backend, sequence, length, logits, places, self._requeue):
            self._admitted += 1
            self._order[fork] = self._admitted
            events.append((fork, fork.take_event()))
            if fork.finish_reason is None:
                self.backend.activate(fork)
            else:
                self._leave(fork)

    def _requeue(self, sequence: Sequence) -> None:
        with self._wake:
            self._waiting.push(sequence, front=True)

    def _emit(self, pairs: Events) -> None:
        events = [(s, e) for s, e in pairs if e is not None]
        if events:
            self._sink(events)

    def _remember(self, sequence: Sequence, length: int) -> None:
        remember(self.cache, self.backend, sequence, length)
