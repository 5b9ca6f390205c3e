"""A started server freezes what it loaded, so full GC passes do not walk it again."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from pathlib import Path

import onnx
import pytest

from ortserve.core.model import ServedVersion
from ortserve.demo import DEMO_MODELS, build_mlp
from ortserve.llm.demo import write_demo_llm
from ortserve.llm.servable import LlmVersion
from ortserve.resilience.levels import SessionLevel
from ortserve.server.lifecycle import Server
from ortserve.settings import ServerSettings


async def test_a_started_server_has_frozen_its_startup_objects(tmp_path: Path) -> None:
    gc.unfreeze()
    server = Server(ServerSettings(tmp_path, http_port=0, grpc_port=-1, metrics_port=-1))
    try:
        await server.start()
        assert gc.get_freeze_count() > 1000
    finally:
        await server.stop()
        gc.unfreeze()


@pytest.mark.parametrize(
    "config",
    [
        "batching: {max_batch_size: 8}\n",
        "fallback: {session: cpu}\ninputs: {input: {min: -100, max: 100}}\n",
        "llm",
    ],
    ids=["plain", "guarded", "llm"],
)
async def test_an_unloaded_startup_version_is_freed_with_its_sessions(tmp_path: Path, config: str) -> None:
    """Startup objects are frozen out of the collector, so an unloaded version must go with its
    last reference. Cycles kept them for good: a guarded version's guard and chain (with every
    level's session: the weights), an LLM version and its engine (through the engine's sink)."""
    name = write_demo_llm(tmp_path) if config == "llm" else "m"
    if config != "llm":
        sizes, seed = DEMO_MODELS["small_mlp"]
        (tmp_path / name / "1").mkdir(parents=True)
        onnx.save(build_mlp(sizes, seed, name), str(tmp_path / name / "1" / "model.onnx"))
        (tmp_path / name / "config.yaml").write_text(config, encoding="utf-8")
    gc.unfreeze()
    settings = ServerSettings(
        tmp_path,
        http_port=0,
        grpc_port=-1,
        metrics_port=-1,
        model_control_mode="explicit",
        load_models=(name,),
    )
    server = Server(settings)
    try:
        await server.start()
        assert gc.get_freeze_count() > 1000
        loop = asyncio.get_running_loop()
        freed = asyncio.Event()

        def check() -> None:
            if all(ref() is None for ref in refs):
                freed.set()

        def gone(_: object) -> None:  # the last reference may go in a worker thread
            loop.call_soon_threadsafe(check)

        refs = [weakref.ref(o, gone) for o in _parts(server.registry.entry(name).versions[1])]
        await server.manager.unload(name)
        with contextlib.suppress(TimeoutError):  # the drain runs on the loop
            await asyncio.wait_for(freed.wait(), 5)
        assert [ref() for ref in refs if ref() is not None] == []
    finally:
        await server.stop()
        gc.unfreeze()


def _parts(served: object) -> list[object]:
    """The version and what holds its weights or threads."""
    if isinstance(served, LlmVersion):
        return [served, served.engine, served.engine.decoder]
    assert isinstance(served, ServedVersion) and served.runner is not None
    found: list[object] = [served, served.runner, served.scheduler, served.runner._session]
    chain = None if served.guard is None else served.guard.chain
    if chain is not None:
        found += list(chain.levels)
        found += [
            level.session() for level in chain.levels if isinstance(level, SessionLevel) and level.built
        ]
    return found
