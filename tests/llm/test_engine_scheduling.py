"""The engine's scheduling on a fake clock and a synthetic step-cost model: the running set stops
growing where tokens/s peaks, overload queues then refuses with 429 (never a slower batch), and
sequences preempted for memory resume with the greedy tokens they would have had alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from ortserve.errors import Overloaded
from ortserve.llm.demo import train_tokenizer
from ortserve.llm.engine import EngineLimits, GenerationEngine
from ortserve.llm.kv_backend import DecoderSession, KvFull
from ortserve.llm.prefix_cache import PrefixCache
from ortserve.llm.sampler import SamplingParams
from ortserve.llm.sequence import Sequence
from ortserve.llm.tokenizer import TextTokenizer

_VOCAB = 50
F32 = npt.NDArray[np.float32]


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _logits(tokens: list[int]) -> F32:
    """A deterministic 'model': the next token is a function of the last three."""
    out = np.zeros(_VOCAB, dtype=np.float32)
    out[(sum(tokens[-3:]) * 31 + 7) % (_VOCAB - 3) + 3] = 10.0
    return out


class _FakeBackend:
    """Keys and values as token counts; each run moves the fake clock by the synthetic cost
    ``step_s(rows)`` (decode) or ``prefill_s`` per token; memory holds ``capacity`` tokens."""

    def __init__(self, clock: _Clock, capacity: int = 1 << 30) -> None:
        self.decoder: DecoderSession = None  # type: ignore[assignment]
        self.clock = clock
        self.capacity = capacity
        self.rows: list[Sequence] = []
        self.held: dict[Sequence, int] = {}

    @staticmethod
    def step_s(rows: int) -> float:
        return 0.010 + 0.001 * rows + 0.0001 * rows * rows  # tokens/s peaks at 10 rows

    @property
    def nbytes(self) -> int:
        return sum(self.held.values())

    def admit(self, sequence: Sequence, length: int) -> None:
        if sum(self.held.values()) + length > self.capacity:
            raise KvFull("full")
        self.held[sequence] = 0

    def prefill(self, sequence: Sequence, start: int, stop: int, prefix: list[F32] | None) -> F32:
        if sum(self.held.values()) - self.held[sequence] + stop > self.capacity:
            raise KvFull("full")
        self.clock.now += 0.0001 * (stop - start)
        self.held[sequence] = stop
        return _logits(sequence.tokens[:stop])

    def activate(self, sequence: Sequence) -> None:
        self.rows.append(sequence)

    def grow(self) -> None:
        if sum(self.held.values()) + len(self.rows) > self.capacity:
            raise KvFull("full")

    def decode(self) -> tuple[list[Sequence], F32]:
        self.clock.now += self.step_s(len(self.rows))
        for sequence in self.rows:
            self.held[sequence] = sequence.length
        return list(self.rows), np.stack([_logits(s.tokens) for s in self.rows])

    def release(self, sequence: Sequence) -> None:
        self.held.pop(sequence, None)
        if sequence in self.rows:
            self.rows.remove(sequence)

    def read(self, sequence: Sequence, length: int) -> list[F32]:
        return []

    def decoding(self) -> list[Sequence]:
        return list(self.rows)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    folder: Path = tmp_path_factory.mktemp("tok")
    train_tokenizer(["the quick brown fox jumps over the lazy dog"], _VOCAB).save(
        str(folder / "tokenizer.json")
    )
    return TextTokenizer(folder, {})


def _engine(
    clock: _Clock, backend: _FakeBackend, max_queue_wait_s: float = 600.0, max_waiting: int = 10_000
) -> GenerationEngine:
    limits = EngineLimits(
        max_num_seqs=64, max_waiting=max_waiting, max_context_len=4096, prefill_chunk_tokens=512,
        max_itl_ms=1000.0, max_queue_wait_s=max_queue_wait_s,
    )  # fmt: skip
    engine = GenerationEngine(
        backend.decoder, limits, PrefixCache(0, 1.0, clock), lambda _: None, clock, backend
    )
    # As warm-up measures them: a one-row step and what each further row adds.
    engine.tune(backend.step_s(1), 0.0001, (backend.step_s(8) - backend.step_s(1)) / 7)
    return engine


def _sequence(tokenizer: TextTokenizer, seed: int, max_tokens: int) -> Sequence:
    prompt = [int(t) for t in np.random.default_rng(seed).integers(3, _VOCAB, 20)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return Sequence(prompt, params, tokenizer, (), 4096)


def test_the_running_set_stops_growing_where_tokens_per_second_peaks(tokenizer: TextTokenizer) -> None:
    clock = _Clock()
    backend = _FakeBackend(clock)
    engine = _engine(clock, backend)
    for seed in range(300):
        engine.submit(_sequence(tokenizer, seed, 40))
    widths = []
    while engine.waiting or backend.rows or engine.running:
        engine.step()
        widths.append(len(backend.rows))
    settled = widths[len(widths) // 3 : 2 * len(widths) // 3]
    assert 7 <= float(np.median(settled)) <= 14, np.median(settled)
    assert max(widths) < 30  # never everything at once


def test_overload_queues_then_refuses_with_retry_after_never_a_slower_batch(tokenizer: TextTokenizer) -> None:
    clock = _Clock()
    backend = _FakeBackend(clock)
    engine = _engine(clock, backend, max_queue_wait_s=3.0)
    admitted: list[Sequence] = []
    refusals: list[Overloaded] = []
    seed = 0
    widths: list[int] = []
    for _ in range(1500):
        for _ in range(2):  # about four times what the engine finishes per step
            seed += 1
            sequence = _sequence(tokenizer, seed, 40)
            try:
                engine.submit(sequence)
                admitted.append(sequence)
            except Overloaded as refused:
                refusals.append(refused)
        engine.step()
        widths.append(len(backend.rows))
    while engine.waiting or backend.rows or engine.running:
        engine.step()
    assert refusals and all(r.retry_after_s is not None and r.retry_after_s >= 1 for r in refusals)
    assert engine.waiting == 0 and all(s.finish_reason == "length" for s in admitted)
    # The batch settles at the peak of tokens/s however much waits; it never widens with load.
    assert float(np.median(widths[len(widths) // 2 :])) <= 14
    assert max(widths) <= 24


def test_sequences_preempted_for_memory_resume_with_their_greedy_tokens(tokenizer: TextTokenizer) -> None:
    clock = _Clock()
    alone = []
    for seed in range(12):
        backend = _FakeBackend(clock)
        engine = _engine(clock, backend)
        sequence = _sequence(tokenizer, seed, 60)
        engine.submit(sequence)
        while sequence.finish_reason is None:
            engine.step()
        alone.append(sequence.output)
    backend = _FakeBackend(clock, capacity=300)  # 12 x 80 tokens do not fit: they take turns
    engine = _engine(clock, backend)
    together = [_sequence(tokenizer, seed, 60) for seed in range(12)]
    for sequence in together:
        engine.submit(sequence)
    for _ in range(20_000):
        if all(s.finish_reason is not None for s in together):
            break
        engine.step()
    assert engine.preemptions > 0
    assert [s.output for s in together] == alone
    assert backend.nbytes == 0
