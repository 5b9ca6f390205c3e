"""The engine's scheduling on a fake clock and a synthetic step-cost model: the running set stops
growing where tokens/s peaks, overload queues then refuses with 429 (never a slower batch), and
sequences preempted for memory resume with the greedy tokens they would have had alone."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from ortserve.errors import InvalidField, Overloaded
from ortserve.llm.demo import train_tokenizer
from ortserve.llm.engine import PREFILL_SHARE, EngineLimits, GenerationEngine
from ortserve.llm.itl_guard import ItlGuard
from ortserve.llm.kv_backend import DecoderSession, KvFull
from ortserve.llm.limits import BEHIND_SHARE
from ortserve.llm.prefill import ChunkCost, PrefillPlanner
from ortserve.llm.prefix_cache import PrefixCache
from ortserve.llm.sampler import SamplingParams
from ortserve.llm.scheduler import StepCostModel
from ortserve.llm.sequence import GenerationEvent, Sequence
from ortserve.llm.servable import engine_rank, request_priority
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

    def fork(self, parent: Sequence, child: Sequence, length: int) -> None:
        if sum(self.held.values()) + length > self.capacity:
            raise KvFull("full")
        self.held[child] = length  # a prefilling row, as KvPool.take makes it (activated later)

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


class _ShapedBackend(_FakeBackend):
    """Costs shaped like the 30.6M decoder's on one core (bench_llm_sim.py): a decode step
    12 ms + 2.2 ms a row + 1 us a held token, a prefill chunk 12 ms + 0.95 ms a token."""

    def prefill(self, sequence: Sequence, start: int, stop: int, prefix: list[F32] | None) -> F32:
        self.clock.now += 0.012 + 0.00095 * (stop - start)
        self.held[sequence] = stop
        return _logits(sequence.tokens[:stop])

    def decode(self) -> tuple[list[Sequence], F32]:
        held = sum(s.length for s in self.rows)
        self.clock.now += 0.012 + 0.0022 * len(self.rows) + 0.000001 * held - self.step_s(len(self.rows))
        return super().decode()


def _mixed(tokenizer: TextTokenizer, rng: np.random.Generator) -> Sequence:
    prompt = [int(t) for t in rng.integers(3, _VOCAB, int(rng.integers(16, 513)))]
    params = SamplingParams(max_tokens=int(rng.integers(16, 257)), temperature=0.0, ignore_eos=True)
    return Sequence(prompt, params, tokenizer, (), 4096)


def _shaped_engine(
    clock: _Clock, backend: _FakeBackend, max_queue_wait_s: float = 30.0, max_itl_ms: float = 0.0
) -> GenerationEngine:
    limits = EngineLimits(
        max_num_seqs=64, max_waiting=256, max_context_len=4096, max_queue_wait_s=max_queue_wait_s,
        max_itl_ms=max_itl_ms,
    )  # fmt: skip
    engine = GenerationEngine(
        backend.decoder, limits, PrefixCache(0, 1.0, clock), lambda _: None, clock, backend
    )
    engine.tune(0.0145, 0.00114, 0.0022)  # as warm-up measures them (one row, a token, a row)
    return engine


def _stamps(engine: GenerationEngine, clock: _Clock) -> dict[Sequence, list[float]]:
    """Each sequence's token times (the sink is called at the end of each step)."""
    stamps: dict[Sequence, list[float]] = {}

    def sink(events: list[tuple[Sequence, GenerationEvent]]) -> None:
        for sequence, event in events:
            stamps.setdefault(sequence, []).extend([clock.now] * len(event.token_ids))

    engine._sink = sink
    return stamps


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _closed_loop(
    tokenizer: TextTokenizer, streams: int, seconds: float
) -> tuple[float, list[float], list[float]]:
    """16 clients, each sending its next request when the last ends: (output tokens/s after a
    fifth of the time, the inter-token gaps, the times to first token)."""
    clock = _Clock()
    backend = _ShapedBackend(clock)
    engine = _shaped_engine(clock, backend)
    stamps = _stamps(engine, clock)
    rng = np.random.default_rng(1)
    arrival: dict[Sequence, float] = {}
    live: list[Sequence] = []
    while clock.now < seconds:
        live = [s for s in live if s.finish_reason is None]
        while len(live) < streams:
            sequence = _mixed(tokenizer, rng)
            engine.submit(sequence)
            arrival[sequence] = clock.now
            live.append(sequence)
        engine.step()
    start = seconds / 5
    tokens = sum(1 for times in stamps.values() for t in times if t >= start)
    gaps = [b - a for times in stamps.values() for a, b in itertools.pairwise(times) if b >= start]
    ttft = [times[0] - arrival[s] for s, times in stamps.items() if arrival[s] >= start]
    return tokens / (clock.now - start), gaps, ttft


