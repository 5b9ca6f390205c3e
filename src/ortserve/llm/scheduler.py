"""How many sequences run together, and how long a new request would wait: both from measured
step costs, not from configured constants.

- :class:`StepCostModel` learns the seconds of an engine step as a function of its decoding
  rows, the tokens those rows hold and the prompt tokens prefilled in it (a decayed least-squares
  fit, so it follows the machine as its load changes). The rows-squared feature lets it see
  where a wider batch stops paying (caches, memory bandwidth).
- :func:`admit_one_more` lets a waiting sequence into the running set only while that raises
  predicted output tokens/s and keeps the predicted step (the streams' inter-token latency)
  within ``max_itl_s``; ``max_num_seqs`` is only the upper bound.
- :class:`WaitingQueue` orders waiting sequences by priority then arrival, and estimates the
  wait of a newcomer from the measured rate at which running sequences finish.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ortserve.errors import Overloaded
from ortserve.llm.limits import EngineLimits
from ortserve.llm.sequence import Sequence

__all__ = ["HORIZON_TOKENS", "StepCostModel", "WaitingQueue", "admit_one_more", "held_ahead"]

HORIZON_TOKENS = 64
"""Decode steps ahead at which admission prices the running set: every row holds one more
token per step, so a set sized on the tokens held now outgrew its bound as it decoded."""

F64 = npt.NDArray[np.float64]


def _features(rows: int, tokens: int, prefill: int) -> F64:
    return np.array([1.0, rows, tokens / 1000.0, rows * rows / 100.0, prefill / 1000.0])


class StepCostModel:
    """Step seconds ~ a + b·rows + c·held tokens + d·rows² + e·prefilled tokens.

    Args:
        one_row_s: a measured one-row decode step (the prior before any step is seen).
        prefill_token_s: a measured per-token prefill cost (the prior).
        decay: weight kept by old observations at each new one.
    """

    def __init__(
        self, one_row_s: float, prefill_token_s: float, row_s: float | None = None, decay: float = 0.995
    ) -> None:
        self.decay = decay
        # The prior: what a row adds (measured at warm-up, else 0.3 of a one-row step), the rest
        # of a one-row step paid once per step whatever the rows (reading the weights);
        # prefill costs prefill_token_s per token.
        per_row = min(max(row_s if row_s is not None else 0.3 * one_row_s, 0.02 * one_row_s), one_row_s)
        prior = np.array([one_row_s - per_row, per_row, 0.0, 0.0, prefill_token_s * 1000.0])
        self._strength = np.diag([1.0, 1.0, 1.0, 1.0, 1.0]) * 0.5
        self._gram = self._strength.copy()
        self._moment = self._strength @ prior
        # Lasting pulls: the intercept and per-row cost toward the prior (a batch that keeps one
        # width cannot tell them apart, and a fit with all in the intercept admits without end);
        # the rows-squared term toward 0 (a peak of tokens/s must be seen again and again before
        # it stops the running set; one noisy step on a shared machine must not).
        self._ridge = np.diag([2.0, 2.0, 1e-3, 5.0, 1e-3])
        self._anchor = self._ridge @ prior
        self.coef = prior
        # Every term costs time, and a step reads the weights whatever its rows: without these
        # bounds a noisy machine fits a negative intercept, and tokens/s seems to fall with rows.
        # A row costs at least half what warm-up measured: on a core shared with other work the
        # fit put every row's cost in a noisy intercept, predicted the same step for 16 rows as
        # for 40, and the running set grew to the pool's limit (ITL p99 seconds).
        self._lower = np.array([0.3 * one_row_s, 0.5 * per_row, 0.0, 0.0, 0.0])
        self.observed = 0
        self.one_row_s = one_row_s

    def observe(self, rows: int, tokens: int, prefill: int, seconds: float) -> None:
        x = _features(rows, tokens, prefill)
        self._gram = self.decay * self._gram + np.outer(x, x)
        self._moment = self.decay * self._moment + x * seconds
        self.observed += 1
        self.coef = _bounded_solve(self._gram + self._ridge, self._moment + self._anchor, self._lower)

    def predict(self, rows: int, tokens: int, prefill: int = 0) -> float:
        floor = self.one_row_s * 0.5 if rows else 0.0
        return max(float(_features(rows, tokens, prefill) @ self.coef), floor, 1e-6)

    def prefill_token_s(self) -> float:
        return max(float(self.coef[4]) / 1000.0, 1e-7)


def _bounded_solve(gram: F64, moment: F64, lower: F64) -> F64:
    """Least squares from its normal equations with ``coef >= lower`` (a small active set:
    a coefficient below its bound is fixed there and the others are solved again)."""
    free = np.ones(len(lower), dtype=bool)
    coef = lower.copy()
    for _ in range(len(lower)):
        coef = lower.copy()
        if free.any():
            rhs = moment - gram[:, ~free] @ lower[~free]
            coef[free] = np.linalg.solve(gram[np.ix_(free, free)], rhs[free])
        below = free & (coef < lower)
        if not below.any():
            return coef
        free &= ~below
    return np.maximum(coef, lower)


def held_ahead(sequence: Sequence, horizon: int = HORIZON_TOKENS) -> int:
    """Tokens ``sequence`` will hold ``horizon`` decode steps from now (it stops at max_tokens)."""
    left = max(sequence.params.max_tokens - len(sequence.output), 0)
    return sequence.length + min(left, horizon)


def admit_one_more(
    model: StepCostModel, rows: int, tokens: int, joining_tokens: int, max_itl_s: float
) -> bool:
    """Whether one more row of ``joining_tokens`` raises tokens/s within the latency target."""
    if rows == 0:
        return True
    after = model.predict(rows + 1, tokens + joining_tokens)
    if after > max_itl_s:
        return False
    return (rows + 1) / after > rows / model.predict(rows, tokens)


@dataclass(order=True, slots=True)
class _Waiting:
    rank: tuple[int, int]
    sequence: Sequence = field(compare=False)


RATE_SIGMAS = 2.0
"""How far below the measured finish rate a newcomer's wait is priced, in standard errors of
the finishes counted. The fake clock (per-step noise only) held the admitted TTFT p99 within
30 s plus one prefill at 1.3 (a 12% margin: 30.7-30.9 s against 31.0, 5 seeds x 600 s); served,
where the core's speed also drifts by about 10% within minutes, an 80-second run at 2x capacity
admitted a p99 of 32.6 s against 30.35 with it."""
_MIN_RATE_SHARE = 0.5


class WaitingQueue:
    """Waiting sequences, highest priority first, then first come first served."""

    _WINDOW = 128
    """Finishes over which the finish rate is measured."""

    def __init__(self) -> None:
        self._heap: list[_Waiting] = []
        self._order = itertools.count()
        self.tokens = 0
        """Prompt tokens waiting (their prefill is work ahead of a newcomer)."""
        self.backlog_tokens = 0
        """Tokens the sequences already admitted have still to prefill (set by the engine each
        step): a newcomer's first token waits for them too. Left out, served at 1.3x capacity
        with 20 running, admitted TTFT p99 was 31.3-33.9 s against 30 s plus one prefill."""
        self._finishes: deque[tuple[float, int]] = deque()
        self._finished_in_window = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, sequence: Sequence, front: bool = False) -> None:
        """Queue ``sequence``; ``front``: ahead of its priority (a preempted one resumes first)."""
        order = -next(self._order) if front else next(self._order)
        heapq.heappush(self._heap, _Waiting((-sequence.priority, order), sequence))
        self.tokens += sequence.length

    def push_within(
        self, sequence: Sequence, limits: EngineLimits, full: bool, prefill_s: float, now: float
    ) -> None:
        """Queue ``sequence`` unless the queue is at ``max_waiting`` or its expected wait for a
        first token (:meth:`expected_wait`) passes ``max_queue_wait_s`` or its own deadline.

        Raises:
            Overloaded: refused now, with Retry-After the excess wait (1-60 s).
        """
        ahead = self.ahead_of(sequence.priority)
        wait = self.expected_wait(ahead, sequence.length, full, prefill_s, now)
        limit = limits.max_queue_wait_s
        if sequence.deadline is not None:
            limit = min(limit, sequence.deadline - now)
        if len(self) >= limits.max_waiting or (ahead and wait > limit):
            raise Overloaded(
                f"{len(self)} generation requests are waiting; the expected wait for a "
                f"first token is {wait:.1f} s",
                retry_after_s=max(1.0, min(wait - max(limit, 0.0), 60.0)),
            )
        self.push(sequence)

    def peek(self) -> Sequence:
        return self._heap[0].sequence

    def pop(self) -> Sequence:
        sequence = heapq.heappop(self._heap).sequence
        self.tokens -= sequence.length
        return sequence

    def drain(self) -> list[Sequence]:
        items = [w.sequence for w in self._heap]
        self._heap.clear()
        self.tokens = 0
        return items

    def remove_if(self, doomed: list[Sequence]) -> None:
        if not doomed:
            return
        gone = set(map(id, doomed))
        self._heap = [w for w in self._heap if id(w.sequence) not in gone]
        heapq.heapify(self._heap)
        self.tokens = sum(w.sequence.length for w in self._heap)

    def ahead_of(self, priority: int) -> int:
        return sum(1 for w in self._heap if -w.rank[0] >= priority)

    def finished(self, count: int, now: float) -> None:
        """``count`` running sequences finished at ``now`` (the finish rate's window)."""
        if count <= 0:
            return
        self._finishes.append((now, count))
        self._finished_in_window += count
        while len(self._finishes) > 1 and self._finished_in_window - self._finishes[0][1] >= self._WINDOW:
            self._finished_in_window -= self._finishes.popleft()[1]

    def finish_rate(self, now: float) -> float:
        """Running sequences finishing per second over the last ``_WINDOW`` finishes, counted
        up to ``now`` (a stall lowers it); 0 before two finishes. A count over a time span,
        not an average of per-step rates: those are biased high (a mean of 1/gap), and the
        wait they promised was exceeded (admitted TTFT p99 34-42 s against a 30 s bound)."""
        if len(self._finishes) < 2:
            return 0.0
        first = self._finishes[0][0]
        span = max(now, self._finishes[-1][0]) - first
        counted = self._finished_in_window - self._finishes[0][1]
        if span <= 0 or counted <= 0:
            return 0.0
        # The admitted are those whose estimate fell under the bound, so its errors are not
        # even: the rate is taken at its lower bound, RATE_SIGMAS standard errors of the count
        # below the count (18% under at the window's 128 finishes; wider while few are counted).
        return max(_MIN_RATE_SHARE, 1.0 - RATE_SIGMAS / math.sqrt(counted)) * counted / span

    def expected_wait(
        self, ahead: int, prompt_tokens: int, full: bool, prefill_s: float, now: float
    ) -> float:
        """Seconds until a newcomer with ``ahead`` sequences before it gets its first token:
        its own prompt's prefill (``prefill_s`` a token, chunks between decode steps
        included) after, when the running set is full, one finish for each sequence ahead
        and itself; when it is not full, after the prefill of the prompts ahead. Either way
        after what the admitted have still to prefill (:attr:`backlog_tokens`)."""
        own = (prompt_tokens + self.backlog_tokens) * prefill_s
        rate = self.finish_rate(now)
        if not full or rate <= 0:
            return self.tokens * prefill_s + own
        return own + (ahead + 1) / rate
