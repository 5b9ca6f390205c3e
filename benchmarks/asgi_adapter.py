"""ortserve's routes behind an ASGI interface, only to compare HTTP stacks on the same work.

    uvicorn asgi_adapter:app --loop uvloop --http httptools      (cwd: benchmarks/)
    granian --interface asgi --loop uvloop asgi_adapter:app

The model repository comes from ``ORTSERVE_MODEL_REPOSITORY``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from ortserve.server.http.messages import Deferred, HttpRequest, HttpResponse
from ortserve.server.lifecycle import Server
from ortserve.settings import ServerSettings

_server: Server | None = None


async def _startup() -> None:
    global _server
    settings = ServerSettings(
        model_repository=Path(os.environ["ORTSERVE_MODEL_REPOSITORY"]),
        http_port=0,
        grpc_port=-1,
        metrics_port=-1,
        intra_op_threads=1,
    )
    _server = Server(settings)
    await _server.registry.load_repository(settings)


async def _respond(request: HttpRequest) -> HttpResponse:
    assert _server is not None
    result = _server.http_app(request)
    if isinstance(result, HttpResponse):
        return result
    if isinstance(result, Deferred):
        with contextlib.suppress(Exception):
            await result.future
        return result.finish(result.future)
    return await result


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await _startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    chunks = []
    more = True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    request = HttpRequest(
        scope["method"],
        scope["path"],
        scope["query_string"].decode("latin-1"),
        {name.lower(): value for name, value in scope["headers"]},
        b"".join(chunks),
    )
    response = await _respond(request)
    headers = [(b"content-type", response.content_type), *response.headers]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": b"".join(bytes(c) for c in response.chunks)})