def test_a_step_that_prefills_is_within_its_share_of_the_streams_plain_steps(
    tokenizer: TextTokenizer,
) -> None:
    # Closed loop, mixed lengths, a loose latency target (1 s): the old rule gave several
    # waiting prompts all the target in one step (ITL p99 / p50 about 9 on the served model).
    clock = _Clock()
    backend = _ShapedBackend(clock)
    limits = EngineLimits(max_num_seqs=64, max_waiting=256, max_context_len=4096, max_itl_ms=1000.0)
    engine = GenerationEngine(
        backend.decoder, limits, PrefixCache(0, 1.0, clock), lambda _: None, clock, backend
    )
    engine.tune(0.0145, 0.00114, 0.0022)
    stamps = _stamps(engine, clock)
    rng = np.random.default_rng(2)
    live: list[Sequence] = []
    while clock.now < 60.0:
        live = [s for s in live if s.finish_reason is None]
        while len(live) < 16:
            sequence = _mixed(tokenizer, rng)
            engine.submit(sequence)
            live.append(sequence)
        engine.step()
    gaps = [b - a for times in stamps.values() for a, b in itertools.pairwise(times) if b >= 10.0]
    assert _pct(gaps, 0.99) <= 3.0 * _pct(gaps, 0.5), (_pct(gaps, 0.5), _pct(gaps, 0.99))
    assert max(gaps) <= (1.0 + PREFILL_SHARE) * _pct(gaps, 0.5) * 1.5


def test_open_loop_at_twice_capacity_keeps_the_closed_loop_tokens_per_second(
    tokenizer: TextTokenizer,
) -> None:
    closed, _, _ = _closed_loop(tokenizer, 16, 100.0)
    clock = _Clock()
    backend = _ShapedBackend(clock)
    engine = _shaped_engine(clock, backend, max_queue_wait_s=10.0)
    stamps = _stamps(engine, clock)
    rng = np.random.default_rng(3)
    rate = 2.0 * closed / 136.0  # requests/s: the mean output is 136 tokens
    arrival: dict[Sequence, float] = {}
    refused: list[Overloaded] = []
    next_at, stop = 0.0, 100.0
    while clock.now < stop:
        while next_at <= clock.now:
            sequence = _mixed(tokenizer, rng)
            try:
                engine.submit(sequence)
                arrival[sequence] = next_at
            except Overloaded as error:
                refused.append(error)
            next_at += float(rng.exponential(1.0 / rate))
        if engine.idle():
            clock.now = next_at
            continue
        engine.step()
    while not engine.idle():
        engine.step()
    start = 20.0  # a queue builds first, as the closed loop's clients start together
    tokens = sum(1 for times in stamps.values() for t in times if start <= t <= stop)
    assert tokens / (stop - start) >= 0.95 * closed
    assert refused and all(r.retry_after_s is not None and r.retry_after_s >= 1 for r in refused)
    assert all(s.finish_reason == "length" for s in arrival)  # every admitted one completes
    # Admitted ones get their first token within max_queue_wait and one (chunked) prefill.
    ttft = [stamps[s][0] - at for s, at in arrival.items()]
    assert _pct(ttft, 0.99) <= 10.0 + 512 * 0.00114 * (1 + 1 / PREFILL_SHARE) + 0.5


def test_a_lane_is_served_before_later_lanes_and_first_come_first_served_within_it(
    tokenizer: TextTokenizer,
) -> None:
    clock = _Clock()
    backend = _FakeBackend(clock)
    limits = EngineLimits(max_num_seqs=1, max_waiting=100, max_context_len=4096, prefill_chunk_tokens=512)
    engine = GenerationEngine(
        backend.decoder, limits, PrefixCache(0, 1.0, clock), lambda _: None, clock, backend
    )
    engine.tune(0.011, 0.0001, 0.001)
    lanes = [2, 0, 2, 1, 3, 0]  # classic models' numbers: 0 the default (1), 1 the most urgent
    sequences = []
    for seed, lane in enumerate(lanes):
        sequence = _sequence(tokenizer, seed, 3)
        sequence.priority = engine_rank(lane)
        engine.submit(sequence)
        sequences.append(sequence)
    order: list[int] = []
    while engine.waiting or backend.rows or engine.running:
        engine.step()
        order += [i for i, s in enumerate(sequences) if s.finish_reason is not None and i not in order]
    # Lane 1 (0 and 1, in order of arrival), then lane 2, then 3.
    assert order == [1, 3, 5, 0, 2, 4]


def test_a_request_priority_is_a_lane_number_as_for_classic_models() -> None:
    assert request_priority({}) == 0 and request_priority({"priority": None}) == 0
    assert request_priority({"priority": 2}) == 2
    for bad in (-1, 1.5, "1", True, 10_001):
        with pytest.raises(InvalidField):
            request_priority({"priority": bad})
    assert engine_rank(0) == engine_rank(1) > engine_rank(2) > engine_rank(3)


