"""How much prompt prefill one engine step carries beside its decode, and what a chunk costs.

A step's length is every running stream's inter-token gap, so the prefill it carries is bounded
by the latency target ``max_itl``. Within that bound two aims pull apart: the gap's spread (a
step with a chunk against one without: ITL p99 / p50) and the prompts' time to first token (the
share of the core prefill gets). The room follows the prompts' need:

- **calm** (no prompt has been waiting beyond what its own prefill takes at the calm pace):
  a step that prefills is at most ``1 + prefill_share`` decode steps of the width the running
  set is heading for, so the slow steps stay within a small multiple of the plain ones;
- **behind** (the oldest prompt has waited longer than that): all the slack between the
  target and the decode step, so the queue of prompts drains at the fastest pace the streams'
  target allows. A fixed share of 1.5 held prefill to 60% of the core however long the
  prompts had waited, and the closed loop's TTFT p99 rose from 1.72 s to 2.14 s on the fake
  clock (RESULTS.md); the slack alone gives it back while no step exceeds the target.

A chunk's cost is fitted as ``fixed + per_token · tokens`` (:class:`ChunkCost`): each chunk
reads all the weights once whatever its length, so a step that prefills two prompts pays that
twice. Priced per token at the average, a step with two chunks overran the target by the
second chunk's fixed part (ITL p99 154 ms against a 145 ms target).
"""

from __future__ import annotations

from collections.abc import Sequence as Rows
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ortserve.llm import limits as shares
from ortserve.llm.kv_backend import KvFull, PooledBackend
from ortserve.llm.kv_reuse import cached_start
from ortserve.llm.limits import MIN_CHUNK_TOKENS, EngineLimits
from ortserve.llm.prefix_cache import PrefixCache
from ortserve.llm.scheduler import StepCostModel
from ortserve.llm.sequence import Sequence

__all__ = [
    "Chunk",
    "ChunkCost",
    "PrefillPlanner",
    "RidingChunk",
    "next_chunk",
    "plan_riding",
    "prefill_room",
    "ride",
]

F64 = npt.NDArray[np.float64]
F32 = npt.NDArray[np.float32]


@dataclass(slots=True)
class Chunk:
    """The next chunk of ``sequence``'s prefill: tokens ``start .. stop-1`` of the ``target``
    its prefill reads (``prefix``: cached keys and values it starts from; ``before``: its
    ``kv_tokens`` to restore if the chunk cannot run)."""

    sequence: Sequence
    start: int
    stop: int
    target: int
    before: int
    prefix: list[F32] | None


def next_chunk(cache: PrefixCache, sequence: Sequence, budget: int) -> Chunk:
    """At most ``budget`` tokens of ``sequence``'s prefill from where it stands; a first chunk
    starts past the longest prefix the cache holds (moving its ``kv_tokens`` there)."""
    target = sequence.prefill_target
    before = sequence.kv_tokens
    prefix = cached_start(cache, sequence, target) if before == 0 else None
    start = sequence.kv_tokens
    return Chunk(sequence, start, min(target, start + budget), target, before, prefix)


@dataclass(slots=True)
class RidingChunk:
    """A step's first prompt chunk, planned before the decode to run with it as one graph run,
    with the step's prefill ``budget`` and ``room`` it was planned in."""

    chunk: Chunk
    budget: int
    room: float | None
    logits: F32 | None = None
    """The chunk's last token's logits, once it ran."""


