"""tritonclient's asyncio clients driven as blocking ones, so one case table runs every flavour.

Each client lives on its own event loop in a thread: aiohttp's session and grpc.aio's channel
are made and used on that loop, and a test calls their coroutine methods as plain calls.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio

__all__ = ["BlockingAio", "open_aio_client"]

_CALL_TIMEOUT_S = 60.0


class BlockingAio:
    """An aio client whose coroutine methods are called as blocking methods (same arguments)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread, client: Any) -> None:
        self._loop = loop
        self._thread = thread
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._run(attribute(*args, **kwargs))

        return call

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(_CALL_TIMEOUT_S)

    def close(self) -> None:
        """Close the client, then stop and close its loop."""
        try:
            self._run(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_CALL_TIMEOUT_S)
            self._loop.close()


def open_aio_client(kind: str, address: str) -> BlockingAio:
    """A ``tritonclient.http.aio`` (kind "http") or ``tritonclient.grpc.aio`` client of ``address``."""
    factory: Callable[[str], Any] = (
        http_aio.InferenceServerClient if kind == "http" else grpc_aio.InferenceServerClient
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name=f"aio-{kind}-client", daemon=True)
    thread.start()

    async def make() -> Any:
        return factory(address)

    client = asyncio.run_coroutine_threadsafe(make(), loop).result(_CALL_TIMEOUT_S)
    return BlockingAio(loop, thread, client)
