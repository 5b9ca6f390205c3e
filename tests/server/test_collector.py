"""A started server freezes what it loaded, so full GC passes do not walk it again."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path

import onnx

from ortserve.demo import DEMO_MODELS, build_mlp
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


async def test_an_unloaded_startup_version_with_a_fallback_chain_is_freed(tmp_path: Path) -> None:
    """Startup objects are frozen out of the collector, so an unloaded version must go with its
    last reference: a reference cycle through its guard and chain kept the chain and every
    level's session (the weights) alive for good."""
    sizes, seed = DEMO_MODELS["small_mlp"]
    (tmp_path / "m" / "1").mkdir(parents=True)
    onnx.save(build_mlp(sizes, seed, "m"), str(tmp_path / "m" / "1" / "model.onnx"))
    (tmp_path / "m" / "config.yaml").write_text(
        "fallback: {session: cpu}\ninputs: {input: {min: -100, max: 100}}\n", encoding="utf-8"
    )
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
        guard = server.registry.entry("m").versions[1].guard  # type: ignore[attr-defined]
        assert guard is not None and guard.chain is not None
        chain = weakref.ref(guard.chain)
        del guard
        await server.manager.unload("m")
        for _ in range(100):  # the drain runs on the loop
            if chain() is None:
                break
            await asyncio.sleep(0.02)
        assert chain() is None
    finally:
        await server.stop()
        gc.unfreeze()
