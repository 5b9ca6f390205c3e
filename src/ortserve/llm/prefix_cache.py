"""Prefix KV cache: the keys and values of earlier sequences, found by a hash of their token
prefix, so a request (or a conversation's next turn) that starts the same way prefills only
what is new. Bounded by bytes (least recently used first out) and by a time to live."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["CachedPrefix", "PrefixCache"]

F32 = npt.NDArray[np.float32]


@dataclass(slots=True)
class _Entry:
    tokens: tuple[int, ...]
    kv: list[F32]
    """Per layer and part (key, value): [kv_heads, length, head_dim], length = len(tokens)."""
    nbytes: int
    used_at: float
    hashes: list[int]
    salt: str = ""


@dataclass(frozen=True, slots=True)
class CachedPrefix:
    """A hit: the first ``length`` tokens' keys and values, per layer and part [1, kv, length, hd]."""

    length: int
    kv: list[F32]


class PrefixCache:
    """Block-hashed prefixes of stored sequences.

    Args:
        budget_bytes: most bytes of keys and values held (0 turns the cache off).
        ttl_s: an entry unused for this long is dropped.
        clock: monotonic seconds (injected: tests move time by hand).
        block_tokens: prefixes are matched in whole blocks of this many tokens.

    Used by the engine thread only: no locking.
    """

    def __init__(
        self, budget_bytes: int, ttl_s: float, clock: Callable[[], float], block_tokens: int = 16
    ) -> None:
        self.budget_bytes = budget_bytes
        self.ttl_s = ttl_s
        self.block_tokens = block_tokens
        self._clock = clock
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._by_hash: dict[int, int] = {}
        self._next_id = 0
        self.bytes_used = 0
        self.queries = 0
        self.hits = 0
        self.hit_tokens = 0

    def _block_hashes(self, tokens: Sequence[int], salt: str = "") -> list[int]:
        # The salt seeds the chain: prefixes of different salts never share a hash.
        hashes, running, block = [], hash(("salt", salt)), self.block_tokens
        for end in range(block, len(tokens) + 1, block):
            running = hash((running, tuple(tokens[end - block : end])))
            hashes.append(running)
        return hashes

    def lookup(self, tokens: Sequence[int], salt: str = "") -> CachedPrefix | None:
        """The longest cached prefix of ``tokens`` that leaves at least one token to compute,
        among those stored with the same ``salt`` (a tenant never hits another's prefix, so
        ``cached_tokens`` tells it nothing about other tenants' prompts)."""
        if self.budget_bytes <= 0:
            return None
        self.expire()
        self.queries += 1
        hashes = self._block_hashes(tokens, salt)
        for blocks in range(len(hashes), 0, -1):
            entry_id = self._by_hash.get(hashes[blocks - 1])
            if entry_id is None:
                continue
            entry = self._entries[entry_id]
            length = min(blocks * self.block_tokens, len(tokens) - 1)
            if length <= 0 or entry.salt != salt or entry.tokens[:length] != tuple(tokens[:length]):
                continue
            entry.used_at = self._clock()
            self._entries.move_to_end(entry_id)
            self.hits += 1
            self.hit_tokens += length
            return CachedPrefix(length, [part[None, :, :length] for part in entry.kv])
        return None

    def store(self, tokens: Sequence[int], kv: list[F32], salt: str = "") -> None:
        """Keep ``kv`` ([kv_heads, len(tokens), head_dim] per layer and part) for ``tokens``."""
        if self.budget_bytes <= 0 or len(tokens) < self.block_tokens:
            return
        nbytes = sum(part.nbytes for part in kv)
        if nbytes > self.budget_bytes:
            return
        hashes = self._block_hashes(tokens, salt)
        known = self._by_hash.get(hashes[-1])
        if (
            known is not None
            and len(self._entries[known].tokens) >= len(tokens)
            and self._entries[known].salt == salt
        ):
            self._entries[known].used_at = self._clock()
            self._entries.move_to_end(known)
            return
        entry_id, self._next_id = self._next_id, self._next_id + 1
        self._entries[entry_id] = _Entry(tuple(tokens), kv, nbytes, self._clock(), hashes, salt)
        for h in hashes:
            self._by_hash[h] = entry_id
        self.bytes_used += nbytes
        while self.bytes_used > self.budget_bytes:
            self._drop(next(iter(self._entries)))

    def expire(self) -> None:
        """Drop every entry unused for longer than the time to live."""
        deadline = self._clock() - self.ttl_s
        while self._entries:
            oldest_id, oldest = next(iter(self._entries.items()))
            if oldest.used_at > deadline:
                break
            self._drop(oldest_id)

    def next_expiry(self) -> float | None:
        """Seconds until the least recently used entry expires (None: the cache is empty)."""
        if not self._entries:
            return None
        oldest = next(iter(self._entries.values()))
        return oldest.used_at + self.ttl_s - self._clock()

    def _drop(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        self.bytes_used -= entry.nbytes
        for h in entry.hashes:
            if self._by_hash.get(h) == entry_id:
                del self._by_hash[h]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.queries if self.queries else 0.0