class ChunkCost:
    """Seconds of one prefill chunk ~ ``fixed + per_token · tokens`` (decayed least squares).

    Args:
        fixed_s: the part paid once per chunk (the prior; about a one-row decode step).
        token_s: the part paid per prompt token (the prior).
        decay: weight kept by old observations at each new one.
    """

    def __init__(self, fixed_s: float, token_s: float, decay: float = 0.98) -> None:
        self.decay = decay
        prior = np.array([max(fixed_s, 0.0), max(token_s, 1e-7)])
        # The prior weighs as a twentieth of a chunk: chunks of one length cannot separate the two parts,
        # and the fit then keeps the prior's split while it follows their total.
        self._ridge = np.diag([0.05, 0.05 * 64.0**2])
        self._anchor = self._ridge @ prior
        self._gram = np.zeros((2, 2))
        self._moment = np.zeros(2)
        self.coef: F64 = prior

    @property
    def fixed_s(self) -> float:
        return float(self.coef[0])

    @property
    def token_s(self) -> float:
        return float(self.coef[1])

    def observe(self, tokens: int, seconds: float) -> None:
        x = np.array([1.0, float(tokens)])
        self._gram = self.decay * self._gram + np.outer(x, x)
        self._moment = self.decay * self._moment + x * seconds
        coef = np.linalg.solve(self._gram + self._ridge, self._moment + self._anchor)
        if coef[0] < 0.0:  # a noisy core can fit a negative fixed part; a chunk is never free
            coef = np.array([0.0, max(self._moment[1] + self._anchor[1], 0.0)])
            coef[1] /= self._gram[1, 1] + self._ridge[1, 1]
        self.coef = np.array([coef[0], max(coef[1], 1e-7)])

    def seconds(self, tokens: int) -> float:
        return self.fixed_s + self.token_s * tokens if tokens > 0 else 0.0

    def tokens_within(self, seconds: float) -> int:
        """Prompt tokens one chunk can prefill in ``seconds`` (0 when not even its fixed part)."""
        return max(0, int((seconds - self.fixed_s) / self.token_s))


def prefill_room(plain_s: float, heading_s: float, decode_s: float, target_s: float, share: float) -> float:
    """Seconds of prefill a step may carry beside its decode: at most ``1 + share`` decode
    steps of the width the running set is heading for, and no step beyond the target.

    Args:
        plain_s: the predicted decode step of the rows decoding now.
        heading_s: the predicted decode step once the prefilling rows have joined.
        decode_s: the decode step just run. The step is bounded by ``target_s`` on it; the
            share is priced on the prediction, so a decode stretched by a neighbour on a
            shared core does not stretch the prefill after it.
        target_s: the streams' inter-token latency target.
        share: the prefill allowed, in decode steps of ``heading_s`` (the calm share, or the
            larger one when a prompt is behind).
    """
    return max(min((1.0 + share) * heading_s - plain_s, target_s - decode_s), 0.0)


