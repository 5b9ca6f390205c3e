"""A started server freezes what it loaded, so full GC passes do not walk it again."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path

import onnx
import pytest

from ortserve.core.model import ServedVersion
from ortserve.demo import DEMO_MODELS, build_mlp
from ortserve.resilience.chain import FallbackChain
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
    ["batching: {max_batch_size: 8}\n", "fallback: {session: cpu}\ninputs: {input: {min: -100, max: 100}}\n"],
    ids=["plain", "guarded"],
)
async def test_an_unloaded_startup_version_is_freed_with_its_sessions(tmp_path: Path, config: str) -> None:
    """Startup objects are frozen out of the collector, so an unloaded version must go with its
    last reference. A reference cycle through a guarded version's guard and chain kept the
    chain and every level's session (the weights) alive for good."""
    sizes, seed = DEMO_MODELS["small_mlp"]
    (tmp_path / "m" / "1").mkdir(parents=True)
    onnx.save(build_mlp(sizes, seed, "m"), str(tmp_path / "m" / "1" / "model.onnx"))
    (tmp_path / "m" / "config.yaml").write_text(config, encoding="utf-8")
    gc.unfreeze()
    settings = ServerSettings(
        tmp_path,
        http_port=0,
        grpc_port=-1,
        metrics_port=-1,
        model_control_mode="explicit",
        load_models=("m",),
    )
    server = Server(settings)
    try:
        await server.start()
        assert gc.get_freeze_count() > 1000
        served = server.registry.entry("m").versions[1]
        assert isinstance(served, ServedVersion) and served.runner is not None
        session = served.runner._session
        kept: list[object] = [served, served.runner, served.scheduler, session]
        if isinstance(session, FallbackChain):
            kept += list(session.levels)
            kept += [
                level._session for level in session.levels if isinstance(level, SessionLevel) and level.built
            ]
        refs = [weakref.ref(o) for o in kept]
        del served, session, kept
        await server.manager.unload("m")
        for _ in range(100):  # the drain runs on the loop
            if all(ref() is None for ref in refs):
                break
            await asyncio.sleep(0.02)
        assert [ref() for ref in refs if ref() is not None] == []
    finally:
        await server.stop()
        gc.unfreeze()
