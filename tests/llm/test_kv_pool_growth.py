"""The slot pool grows by whole steps even when doubling no longer fits its budget: it takes all
the slots the budget holds at once, instead of one more slot (a whole-pool copy) per admission,
which cost seconds per admitted row past 32 rows on a busy core (open loop at 2x capacity)."""

from __future__ import annotations

import pytest

from ortserve.llm.kv_pool import KvFull, KvPool


def test_past_half_the_budget_the_pool_grows_once_to_all_it_can_hold() -> None:
    token_bytes = 2 * 1 * 4 * 4  # parts x kv heads x head dim x float32
    pool = KvPool(2, 1, 4, 64, budget_bytes=50 * 64 * token_bytes)  # 50 full-context slots
    for _ in range(32):
        pool.take(object(), 10)
    before = pool.generation
    for _ in range(18):
        pool.take(object(), 10)
    assert pool.generation - before == 1  # 32 -> 50 slots in one reallocation
    assert pool.slots == 50 and pool.nbytes <= pool.budget_bytes
    with pytest.raises(KvFull):
        pool.take(object(), 10)