class PrefillPlanner:
    """Each step's prefill budget: the chunk cost, the calm or behind share, the room.

    Args:
        limits: the engine's bounds (``prefill_chunk_tokens``, ``prefill_tokens_per_step``,
            the two shares).
    """

    def __init__(self, limits: EngineLimits) -> None:
        self.limits = limits
        self.chunk_cost = ChunkCost(0.0, 0.0002)
        """What a prefill chunk costs (fitted on the chunks run)."""
        self.riding_cost = ChunkCost(0.0, 0.0002)
        """What a chunk adds to the decode it rides with (one run of the step graph): no fixed
        part, and a token costs less than alone (0.29-0.32 ms against 0.37 on the 30.6M
        decoder). Measured at warm-up, not fitted: a step's decode and its chunk are timed as
        one, and either's share could be fitted only against the other's guess."""
        self.chunk_tokens = limits.prefill_chunk_tokens or 256
        """The prefill budget of the last step (the automatic one follows the decode time)."""
        self.behind = 0
        """Steps that gave prefill the larger share (a prompt was behind)."""

    def tune(
        self,
        one_row_s: float,
        token_s: float,
        chunk_fixed_s: float,
        target_s: float,
        riding_token_s: float | None = None,
    ) -> None:
        """The chunk costs' priors (a riding chunk's token: ``token_s`` when not measured), and
        the first budget (a one-row set's calm room)."""
        self.chunk_cost = ChunkCost(chunk_fixed_s, token_s)
        self.riding_cost = ChunkCost(0.0, riding_token_s or token_s)
        calm = prefill_room(one_row_s, one_row_s, one_row_s, target_s, self.limits.prefill_share)
        self.chunk_tokens = self.limits.prefill_chunk_tokens or max(
            MIN_CHUNK_TOKENS, self.chunk_cost.tokens_within(calm)
        )

    def smallest_s(self, riding: bool) -> float:
        """What the smallest chunk adds to a step: riding with the decode, or run on its own."""
        return (self.riding_cost if riding else self.chunk_cost).seconds(MIN_CHUNK_TOKENS)

    def token_s(self) -> float:
        """Seconds a prompt token costs in a chunk of the last step's size (fixed part shared)."""
        return self.chunk_cost.token_s + self.chunk_cost.fixed_s / max(self.chunk_tokens, MIN_CHUNK_TOKENS)

    def wall_token_s(self) -> float:
        """Wall seconds a prompt token takes to prefill while streams decode, at the calm pace:
        its own cost, plus the decode steps its chunks share (a chunk is at most
        ``prefill_share`` of a step; more when a prompt is behind, so this is an upper bound)."""
        return self.token_s() * (1.0 + 1.0 / self.limits.prefill_share)

    def budget(
        self,
        decode_s: float,
        cost: StepCostModel,
        decoding: Rows[Sequence],
        prefilling: Rows[Sequence],
        target_s: float,
        now: float,
        riding: bool = False,
    ) -> tuple[int, float | None]:
        """Prompt tokens this step prefills at most, and the seconds of room they must fit
        (None: a token budget alone). ``prefill_chunk_tokens`` when configured; with nobody
        decoding, ``prefill_tokens_per_step`` (no stream to protect); else what
        :func:`prefill_room` leaves, at least :data:`MIN_CHUNK_TOKENS` (``riding``: the first
        chunk runs with the decode and pays no fixed part; ``decode_s`` is then predicted).

        Args:
            decode_s: the decode step just run (0: nobody decoded).
            cost: the engine's decode-step model.
            decoding: the rows decoding now; ``prefilling``: the prompts being prefilled.
            target_s: the streams' inter-token latency target.
            now: the engine clock.
        """
        budget, room = self.limits.prefill_chunk_tokens, None
        if not budget:
            budget = self.limits.prefill_tokens_per_step
            if decode_s > 0:
                room = self._room_s(decode_s, cost, decoding, prefilling, target_s, now)
                fits = (self.riding_cost if riding else self.chunk_cost).tokens_within(room)
                budget = max(MIN_CHUNK_TOKENS, min(budget, fits))
        self.chunk_tokens = budget
        return budget, room

    def _room_s(
        self,
        decode_s: float,
        cost: StepCostModel,
        decoding: Rows[Sequence],
        prefilling: Rows[Sequence],
        target_s: float,
        now: float,
    ) -> float:
        held = sum(s.length for s in decoding)
        plain = cost.predict(len(decoding), held)
        heading = plain
        if prefilling:
            joining = sum(s.length for s in prefilling)
            heading = max(plain, cost.predict(len(decoding) + len(prefilling), held + joining))
        # Behind: a prompt prefilling since its admission for longer than its own prefill takes
        # at the calm pace (BEHIND times it).
        pace = shares.BEHIND * self.wall_token_s()
        behind = any(now - s.admitted_at > pace * (len(s.prompt) - s.kv_tokens) for s in prefilling)
        self.behind += behind
        share = self.limits.behind_share if behind else self.limits.prefill_share
        return prefill_room(plain, heading, decode_s, target_s, share)


def plan_riding(
    planner: PrefillPlanner,
    cost: StepCostModel,
    cache: PrefixCache,
    decoding: Rows[Sequence],
    held: int,
    prefilling: Rows[Sequence],
    target_s: float,
    now: float,
) -> RidingChunk | None:
    """The first prompt's chunk of a step whose decode it rides with (one run of the step
    graph, the weights read once: on its own a chunk paid 6-8 ms more), planned on the
    decode's prediction since it runs before the decode is measured; None when it would be
    empty. Looks the prompt up in the prefix cache (moving its ``kv_tokens`` past a hit).

    Args:
        decoding: the rows decoding this step, holding ``held`` tokens.
        prefilling: the prompts being prefilled, oldest first (the first rides).
        target_s: the step the plan aims at (the ITL target times the guard's scale).
    """
    predicted = cost.predict(len(decoding), held)
    budget, room = planner.budget(predicted, cost, decoding, prefilling, target_s, now, riding=True)
    chunk = next_chunk(cache, prefilling[0], budget)
    if chunk.stop <= chunk.start:
        chunk.sequence.kv_tokens = chunk.before
        return None
    return RidingChunk(chunk, budget, room)


def ride(backend: PooledBackend, riding: RidingChunk) -> tuple[list[Sequence], F32] | None:
    """Run the decode with ``riding``'s chunk as one run: the decoding rows and their logits
    (the chunk's in ``riding.logits``), or None when the pool has no room for the chunk (its
    sequence's ``kv_tokens`` put back; nothing ran)."""
    chunk = riding.chunk
    try:
        rows, logits, riding.logits = backend.decode_with_chunk(
            chunk.sequence, chunk.start, chunk.stop, chunk.prefix
        )
    except KvFull:
        chunk.sequence.kv_tokens = chunk.before
        return None
    return rows, logits
