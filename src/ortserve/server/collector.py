"""Keeping the cyclic garbage collector's full passes short while the server serves."""

from __future__ import annotations

import gc

__all__ = ["freeze_startup_heap"]


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive now to the permanent generation.

    What a started server holds (modules, sessions, the registry, settings) lives as long as
    the process, yet every full (generation 2) collection walks it again. Measured on the
    demo small MLP at concurrency 64 (benchmarks/RESULTS.md, "Overload"): a full collection
    during load took 70 ms of the event loop thread's CPU, every request in flight waiting
    behind it; after freezing, 0.35 ms. Objects made later are collected as usual.

    Returns:
        How many objects are frozen.
    """
    gc.collect()
    gc.freeze()
    gc.enable()  # ``ortserve serve`` starts with it off (cli/main.py)
    return gc.get_freeze_count()
