"""The generation engine: one decode thread per LLM version, continuous batching.

At every step boundary the thread drops sequences whose clients went away, prefills the
requests waiting (reusing cached prefixes), lets them join the running batch, runs one decode
step for the whole batch and hands each sequence's new text to the event loop in one call.
Finished sequences leave at once; nobody waits for the longest request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ortserve.errors import Overloaded
from ortserve.llm.batch import DecodeBatch
from ortserve.llm.layout import DecoderLayout
from ortserve.llm.prefix_cache import PrefixCache
from ortserve.llm.sequence import GenerationEvent, Sequence

__all__ = ["DecoderSession", "EngineLimits", "GenerationEngine", "StepSink"]

logger = logging.getLogger(__name__)

F32 = npt.NDArray[np.float32]
StepSink = Callable[[list[tuple[Sequence, GenerationEvent]]], None]
"""Receives, on the engine thread, every event of one step (posts them to the event loop)."""


class DecoderSession:
    """Feeds an ONNX Runtime session in the Optimum layout.

    Args:
        session: an ``onnxruntime.InferenceSession`` (typed loosely: its stubs are absent).
        layout: the graph's checked signature.
    """

    def __init__(self, session: object, layout: DecoderLayout) -> None:
        self._session = session
        self.layout = layout
        self._past_names = [
            f"past_key_values.{layer}.{part}" for layer in range(layout.layers) for part in ("key", "value")
        ]
        self.run_seconds = 0.0
        """Time spent inside ONNX Runtime's ``run`` (against the engine's step time: its overhead)."""

    @property
    def parts(self) -> int:
        return len(self._past_names)

    def empty_past(self, rows: int) -> list[F32]:
        shape = (rows, self.layout.kv_heads, 0, self.layout.head_dim)
        return [np.zeros(shape, dtype=np.float32) for _ in self._past_names]

    def run(
        self,
        ids: npt.NDArray[np.int64],
        positions: npt.NDArray[np.int64],
        mask: npt.NDArray[np.int64],
        past: list[F32],
    ) -> tuple[F32, list[F32]]:
        """Logits of the last position of each row, and the present keys and values."""
        feeds: dict[str, object] = {"input_ids": ids, "attention_mask": mask}
        if self.layout.has_position_ids:
            feeds["position_ids"] = positions
        if self.layout.has_cache_branch:
            feeds["use_cache_branch"] = np.array([past[0].shape[2] > 0])
        feeds.update(zip(self._past_names, past))
        started = time.perf_counter()
        outputs = self._session.run(list(self.layout.output_names), feeds)  # type: ignore[attr-defined]
        self.run_seconds += time.perf_counter() - started
        return outputs[0][:, -1, :], list(outputs[1:])


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """Bounds of one engine (from the model's ``llm`` config)."""

    max_num_seqs: int = 16
    """Sequences decoding together at most."""
    max_waiting: int = 64
    """Requests waiting for a place at most; beyond, 429."""
    max_context_len: int = 2048
    prefill_tokens_per_step: int = 2048
    """Prompt tokens prefilled between two decode steps at most (at least one request)."""


class GenerationEngine:
    """Owns the decode thread, the waiting queue, the running batch and the prefix cache.

    Args:
        decoder: the session adapter.
        limits: admission and batch bounds.
        cache: the prefix cache (used by the decode thread only).
        sink: where each step's events go.
    """

    def __init__(
        self, decoder: DecoderSession, limits: EngineLimits, cache: PrefixCache, sink: StepSink
    ) -> None:
        self.decoder = decoder
        self.limits = limits
        self.cache = cache
        self._sink = sink
        self._batch = DecodeBatch(decoder.parts, decoder.layout.kv_heads, decoder.layout.head_dim)
        self._waiting: deque[Sequence] = deque()
        self._wake = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self.running = 0
        self.steps = 0
        self.kv_bytes = 0
        self.step_seconds = 0.0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def start(self, name: str) -> None:
        self._thread = threading.Thread(target=self._run, name=f"llm-{name}", daemon=True)
        self._thread.start()

    def submit(self, sequence: Sequence) -> None:
        """Queue a sequence (any thread).

        Raises:
            Overloaded: ``max_waiting`` requests are already waiting.
        """
        with self._wake:
            if len(self._waiting) >= self.limits.max_waiting:
                raise Overloaded(
                    f"{len(self._waiting)} generation requests are already waiting", retry_after_s=1.0
                )
            self._waiting.append(sequence)
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

    def warm_up(self, prompt_tokens: int = 8, steps: int = 2) -> None:
        """Run prefills and a batched decode before the version is ready (not on the thread)."""
        ids = np.ones((2, prompt_tokens), dtype=np.int64)
        positions = np.tile(np.arange(prompt_tokens, dtype=np.int64), (2, 1))
        _, past = self.decoder.run(ids, positions, np.ones_like(ids), self.decoder.empty_past(2))
        for step in range(steps):
            total = prompt_tokens + step + 1
            _, past = self.decoder.run(
                ids[:, :1], positions[:, :1] + total - 1, np.ones((2, total), dtype=np.int64), past
            )
        # Warm-up is no engine step: its model time must not count in the steps' share of
        # ONNX Runtime (it made model_run_seconds exceed engine_step_seconds on a fresh server).
        self.decoder.run_seconds = 0.0

    # -- the decode thread ---------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._waiting and not self._batch.rows and not self._closing:
                    self._wake.wait()
                if self._closing:
                    break
                admitted = self._admit()
            try:
                self._step(admitted)
            except Exception:
                logger.exception("generation step failed; its sequences end with an error")
                failed = self._batch.rows + admitted
                self._batch.keep([])
                for sequence in failed:
                    sequence.abort("error", "internal error in the generation step")
                self._emit([(s, s.take_event()) for s in failed])
            self.running = len(self._batch)
            self.kv_bytes = self._batch.nbytes + self.cache.bytes_used
        with self._wake:
            left = self._batch.rows + list(self._waiting)
            self._waiting.clear()
        self._batch.keep([])
        self.running = 0
        for sequence in left:
            sequence.abort("abort", "the model was unloaded")
        self._emit([(s, s.take_event()) for s in left])

    def _admit(self) -> list[Sequence]:
        room = self.limits.max_num_seqs - len(self._batch)
        admitted: list[Sequence] = []
        budget = self.limits.prefill_tokens_per_step
        while self._waiting and room > 0 and (not admitted or budget > 0):
            sequence = self._waiting.popleft()
            admitted.append(sequence)
            room -= 1
            budget -= len(sequence.prompt)
        return admitted

    def _emit(self, pairs: list[tuple[Sequence, GenerationEvent | None]]) -> None:
        events = [(s, e) for s, e in pairs if e is not None]
        if events:
            self._sink(events)

    def _step(self, admitted: list[Sequence]) -> None:
        started = time.perf_counter()
        events: list[tuple[Sequence, GenerationEvent | None]] = []
        kept = []
        for index, sequence in enumerate(self._batch.rows):
            if sequence.cancelled:
                sequence.abort()
                events.append((sequence, sequence.take_event()))
            else:
                kept.append(index)
        self._batch.keep(kept)
        joining = []
        for sequence in admitted:
            if sequence.cancelled:
                sequence.abort()
            else:
                kv = self._prefill(sequence)
                if sequence.finish_reason is None:
                    joining.append((sequence, kv))
            events.append((sequence, sequence.take_event()))
        self._batch.join(joining)
        if self._batch.rows:
            events.extend(self._decode())
        self._emit(events)
        self.steps += 1
        self.step_seconds += time.perf_counter() - started

    def _prefill(self, sequence: Sequence) -> list[F32]:
        tokens = sequence.prompt
        hit = self.cache.lookup(tokens)
        start = 0 if hit is None else hit.length
        past = self.decoder.empty_past(1) if hit is None else hit.kv
        sequence.cached_tokens = start
        ids = np.array([tokens[start:]], dtype=np.int64)
        positions = np.arange(start, len(tokens), dtype=np.int64)[None]
        logits, present = self.decoder.run(ids, positions, np.ones((1, len(tokens)), dtype=np.int64), past)
        self._remember(tokens, [part[0] for part in present])
        sequence.accept(logits[0])
        return present

    def _decode(self) -> list[tuple[Sequence, GenerationEvent | None]]:
        ids, positions, mask = self._batch.feeds()
        logits, present = self.decoder.run(ids, positions, mask, self._batch.kv)
        self._batch.advance(present, mask)
        events: list[tuple[Sequence, GenerationEvent | None]] = []
        kept = []
        for index, sequence in enumerate(self._batch.rows):
            sequence.accept(logits[index])
            events.append((sequence, sequence.take_event()))
            if sequence.finish_reason is None:
                kept.append(index)
            elif self.cache.budget_bytes > 0:
                kv = self._batch.row_kv(index)  # every token but one just sampled has them
                self._remember(sequence.tokens[: kv[0].shape[1]], kv)
        self._batch.keep(kept)
        return events

    def _remember(self, tokens: list[int], kv: list[F32]) -> None:
        """Offer ``kv`` ([kv, len(tokens), hd] per part) to the prefix cache."""
        if self.cache.budget_bytes > 0:
            self.cache.store(tokens, kv)