def test_no_step_of_a_closed_loop_outlasts_the_latency_target(tokenizer: TextTokenizer) -> None:
    # The default target (ten one-row steps, 145 ms here) and prompts falling behind: prefill
    # takes the slack up to the target, priced as a chunk costs (12 ms each, then per token).
    # Priced per token at the average, a step with two chunks overran it (ITL p99 154-156 ms).
    _, gaps, ttft = _closed_loop(tokenizer, 16, 120.0)
    assert max(gaps) <= 0.145 * 1.005, max(gaps)  # the old pricing: 147 ms here
    assert _pct(ttft, 0.5) < 1.0  # the prompts' queue is no backlog


def test_a_chunk_cost_fit_separates_the_fixed_part_from_the_per_token_one() -> None:
    cost = ChunkCost(0.0, 0.00114)  # the prior: all per token, as a 64-token warm-up saw it
    for tokens in itertools.islice(itertools.cycle([32, 90, 17, 64, 200, 8]), 300):
        cost.observe(tokens, 0.012 + 0.00095 * tokens)
    assert cost.fixed_s == pytest.approx(0.012, rel=0.05)
    assert cost.token_s == pytest.approx(0.00095, rel=0.05)
    assert cost.tokens_within(0.012 + 0.00095 * 80) in (79, 80)
    assert cost.tokens_within(0.005) == 0


def test_a_prompt_behind_its_calm_pace_gets_the_larger_share_never_past_the_target(
    tokenizer: TextTokenizer,
) -> None:
    planner = PrefillPlanner(EngineLimits(max_itl_ms=1000.0))
    planner.tune(0.0145, 0.00095, 0.012, 1.0)
    cost = StepCostModel(0.0145, 0.00114, 0.0022)
    decoding = [_sequence(tokenizer, seed, 10) for seed in range(8)]
    prompt = _sequence(tokenizer, 99, 10)
    prompt.admitted_at = 10.0
    plain = cost.predict(8, sum(s.length for s in decoding))
    heading = cost.predict(9, sum(s.length for s in [*decoding, prompt]))
    _, calm = planner.budget(plain, cost, decoding, [prompt], 1.0, now=10.0)
    _, late = planner.budget(plain, cost, decoding, [prompt], 1.0, now=20.0)
    assert calm == pytest.approx((1 + PREFILL_SHARE) * heading - plain)
    assert late == pytest.approx((1 + BEHIND_SHARE) * heading - plain) and planner.behind == 1
    _, tight = planner.budget(plain, cost, decoding, [prompt], 0.05, now=20.0)
    assert tight == pytest.approx(0.05 - plain)  # the target bounds the step, on the decode just run


class _NoisyBackend(_ShapedBackend):
    """The shaped costs on a shared core: each decode and chunk takes 1 ± 0.1 of its mean
    (seeded), so a step planned to end at the target overruns it when its chunk runs long."""

    def __init__(self, clock: _Clock, seed: int) -> None:
        super().__init__(clock)
        self.rng = np.random.default_rng(seed)
        self.slower = 1.0

    def _noisy(self, before: float) -> None:
        spent = self.clock.now - before
        self.clock.now = before + spent * self.slower * max(0.5, float(self.rng.normal(1.0, 0.1)))

    def prefill(self, sequence: Sequence, start: int, stop: int, prefix: list[F32] | None) -> F32:
        before = self.clock.now
        out = super().prefill(sequence, start, stop, prefix)
        self._noisy(before)
        return out

    def decode(self) -> tuple[list[Sequence], F32]:
        before = self.clock.now
        out = super().decode()
        self._noisy(before)
        return out


def _open_loop(
    tokenizer: TextTokenizer,
    backend: _NoisyBackend,
    rate: float,
    stop: float,
    overhead_s: float,
    max_itl_ms: float = 0.0,
) -> tuple[GenerationEngine, dict[Sequence, list[float]], dict[Sequence, float]]:
    """Poisson arrivals at ``rate``/s until ``stop``, then drained; handing out each event costs
    ``overhead_s`` that no cost model times (the event loop's share of a served core)."""
    clock = backend.clock
    assert isinstance(clock, _Clock)
    engine = _shaped_engine(clock, backend, max_queue_wait_s=10.0, max_itl_ms=max_itl_ms)
    stamps = _stamps(engine, clock)
    record = engine._sink

    def sink(events: list[tuple[Sequence, GenerationEvent]]) -> None:
        clock.now += overhead_s * len(events)
        record(events)

    engine._sink = sink
    rng = np.random.default_rng(4)
    arrival: dict[Sequence, float] = {}
    next_at = 0.0
    while clock.now < stop:
        while next_at <= clock.now:
            sequence = _mixed(tokenizer, rng)
            try:
                engine.submit(sequence)
                arrival[sequence] = next_at
            except Overloaded:
                pass
            next_at += float(rng.exponential(1.0 / rate))
        if engine.idle():
            clock.now = next_at
            continue
        engine.step()
    while not engine.idle():
        engine.step()
    return engine, stamps, arrival


