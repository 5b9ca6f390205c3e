"""A version found by a re-scan is complete only when its copier says so (``ortserve.complete``
written after every other file), not when its files merely stop changing."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from external_weights import ROWS, write_external_version
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.repository.snapshot import COMPLETE_MARKER, snapshot_model
from ortserve.repository.watcher import RepositoryWatcher
from ortserve.settings import ServerSettings


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[LifecycleManager]:
    (tmp_path / "models").mkdir()
    manager = LifecycleManager(ModelRegistry(), ServerSettings(tmp_path / "models", intra_op_threads=1))
    try:
        yield manager
    finally:
        await manager.close(5.0)


def _answer(manager: LifecycleManager) -> tuple[str, float]:
    served = manager.registry.resolve("m", None)
    outputs, _ = served.runner.run_blocking({"x": np.ones((1, ROWS), np.float32)})  # type: ignore[attr-defined]
    return served.info.version, float(outputs[0][0, 0])


async def test_a_preallocated_copy_stalled_mid_way_is_never_served(
    manager: LifecycleManager, tmp_path: Path
) -> None:
    """rsync --preallocate, aria2 and torrent clients give the file its final size first: a
    stalled copy looks settled (same names, sizes, mtimes), was served within a second answering
    zeros, and the latest policy retired the good version."""
    root = tmp_path / "models"
    write_external_version(root, "m", 1, 1.0)
    watcher = RepositoryWatcher(manager, "poll", 1.0)
    watcher.seed(await manager.start())
    assert _answer(manager) == ("1", 64.0)
    source = write_external_version(tmp_path / "elsewhere", "m", 2, 2.0)
    target = root / "m" / "2"
    target.mkdir()
    (target / "model.onnx").write_bytes((source / "model.onnx").read_bytes())
    weights = (source / "w.bin").read_bytes()
    descriptor = os.open(target / "w.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(descriptor, 0, len(weights))
        os.write(descriptor, weights[: len(weights) // 3])  # ...and the copier stalls here
        for _ in range(3):
            await watcher.scan()
            assert _answer(manager) == ("1", 64.0)
        os.pwrite(descriptor, weights[len(weights) // 3 :], len(weights) // 3)
    finally:
        os.close(descriptor)
    (target / COMPLETE_MARKER).touch()
    await watcher.scan()
    assert _answer(manager) == ("2", 128.0)


def test_a_marker_older_than_a_file_does_not_vouch_for_it(tmp_path: Path) -> None:
    """An in-place rewrite after the marker is not complete until the marker is written again."""
    folder = write_external_version(tmp_path, "m", 1, 1.0)
    (folder / COMPLETE_MARKER).touch()
    assert snapshot_model(tmp_path / "m").versions[1].marked
    marker = (folder / COMPLETE_MARKER).stat().st_mtime_ns
    os.utime(folder / "w.bin", ns=(marker + 10**9, marker + 10**9))
    assert not snapshot_model(tmp_path / "m").versions[1].marked
    (folder / COMPLETE_MARKER).touch()
    os.utime(folder / COMPLETE_MARKER, ns=(marker + 2 * 10**9, marker + 2 * 10**9))
    assert snapshot_model(tmp_path / "m").versions[1].marked


async def test_versions_loaded_at_start_stay_complete_while_unchanged(
    manager: LifecycleManager, tmp_path: Path
) -> None:
    """Unmarked versions from the start still count for the version policy: the latest policy
    retires version 1 when a marked version 2 serves."""
    write_external_version(tmp_path / "models", "m", 1, 1.0)
    watcher = RepositoryWatcher(manager, "poll", 1.0)
    watcher.seed(await manager.start())
    assert not await watcher.scan()  # nothing is changing: no settling
    (write_external_version(tmp_path / "models", "m", 2, 2.0) / COMPLETE_MARKER).touch()
    await watcher.scan()
    assert manager.registry.served_versions("m") == ("2",)
