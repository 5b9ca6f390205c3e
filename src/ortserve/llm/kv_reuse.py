"""What the engine takes from and gives to the prefix cache: where a sequence's prefill can
start (keys and values another request already computed) and what a sequence leaves behind
when its prompt is read, it finishes or it is paused.

Apart from the engine's step so the rules that decide a hit (a prefix strictly shorter than the
target, so the last token's logits are always computed) and what counts as a cached token for
usage (only a first prefill's, not a resumption's) sit beside each other.
"""

from __future__ import annotations

from ortserve.llm.kv_backend import KvBackend
from ortserve.llm.prefix_cache import F32, PrefixCache
from ortserve.llm.sequence import Sequence

__all__ = ["cached_start", "remember"]


def cached_start(cache: PrefixCache, sequence: Sequence, target: int) -> list[F32] | None:
    """The cached keys and values ``sequence`` can start its prefill of ``target`` tokens from
    (its ``kv_tokens`` moved past them), or None; records the prompt tokens served from cache."""
    prefix = None
    hit = cache.lookup(sequence.tokens[:target], sequence.cache_salt)
    if hit is not None and hit.length < target:
        prefix = [part[0] for part in hit.kv]
        sequence.kv_tokens = hit.length
    if not sequence.output and not sequence.preempted:
        sequence.cached_tokens = sequence.kv_tokens
    return prefix


def remember(cache: PrefixCache, backend: KvBackend, sequence: Sequence, length: int) -> None:
    """Offer the sequence's first ``length`` tokens' keys and values to the prefix cache."""
    if cache.budget_bytes > 0 and length >= cache.block_tokens:
        cache.store(sequence.tokens[:length], backend.read(sequence, length), sequence.cache_salt)