def test_running_streams_gaps_stay_within_the_target_when_steps_run_longer_than_planned(
    tokenizer: TextTokenizer,
) -> None:
    # Issue 35: served ITL p99 67-69 ms against a 61 ms target. With prompts waiting, every
    # step's prefill was planned to end at the target on a chunk's mean cost, so about half
    # the steps overran it (the old engine here: 38% of gaps beyond, p99 1.13 x the target).
    backend = _NoisyBackend(_Clock(), seed=5)
    engine, stamps, arrival = _open_loop(tokenizer, backend, 2.0, 100.0, 0.0002)
    gaps = [b - a for times in stamps.values() for a, b in itertools.pairwise(times) if b >= 20.0]
    target = engine.itl_target_s()
    assert _pct(gaps, 0.99) <= target, (_pct(gaps, 0.99), target)
    assert sum(g > target for g in gaps) <= 0.01 * len(gaps)
    assert all(s.finish_reason == "length" for s in arrival)


def test_a_tight_configured_target_costs_rows_not_its_p99(tokenizer: TextTokenizer) -> None:
    # Issue 35: with the decode grown to half the target and a 32-token chunk (42 ms here)
    # beside it, a step came to 0.9 of a 100 ms target and its slower tenth passed it (the old
    # engine here: ITL p99 above the target). The set now leaves the chunk room at the tail.
    backend = _NoisyBackend(_Clock(), seed=7)
    engine, stamps, arrival = _open_loop(tokenizer, backend, 2.0, 100.0, 0.0002, max_itl_ms=100.0)
    gaps = [b - a for times in stamps.values() for a, b in itertools.pairwise(times) if b >= 20.0]
    assert engine.itl_target_s() == 0.1
    assert _pct(gaps, 0.99) <= 0.1, _pct(gaps, 0.99)
    assert all(s.finish_reason == "length" for s in arrival)


def test_a_set_whose_decode_outgrows_its_bound_pauses_its_newest_and_they_resume_greedy(
    tokenizer: TextTokenizer,
) -> None:
    # The core slows to 2.5x after 30 s: the running set sized for the fast core decodes
    # beyond half the target for good (the old engine: no sequence ever left it early).
    backend = _NoisyBackend(_Clock(), seed=6)
    clock = backend.clock
    assert isinstance(clock, _Clock)
    engine = _shaped_engine(clock, backend, max_queue_wait_s=1000.0)
    widths: list[tuple[float, int, int]] = []
    rng = np.random.default_rng(7)
    submitted: list[Sequence] = []
    for _ in range(120):
        sequence = _mixed(tokenizer, rng)
        engine.submit(sequence)
        submitted.append(sequence)
    while not engine.idle():
        if clock.now > 30.0:
            backend.slower = 2.5
        engine.step()
        widths.append((clock.now, len(backend.rows), engine.waiting))
    assert engine.preemptions > 0
    before = [w for t, w, waiting in widths if 15.0 <= t <= 30.0 and waiting]
    after = [w for t, w, waiting in widths if t >= 60.0 and waiting]
    assert after and float(np.median(after)) < float(np.median(before)), (before[-1], after[:5])
    assert all(s.finish_reason == "length" for s in submitted)
    # Paused ones resume with the greedy tokens they would have had alone.
    for sequence in submitted[::10]:
        alone_clock = _Clock()
        alone_backend = _FakeBackend(alone_clock)
        alone_engine = _engine(alone_clock, alone_backend)
        again = Sequence(sequence.prompt, sequence.params, tokenizer, (), 4096)
        alone_engine.submit(again)
        while again.finish_reason is None:
            alone_engine.step()
        assert again.output == sequence.output


def test_the_itl_guard_cuts_its_scale_on_overruns_and_climbs_back_when_they_stop() -> None:
    guard = ItlGuard(over=0.004, down=0.03, floor=0.4, margin=0.0)
    for _ in range(20):
        guard.observe(0.2, 0.1)
    assert guard.scale == pytest.approx(0.97**20) and guard.beyond == 20
    for _ in range(2000):
        guard.observe(0.2, 0.1)
    assert guard.scale == pytest.approx(0.4)  # never below the floor
    for _ in range(200_000):
        guard.observe(0.05, 0.1)
    assert guard.scale == 1.0
    # Overruns in 1 of 250 gaps (the tracked share) hold the scale where it is.
    for step in range(25_000):
        guard.observe(0.2 if step % 250 == 0 else 0.05, 0.1)
    assert 0.9 <= guard.scale <= 1.0
