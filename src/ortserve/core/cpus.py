"""How many CPUs this process may really use: affinity and the cgroup quota, not the host."""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["usable_cpus"]


def _cgroup_quota_cpus(root: Path) -> float | None:
    v2 = root / "cpu.max"
    try:
        quota, period = v2.read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us


def usable_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs available to this process, at least 1.

    A container limited to 1.5 CPUs on a 64-core host gets 2 threads, not 64: oversubscribed
    ONNX Runtime pools spin and wreck tail latency.
    """
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 1
    candidates = [affinity]
    for root in (cgroup_root, cgroup_root / "cpu"):
        quota = _cgroup_quota_cpus(root)
        if quota is not None:
            candidates.append(max(1, math.ceil(quota)))
            break
    return max(1, min(candidates))
