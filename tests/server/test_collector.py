"""A started server freezes what it loaded, so full GC passes do not walk it again."""

from __future__ import annotations

import gc
from pathlib import Path

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
