"""A slot pool of keys and values that GroupQueryAttention reads and writes in place.

One buffer per layer and part (key, value), shaped ``[slots, kv_heads, capacity, head_dim]``.
A sequence takes a slot when it starts prefilling and keeps it until it leaves: its tokens sit
at ``[slot, :, 0:length]`` (right-padded, as ``seqlens_k`` expects), and each step's new keys
and values are written after them by the attention node itself (``past_present_share_buffer``).

Decoding rows occupy slots ``0 .. decoding-1`` so that one step feeds the contiguous view
``buffer[0:decoding]``; rows still prefilling sit after them. When a row leaves, the last row of
its group moves into its place: one row's tokens are copied, never the batch's. The buffers
grow (slots doubling, capacity by half again, in 64-token granules) only when a row needs
more than they hold, within a byte budget; that reallocation is the only whole-pool copy, and
it happens a logarithmic number of times. They are dropped when the pool empties.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["KvFull", "KvPool"]

F32 = npt.NDArray[np.float32]

_GRANULE = 64


class KvFull(Exception):
    """The pool cannot hold what was asked within its byte budget."""


def _round_up(value: int, granule: int) -> int:
    return -(-value // granule) * granule


class KvPool:
    """Slots of keys and values; used by the engine thread only.

    Args:
        parts: tensors per token (2 per layer).
        kv_heads: key/value heads.
        head_dim: size of one head.
        max_len: tokens a row may hold at most (the context).
        budget_bytes: the buffers' bytes at most.
    """

    def __init__(self, parts: int, kv_heads: int, head_dim: int, max_len: int, budget_bytes: int) -> None:
        self.parts = parts
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.max_len = max_len
        self.budget_bytes = budget_bytes
        self.token_bytes = parts * kv_heads * head_dim * 4
        self.buffers: list[F32] = []
        self.slots = 0
        self.capacity = 0
        self.generation = 0
        """Bumped at every reallocation (cached views of the buffers are stale then)."""
        self._owners: list[object] = []
        self._index: dict[object, int] = {}
        self.lengths: list[int] = []
        """Tokens held per used slot (what the owner said it wrote)."""
        self.decoding = 0

    # -- accounting ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._owners)

    def __contains__(self, owner: object) -> bool:
        return owner in self._index

    @property
    def nbytes(self) -> int:
        return self.slots * self.capacity * self.token_bytes

    def bytes_for(self, slots: int, capacity: int) -> int:
        return slots * capacity * self.token_bytes

    def fits(self, rows: int, longest: int) -> bool:
        """Whether ``rows`` rows of up to ``longest`` tokens fit the budget at all."""
        return self.bytes_for(rows, _round_up(min(longest, self.max_len), _GRANULE)) <= self.budget_bytes

    def slot(self, owner: object) -> int:
        return self._index[owner]

    def owners(self, start: int, stop: int) -> list[object]:
        return self._owners[start:stop]

    # -- taking and giving back slots ---------------------------------------------
    def take(self, owner: object, length: int) -> int:
        """A slot for a new (prefilling) row that will hold ``length`` tokens.

        Raises:
            KvFull: the budget cannot hold one more row of that length.
        """
        self.reserve(len(self._owners) + 1, max(length, self.longest()))
        index = len(self._owners)
        self._owners.append(owner)
        self.lengths.append(0)
        self._index[owner] = index
        return index

    def longest(self) -> int:
        return max(self.lengths, default=0)

    def reserve(self, rows: int, length: int) -> None:
        """Grow the buffers so ``rows`` rows of ``length`` tokens fit.

        Raises:
            KvFull: beyond the budget or the context.
        """
        if length > self.max_len:
            raise KvFull(f"{length} tokens exceed the context of {self.max_len}")
        if rows <= self.slots and length <= self.capacity:
            return
        slots = max(rows, self.slots)
        capacity = max(length, self.capacity)
        wanted_slots = slots if slots <= self.slots else max(slots, 2 * self.slots, 4)
        wanted_cap = (
            capacity if capacity <= self.capacity else max(capacity, self.capacity + self.capacity // 2)
        )
        wanted_cap = min(_round_up(wanted_cap, _GRANULE), _round_up(self.max_len, _GRANULE))
        # The whole context when the budget allows: np.empty maps pages lazily, so capacity
        # no row uses costs no memory, and the pool never grows (copies) for length again.
        if self.bytes_for(wanted_slots, _round_up(self.max_len, _GRANULE)) <= self.budget_bytes:
            wanted_cap = _round_up(self.max_len, _GRANULE)
        if self.bytes_for(wanted_slots, wanted_cap) > self.budget_bytes:
            wanted_cap = min(_round_up(capacity, _GRANULE), _round_up(self.max_len, _GRANULE))
            # As many slots as the budget holds (not one more at a time: past half the budget,
            # every admission copied the whole pool, seconds each on a busy core).
            most = self.budget_bytes // max(self.bytes_for(1, wanted_cap), 1)
            wanted_slots = max(slots, min(wanted_slots, most))
        if self.bytes_for(wanted_slots, wanted_cap) > self.budget_bytes:
            raise KvFull(
                f"{rows} rows of {length} tokens need {self.bytes_for(wanted_slots, wanted_cap)} bytes "
                f"of keys and values; the pool's budget is {self.budget_bytes}"
            )
        self._reallocate(wanted_slots, wanted_cap)

    def _reallocate(self, slots: int, capacity: int) -> None:
        used, held = len(self._owners), self.longest()
        fresh = []
        for part in range(self.parts):
            buffer = np.empty((slots, self.kv_heads, capacity, self.head_dim), dtype=np.float32)
            if self.buffers and used:
                buffer[:used, :, :held] = self.buffers[part][:used, :, :held]
            fresh.append(buffer)
        self.buffers, self.slots, self.capacity = fresh, slots, capacity
        self.generation += 1

    def activate(self, owner: object) -> None:
        """A prefilled row starts decoding: it moves to the end of the decoding group."""
        index = self._index[owner]
        if index < self.decoding:
            return
        self._swap(index, self.decoding)
        self.decoding += 1

    def release(self, owner: object) -> None:
        """The row leaves; the last row of its group (and of the prefilling group) fills its place."""
        index = self._index[owner]
        if index < self.decoding:
            self._swap(index, self.decoding - 1)
            self.decoding -= 1
            index = self.decoding
        last = len(self._owners) - 1
        self._swap(index, last)
        self._owners.pop()
        self.lengths.pop()
        del self._index[owner]
        if not self._owners:
            self.buffers, self.slots, self.capacity = [], 0, 0
            self.generation += 1

    def _swap(self, a: int, b: int) -> None:
        if a == b:
            return
        la, lb = self.lengths[a], self.lengths[b]
        for buffer in self.buffers:
            keep = buffer[a, :, :la].copy()
            buffer[a, :, :lb] = buffer[b, :, :lb]
            buffer[b, :, :la] = keep
        self._owners[a], self._owners[b] = self._owners[b], self._owners[a]
        self.lengths[a], self.lengths[b] = lb, la
        self._index[self._owners[a]] = a
        self._index[self._owners[b]] = b

    # -- contents -----------------------------------------------------------------
    def set_length(self, owner: object, length: int) -> None:
        self.lengths[self._index[owner]] = length

    def write(self, owner: object, kv: list[F32], length: int) -> None:
        """Copy ``kv`` ([kv_heads, >= length, head_dim] per part) as the row's first tokens."""
        index = self._index[owner]
        for buffer, part in zip(self.buffers, kv, strict=True):
            buffer[index, :, :length] = part[:, :length]
        self.lengths[index] = length

    def copy_row(self, source: int, target: int, length: int) -> None:
        """Tokens ``0 .. length-1`` of slot ``source`` onto slot ``target`` (a fork's prompt)."""
        for buffer in self.buffers:  # rows are written in place by the graph: a copy each
            buffer[target, :, :length] = buffer[source, :, :length]

    def read(self, owner: object, length: int) -> list[F32]:
        """A copy of the row's first ``length`` tokens ([kv_heads, length, head_dim] per part)."""
        index = self._index[owner]
        return [np.ascontiguousarray(buffer[index, :, :length]) for buffer in self.buffers]

    def view(self, start: int, stop: int) -> list[F32]:
        """Rows ``start .. stop-1`` of every buffer: contiguous, what the graph reads and writes."""
        return [buffer[start:stop] for buffer in self.buffers]
