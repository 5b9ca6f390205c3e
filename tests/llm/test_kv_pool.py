"""The KV slot pool: rows keep their tokens through any order of joins, activations and leaves,
decoding rows stay contiguous, the budget holds, and nothing leaks."""

from __future__ import annotations

import numpy as np
import pytest

from ortserve.llm.kv_pool import KvFull, KvPool


def _pattern(owner: int, length: int) -> np.ndarray:
    return (
        np.full((2, length, 4), float(owner), dtype=np.float32)
        + np.arange(length, dtype=np.float32)[None, :, None]
    )


def test_ten_thousand_joins_and_leaves_keep_every_row_and_leak_nothing() -> None:
    pool = KvPool(parts=2, kv_heads=2, head_dim=4, max_len=300, budget_bytes=64 << 20)
    rng = np.random.default_rng(0)
    live: dict[int, int] = {}
    joined = 0
    for _ in range(10_000):
        if live and (rng.random() < 0.5 or len(live) >= 24):
            owner = int(rng.choice(list(live)))
            if rng.random() < 0.5 and pool.slot(owner) >= pool.decoding:
                pool.activate(owner)
            else:
                pool.release(owner)
                del live[owner]
        else:
            joined += 1
            length = int(rng.integers(1, 300))
            pool.take(joined, length)
            pool.write(joined, [_pattern(joined, length)] * 2, length)
            live[joined] = length
        assert len(pool) == len(live)
        assert all(pool.slot(o) < pool.decoding for o in pool.owners(0, pool.decoding))
    for owner, length in live.items():
        for part in pool.read(owner, length):
            np.testing.assert_array_equal(part, _pattern(owner, length))
    assert pool.nbytes <= pool.budget_bytes
    for owner in list(live):
        pool.release(owner)
    assert len(pool) == 0 and pool.nbytes == 0 and pool.decoding == 0


def test_the_pool_refuses_beyond_its_budget_and_its_context() -> None:
    pool = KvPool(parts=2, kv_heads=1, head_dim=4, max_len=128, budget_bytes=2 * 64 * 2 * 4 * 4)
    pool.take("a", 64)
    pool.take("b", 64)
    with pytest.raises(KvFull):
        pool.take("c", 64)
    with pytest.raises(KvFull):
        pool.reserve(2, 129)
    assert pool.nbytes <= pool.budget_bytes
