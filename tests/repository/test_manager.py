"""The lifecycle manager and watcher in-process: swaps, drains, failed loads, half-copied folders."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from model_builders import write_scaled_version
from ortserve.config.model import ModelConfig
from ortserve.core.model import ModelState, ServedVersion
from ortserve.core.types import InferInput, InferRequest, InferResponse
from ortserve.errors import ModelLoadFailed, ModelNotFound, ModelNotReady
from ortserve.repository.config_source import ModelSource
from ortserve.repository.index import repository_index
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.repository.snapshot import COMPLETE_MARKER
from ortserve.repository.watcher import RepositoryWatcher
from ortserve.settings import ServerSettings

X = np.ones((1, 4), dtype=np.float32)


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def loaded(self, model: str, version: str, seconds: float) -> None:
        self.seen.append(("loaded", model, version))

    def load_failed(self, model: str, version: str) -> None:
        self.seen.append(("failed", model, version))

    def unloaded(self, model: str, version: str) -> None:
        self.seen.append(("unloaded", model, version))


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[LifecycleManager]:
    settings = ServerSettings(tmp_path, intra_op_threads=1, shutdown_grace_s=5.0)
    built = LifecycleManager(ModelRegistry(), settings, Events())
    yield built
    await built.close(5.0)


def request(name: str = "m") -> InferRequest:
    return InferRequest(name, [InferInput("x", "FP32", X.shape, X)])


def scale_of(response: InferResponse) -> float:
    return float(response.outputs[0].data[0, 0])


async def infer(manager: LifecycleManager, name: str = "m") -> float:
    return scale_of(await manager.registry.resolve(name, None).infer(request(name)))


def events(manager: LifecycleManager) -> list[tuple[str, str, str]]:
    assert isinstance(manager.events, Events)
    return manager.events.seen


async def drained(manager: LifecycleManager) -> None:
    await asyncio.gather(*manager._drains)


def ort_threads(name: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(f"ort-{name}-")]


async def test_a_new_version_serves_and_the_old_one_drains_and_releases_its_threads(
    manager: LifecycleManager, tmp_path: Path
) -> None:
    write_scaled_version(tmp_path, "m", 1, 1.0)
    released: list[int] = []
    forgotten: list[tuple[str, str]] = []
    manager.released.append(lambda: released.append(1))
    manager.forgotten.append(lambda model, version: forgotten.append((model, version)))
    await manager.start()
    old = manager.registry.resolve("m", None)
    assert await infer(manager) == 1.0
    queued = old.submit(request())  # admitted on version 1 before the swap
    write_scaled_version(tmp_path, "m", 2, 2.0)
    await manager.load("m")
    assert await infer(manager) == 2.0
    assert scale_of(await queued) == 1.0  # it finished on the version it was admitted with
    await drained(manager)
    assert old.state is ModelState.UNLOADING
    assert manager.registry.served_versions("m") == ("2",)
    assert ort_threads("m-1") == []
    assert released == [1]
    assert forgotten == [("m", "1")]  # its series and statistics can go
    assert ("unloaded", "m", "1") in events(manager)


async def test_a_failed_reload_leaves_the_serving_version_untouched(
    manager: LifecycleManager, tmp_path: Path
) -> None:
    write_scaled_version(tmp_path, "m", 1, 1.0)
    await manager.start()
    broken = tmp_path / "m" / "2"
    broken.mkdir()
    (broken / "model.onnx").write_bytes(b"not an onnx file")
    with pytest.raises(ModelLoadFailed, match="version 2") as caught:
        await manager.load("m")
    assert "still serving version(s) [1]" in caught.value.message
    assert await infer(manager) == 1.0
    rows = {(r.version, r.state) for r in repository_index(manager.registry, tmp_path, False)}
    assert rows == {("1", "READY"), ("2", "UNAVAILABLE")}
    assert ("failed", "m", "2") in events(manager)


async def test_a_load_requests_config_names_the_label_file_its_classification_answers_with(
    manager: LifecycleManager, tmp_path: Path
) -> None:
    """Triton's load API: a configuration given with the request declares an output's
    ``label_filename`` (a file in the model folder); the rebuilt version labels with it."""
    from ortserve.repository.triton_config import parse_json_config

    write_scaled_version(tmp_path, "m", 1, 1.0)
    (tmp_path / "m" / "classes.txt").write_text("w\nx\ny\nz\n")
    await manager.start()
    assert manager.registry.resolve("m", None).info.labels == {}
    config = '{"max_batch_size": 8, "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4], "label_filename": "classes.txt"}]}'
    await manager.load("m", override=ModelSource.from_triton(parse_json_config(config, "m"), "request"))
    assert manager.registry.resolve("m", None).info.labels == {"y": ("w", "x", "y", "z", "")}


async def test_a_reload_with_a_bad_config_keeps_the_serving_version_and_is_not_remembered(
    manager: LifecycleManager, tmp_path: Path
) -> None:
    """A load request whose config contradicts the graph fails; the version built from the
    files keeps serving (it was withdrawn on the next pass), polls leave it alone, and a load
    without a config builds from the files again (it reused the bad config)."""
    write_scaled_version(tmp_path, "m", 1, 1.0)
    await manager.start()
    bad = ModelSource(
        ModelConfig.model_validate({"inputs": {"nope": {"min": 0}}}), "request"
    )  # no such input
    with pytest.raises(ModelLoadFailed, match="still serving version"):
        await manager.load("m", override=bad)
    assert await infer(manager) == 1.0
    watcher = RepositoryWatcher(manager, "poll", 1.0)
    await watcher.scan()
    await watcher.scan()
    assert await infer(manager) == 1.0
    await manager.load("m")
    assert await infer(manager) == 1.0
    rows = {(r.version, r.state) for r in repository_index(manager.registry, tmp_path, False)}
    assert rows == {("1", "READY")}


async def test_the_same_broken_files_are_not_retried_until_they_change(
    manager: LifecycleManager, tmp_path: Path
) -> None:
    write_scaled_version(tmp_path, "m", 1, 1.0)
    await manager.start()
    watcher = RepositoryWatcher(manager, "poll", 1.0, require_marker=False)  # files settled
    (tmp_path / "m" / "2").mkdir()
    (tmp_path / "m" / "2" / "model.onnx").write_bytes(b"broken")
    for _ in range(3):
        await watcher.scan()
    assert events(manager).count(("failed", "m", "2")) == 1
    write_scaled_version(tmp_path, "m", 2, 2.0)
    await watcher.scan()
    await watcher.scan()
    assert await infer(manager) == 2.0


async def test_replacing_a_model_file_in_place_reloads_that_version(
    manager: LifecycleManager, tmp_path: Path
) -> None:
    write_scaled_version(tmp_path, "m", 1, 1.0)
    forgotten: list[tuple[str, str]] = []
    manager.forgotten.append(lambda model, version: forgotten.append((model, version)))
    await manager.start()
    watcher = RepositoryWatcher(manager, "poll", 1.0, require_marker=False)  # files settled
    await watcher.scan()
    old = manager.registry.resolve("m", "1")
    write_scaled_version(tmp_path, "m", 1, 3.0)
    os.utime(tmp_path / "m" / "1" / "model.onnx", ns=(1, 1))  # a different mtime even on coarse clocks
    assert await watcher.scan()  # changed since the last look: not complete yet
    assert manager.registry.resolve("m", "1") is old
    await watcher.scan()
    assert manager.registry.resolve("m", "1") is not old
    assert await infer(manager) == 3.0
    await drained(manager)
    assert forgotten == []  # version 1 still serves: its series stay


async def test_a_version_still_being_copied_is_loaded_only_once_its_files_settle(
    manager: LifecycleManager, tmp_path: Path
) -> None:
    write_scaled_version(tmp_path, "m", 1, 1.0)
    snapshots = await manager.start()
    watcher = RepositoryWatcher(manager, "poll", 1.0, require_marker=False)  # files settled
    watcher.seed(snapshots)
    source = write_scaled_version(tmp_path / "elsewhere", "m", 2, 2.0) / "model.onnx"
    target = tmp_path / "m" / "2"
    target.mkdir()
    data = source.read_bytes()
    with (target / "model.onnx").open("wb") as half:
        half.write(data[: len(data) // 2])
        half.flush()
        assert await watcher.scan()  # half a file: never loaded
        assert manager.registry.served_versions("m") == ("1",)
        half.write(data[len(data) // 2 :])
    os.utime(target / "model.onnx", ns=(2, 2))
    assert await watcher.scan()  # complete now, but changed since the last look
    assert manager.registry.served_versions("m") == ("1",)
    assert not await watcher.scan()
    assert await infer(manager) == 2.0
    assert not any(kind == "failed" for kind, _, _ in events(manager))


async def test_the_complete_marker_makes_a_version_load_at_the_first_look(
    manager: LifecycleManager, tmp_path: Path
) -> None:
    write_scaled_version(tmp_path, "m", 1, 1.0)
    watcher = RepositoryWatcher(manager, "poll", 1.0)
    watcher.seed(await manager.start())
    (write_scaled_version(tmp_path, "m", 2, 2.0) / COMPLETE_MARKER).touch()
    assert not await watcher.scan()
    assert await infer(manager) == 2.0


async def test_version_policy_latest_two_keeps_two_and_drops_the_oldest(
    manager: LifecycleManager, tmp_path: Path
) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.yaml").write_text("version_policy:\n  latest: 2\n")
    for version in (1, 2):
        write_scaled_version(tmp_path, "m", version, float(version))
    await manager.start()
    assert manager.registry.served_versions("m") == ("2", "1")
    write_scaled_version(tmp_path, "m", 3, 3.0)
    await manager.load("m")
    await drained(manager)
    assert manager.registry.served_versions("m") == ("3", "2")


async def test_unload_stops_serving_without_making_the_server_unready(
    manager: LifecycleManager, tmp_path: Path
) -> None:
    write_scaled_version(tmp_path, "m", 1, 1.0)
    write_scaled_version(tmp_path, "other", 1, 5.0)
    await manager.start()
    await manager.unload("m")
    with pytest.raises(ModelNotReady, match="unloaded"):
        manager.registry.resolve("m", None)
    assert manager.registry.all_ready
    assert await infer(manager, "other") == 5.0
    with pytest.raises(ModelNotFound):
        await manager.unload("nope")
    with pytest.raises(ModelNotFound):
        await manager.load("../etc")


async def test_explicit_start_loads_only_the_named_models(manager: LifecycleManager, tmp_path: Path) -> None:
    write_scaled_version(tmp_path, "a", 1, 1.0)
    write_scaled_version(tmp_path, "b", 1, 2.0)
    await manager.start(["b"])
    assert manager.registry.names() == ["b"]
    rows = {(r.name, r.state, r.reason) for r in repository_index(manager.registry, tmp_path, False)}
    assert ("a", "UNAVAILABLE", "not loaded") in rows
    assert [r.name for r in repository_index(manager.registry, tmp_path, True)] == ["b"]


async def test_a_removed_model_folder_is_unloaded_in_poll_mode(
    manager: LifecycleManager, tmp_path: Path
) -> None:
    write_scaled_version(tmp_path, "m", 1, 1.0)
    watcher = RepositoryWatcher(manager, "poll", 1.0)
    watcher.seed(await manager.start())
    served = manager.registry.resolve("m", None)
    (tmp_path / "m" / "1" / "model.onnx").unlink()
    (tmp_path / "m" / "1").rmdir()
    (tmp_path / "m").rmdir()
    await watcher.scan()
    await drained(manager)
    assert isinstance(served, ServedVersion) and served.state is ModelState.UNLOADING
    assert manager.registry.entry("m").state is ModelState.UNLOADED


@pytest.mark.parametrize(
    ("fallback", "why"),
    [
        ("'../m'", "'../m' is not a model name"),  # a model file outside the repository
        ("'/etc'", "'/etc' is not a model name"),
    ],
)
async def test_a_lighter_fallback_model_must_be_a_model_of_the_repository(
    manager: LifecycleManager, tmp_path: Path, fallback: str, why: str
) -> None:
    write_scaled_version(tmp_path, "m", 1, 1.0)
    (tmp_path / "m" / "config.yaml").write_text(f"fallback: {{model: {fallback}}}\n")
    await manager.start()
    error = manager.registry.entry("m").error
    assert error is not None and why in error


async def test_a_lighter_model_of_the_repository_answers_when_level_0_fails(tmp_path: Path) -> None:
    """Level 2 from ``fallback.model``: the lighter model's own file (here x * 0.5), marked
    degraded, while level 0 (x * 1.0) fails on every run."""
    write_scaled_version(tmp_path, "m", 1, 1.0)
    write_scaled_version(tmp_path, "light", 1, 0.5)
    (tmp_path / "m" / "config.yaml").write_text(
        "fallback: {model: light, session: none, breaker: {consecutive_failures: 1}}\n"
        "faults: {L0: {error_rate: 1.0, kind: persistent}}\n"
    )
    settings = ServerSettings(tmp_path, intra_op_threads=1, shutdown_grace_s=5.0, enable_fault_injection=True)
    manager = LifecycleManager(ModelRegistry(), settings, Events())
    await manager.start(["m"])
    try:
        response = await manager.registry.resolve("m", None).infer(request())
        assert scale_of(response) == 0.5
        assert response.degraded is not None and response.degraded.level == 2
    finally:
        await manager.close(5.0)
