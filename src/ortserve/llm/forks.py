"""A request's other choices (``n`` > 1) start from its prefill: a copy of its keys and values
and their first tokens sampled from its logits in one pass, not a prefill each.

A choice with no place (the running set at ``max_num_seqs``, or no room for its row) waits at
the front of the queue and prefills as any request, through the prefix cache.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ortserve.llm.kv_backend import F32, KvBackend, KvFull
from ortserve.llm.sampler import sample_batch
from ortserve.llm.sequence import Sequence

__all__ = ["start_forks"]


def start_forks(
    backend: KvBackend,
    sequence: Sequence,
    length: int,
    logits: F32,
    places: int,
    requeue: Callable[[Sequence], None],
) -> list[Sequence]:
    """Start ``sequence``'s forks from its first ``length`` tokens and their last ``logits``;
    at most ``places`` of them, the rest ``requeue`` d. Returns those started, each with its
    first token drawn (their events to take; activate or release them)."""
    forks, sequence.forks = sequence.forks, []
    started: list[Sequence] = []
    for fork in forks:
        try:
            if fork.cancelled or len(started) >= places:
                raise KvFull("no place for another choice now")
            backend.fork(sequence, fork, length)
        except KvFull:
            requeue(fork)
            continue
        fork.kv_tokens, fork.cached_tokens = length, sequence.cached_tokens
        started.append(fork)
    if started:
        draws = sample_batch([f.sampler for f in started], np.repeat(logits[None], len(started), axis=0))
        for fork, draw in zip(started, draws, strict=True):
            fork.accept_draw(draw)
    return started
