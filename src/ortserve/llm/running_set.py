"""How large the engine's running set may be: when a waiting sequence may join, and when the
newest must be paused because the measured decode has outgrown its bound.

Kept apart from the engine's step so the rule is one piece with its own state (the widest step
measured, the run of steps beyond the bound, the room kept for the smallest prefill chunk) and
can be read and tested without a decoder.
"""

from __future__ import annotations

from ortserve.llm.scheduler import StepCostModel, admit_one_more, held_ahead
from ortserve.llm.sequence import Sequence

__all__ = ["SHRINK_AFTER", "STEP_TAIL", "RunningSetSize", "default_itl_target_s"]

SHRINK_AFTER = 8
"""Consecutive decode steps beyond the growth bound (by a quarter) before the newest sequence
is paused: one slow step on a shared core must not cost a sequence its place."""

_FLOOR_ROWS = 4
"""A few rows always run, whatever the fit says."""

STEP_TAIL = 1.25
"""How much longer than its predicted mean a step runs at its p99. Measured on one core in
ONNX Runtime alone: the same 10-12 rows and 32-token chunk took 30-42 ms (p10-p99, median
32), so a set sized for a predicted step at the target ran past it on every slower step."""


def default_itl_target_s(one_row_s: float, smallest_chunk_s: float) -> float:
    """The latency target when none is configured: ten one-row steps, and never less than a
    target that holds a decode of half of it plus the smallest prefill chunk with the steps'
    tail (:data:`STEP_TAIL`), so the growth bound is still half the target. Ten one-row steps
    alone gave 38-46 ms on the 30.6M decoder, while its smallest chunk takes 16-18 ms: the
    decode grew to half the target, a step with a chunk came to 0.85-0.9 of it, and ITL p99
    passed it by 1-6 ms in half the served phases."""
    return max(10.0 * one_row_s, smallest_chunk_s / (1.0 / STEP_TAIL - 0.5), 0.02)


class RunningSetSize:
    """The running set's size rule for one engine (``max_num_seqs`` the upper bound)."""

    def __init__(self, max_num_seqs: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.floor = min(max_num_seqs, _FLOOR_ROWS)
        self.explored = 0
        """The widest decode step measured."""
        self.decode_over = 0
        """Consecutive steps whose measured decode exceeded the growth bound by a quarter."""
        self.reserve_s = 0.0
        """What the smallest prefill chunk costs (the engine sets it from its fit): every step
        carries one while a prompt is being read, so the decode must leave room for it."""

    def growth_bound_s(self, itl_target_s: float) -> float:
        """The decode step the running set may grow to: half the latency target, and less when
        a step of that decode plus the smallest prefill chunk, at the steps' tail
        (:data:`STEP_TAIL`), would pass the target (a tight configured target costs rows, not
        its p99). The rest of the target is room for a prefill chunk as large as the decode
        (PREFILL_SHARE), so newcomers' prompts are read at the pace rows leave; a set grown to
        the whole target would starve them."""
        return max(min(itl_target_s / 2.0, itl_target_s / STEP_TAIL - self.reserve_s), 0.0)

    def is_full(
        self, cost: StepCostModel, running: list[Sequence], joining: Sequence, itl_target_s: float
    ) -> bool:
        """Whether ``joining`` must wait: the set is at ``max_num_seqs`` or half again past the
        widest step measured (the cost model has seen nothing wider, and the peak of tokens/s
        may lie in between), or one more row would not raise predicted tokens/s within the
        growth bound. Rows are priced at the tokens they will hold a horizon ahead, not now:
        each holds one more per step, and a set sized on today's tokens outgrew its bound. The
        set does not grow while the decode has been beyond its bound for ``SHRINK_AFTER``
        steps: a bound enforced on every noisy step held the served set at 17 rows and tokens/s
        at 0.84 of the closed loop's."""
        rows = len(running)
        explore = max(_FLOOR_ROWS, self.explored + self.explored // 2)
        if rows >= min(self.max_num_seqs, explore):
            return True
        if rows < self.floor:
            return False
        if self.decode_over >= SHRINK_AFTER:
            return True
        held = sum(held_ahead(s) for s in running)
        bound = self.growth_bound_s(itl_target_s)
        return not admit_one_more(cost, rows, held, held_ahead(joining), bound)

    def after_step(self, decoded: int, decode_s: float, itl_target_s: float) -> bool:
        """Record a step's decode; whether the newest sequence must be paused now. That is when
        the measured decode has stayed beyond the growth bound by a quarter for more than
        ``SHRINK_AFTER`` steps: the rows grew (each holds a token more per step) or the core
        slowed, and nothing else would ever take the set back. At most one a step; the set
        stays shut until a decode is back in bound."""
        self.explored = max(self.explored, decoded)
        if not decoded or decode_s <= 1.25 * self.growth_bound_s(itl_target_s):
            self.decode_over = 0
            return False
        self.decode_over += 1
        return self.decode_over > SHRINK_AFTER and decoded > self.floor
