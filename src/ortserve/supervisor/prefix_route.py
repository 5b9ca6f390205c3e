"""``--workers N`` and the LLM prefix cache: a conversation's next turn goes to the worker that
holds its history.

Each worker keeps its own prefix cache, and the kernel spreads connections over the workers
(SO_REUSEPORT) with no regard for what they hold, so a follow-up turn usually landed on a
worker that never saw the history and prefilled it all again.

The workers share a directory of the prompt prefixes each has served: every worker writes
its own table (a file in the launch's private folder, mapped by all workers; one writer per
table, so no locks) holding a hash of each of its prompts' leading 64, 128, 192, ... bytes
(token-id prompts: 16, 32, 48, ... tokens, the prefix cache's blocks). A worker that accepts an
OpenAI generation request (or an OIP ``generate``/``generate_stream``, by its ``text_input``) looks its prompt's cuts up, longest first: if the longest prefix any
worker has served is one this worker has served too, or nobody has served any, it answers
the request itself (a new conversation stays where the kernel put it: the load stays
balanced); otherwise it forwards the request over the holder's private Unix socket, marked
with the launch's token so the holder answers it itself, and relays the answer, streamed or
whole, with the holder's index in ``x-ortserve-prefix-worker``. The holder checks the
request's credentials and limits as for any client (the headers go along).

What is hashed is what every turn of a conversation starts with, seeded with the model, the
``cache_salt`` and the API key (``authorization``, which the prefix cache salts by): for chat,
the JSON of the messages (a turn's messages are the previous turn's plus
the reply and the new message; a shared system prompt alone does not route, since every
worker that served it holds it too); for completions, the prompt's bytes (text) or token ids.
The table is a hint: a slot is overwritten by a later prefix with the same slot, and an
entry outlives its prefix in the cache (the request then goes to a worker that no longer
holds it, no worse than anywhere). A worker that restarts empties its table; a forward that
cannot reach the holder is answered locally: no request is refused for its routing.

gRPC's ``ModelStreamInfer`` generation is not routed: the kernel hands gRPC connections to the
workers as it does HTTP ones (the supervisor's gateway sees neither), and the workers' private
sockets speak HTTP only, so a worker would have to relay a gRPC stream through the holder's
``generate_stream`` and re-encode its events as Triton's decoupled responses.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import mmap
import os
from array import array
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from ortserve.server.http.app import HttpApp, ModelRouteHandler, Operation
from ortserve.server.http.messages import HttpRequest, HttpResponse, RouteResult, resolve_response
from ortserve.supervisor.plan import TOKEN_HEADER, WorkerLaunch

__all__ = [
    "FORWARDED_HEADER",
    "GENERATE_ROUTES",
    "ROUTED_PATHS",
    "PrefixDirectory",
    "PrefixRouter",
    "generate_hashes",
    "prefix_hashes",
    "route_by_prefix",
]

logger = logging.getLogger(__name__)

ROUTED_PATHS = ("/v1/chat/completions", "/v1/completions")
GENERATE_ROUTES = ("generate", "generate_stream")
"""OIP model routes routed by their ``text_input``."""
BLOCK_BYTES = 64
"""Text prompts and chat messages are hashed at every multiple of this many bytes."""
BLOCK_TOKENS = 16
"""Token-id prompts at every multiple of this many ids (the prefix cache's block)."""
MAX_BLOCKS = 1 << 16
"""Blocks hashed at most (4 MiB of text): a longer prompt is routed by its first 4 MiB."""
SLOTS = 1 << 15
"""Entries per worker's table (8 bytes each: 256 KiB)."""
FORWARDED_HEADER = b"x-ortserve-prefix-worker"
"""On an answer relayed from the worker holding the prompt's prefix: that worker's index."""
_MAX_HEAD_BYTES = 64 * 1024
_NOT_PASSED = {
    b"host",
    b"content-length",
    b"connection",
    b"transfer-encoding",
    b"content-encoding",
    b"expect",
    b"keep-alive",
    b"upgrade",
}
_NOT_RETURNED = {b"content-length", b"transfer-encoding", b"connection", b"content-type", b"keep-alive"}

Handler = Callable[[HttpRequest], Coroutine[Any, Any, HttpResponse]]
U64 = npt.NDArray[np.uint64]
_NONE: U64 = np.zeros(0, np.uint64)
_KEYS = np.random.default_rng(0x6F727473).integers(
    0, 1 << 64, 16 + MAX_BLOCKS, dtype=np.uint64, endpoint=False
)
_WORD_KEYS: U64 = _KEYS[:16] | np.uint64(1)
_POSITION_KEYS: U64 = _KEYS[16:] | np.uint64(1)
"""Fixed (the same in every process): a block's hash weighs its words, a prefix's hash its
blocks by position."""
_MIX = np.uint64(0x9E3779B97F4A7C15)


def prefix_hashes(path: str, body: bytes, tenant: bytes | None = None) -> U64:
    """One hash per whole block of the prompt in ``body``: entry ``i`` is the hash of the
    first ``i + 1`` blocks (each odd, so never an empty slot's 0). Empty for a body without a
    usable prompt.

    The prompt's bytes: a text prompt's UTF-8, a token-id prompt's ids (8 bytes each, blocks of
    ``BLOCK_TOKENS`` ids), chat's messages as JSON without the closing bracket. The model,
    the ``cache_salt`` and ``tenant`` (the API key the cache salts by) seed every hash.
    """
    request = _object(body)
    if request is None:
        return _NONE
    block = BLOCK_BYTES
    if path == "/v1/chat/completions":
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            return _NONE
        text = orjson.dumps(messages)[:-1]  # without "]": the next turn's messages go on from here
    else:
        prompt = request.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # several prompts: the first decides
        if isinstance(prompt, str):
            text = prompt.encode("utf-8", "surrogatepass")
        elif isinstance(prompt, list):
            try:
                text = array("q", prompt).tobytes()
            except (TypeError, OverflowError):
                return _NONE
            block = BLOCK_TOKENS * 8
        else:
            return _NONE
    return _block_hashes(text, block, str(request.get("model")), request.get("cache_salt"), tenant)


def generate_hashes(model: str, body: bytes, tenant: bytes | None = None) -> U64:
    """:func:`prefix_hashes` of an OIP ``generate``/``generate_stream`` body: its
    ``text_input``, seeded by the model of the path and the ``cache_salt`` (at the top level
    or in ``parameters``, as the route reads its fields), so a text prompt hashes as the same
    prompt sent to ``/v1/completions`` does."""
    request = _object(body)
    if request is None or not isinstance(text := request.get("text_input"), str):
        return _NONE
    parameters = request.get("parameters")
    salt = request.get("cache_salt")
    if isinstance(parameters, dict) and "cache_salt" in parameters:
        salt = parameters["cache_salt"]
    return _block_hashes(text.encode("utf-8", "surrogatepass"), BLOCK_BYTES, model, salt, tenant)


def _object(body: bytes) -> dict[str, Any] | None:
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return request if isinstance(request, dict) else None


def _block_hashes(text: bytes, block: int, model: str, salt: object, tenant: bytes | None) -> U64:
    blocks = min(len(text) // block, MAX_BLOCKS)
    if blocks == 0:
        return _NONE
    seed = hashlib.blake2b(
        orjson.dumps([model, salt if isinstance(salt, str) else ""]) + b"\0" + (tenant or b""),
        digest_size=8,
    )
    words = np.frombuffer(text, dtype=np.uint64, count=blocks * block // 8).reshape(blocks, block // 8)
    with np.errstate(over="ignore"):
        mixed = (words * _WORD_KEYS[: block // 8]).sum(axis=1, dtype=np.uint64)
        mixed ^= mixed >> np.uint64(29)
        mixed *= _MIX
        running = np.cumsum(mixed * _POSITION_KEYS[:blocks], dtype=np.uint64)
        running += np.uint64(int.from_bytes(seed.digest(), "little"))
        running ^= running >> np.uint64(31)
        running *= _MIX
    hashes: U64 = running | np.uint64(1)
    return hashes


class PrefixDirectory:
    """The prefix tables of ``workers`` workers, this one (``index``) writing its own.

    Args:
        folder: a private folder shared by the workers (the launch's run folder).
    """

    def __init__(self, folder: Path, index: int, workers: int, slots: int = SLOTS) -> None:
        self.index = index
        self._folder = folder
        self._slots = slots
        self._mask = np.uint64(slots - 1)
        self._tables: list[U64 | None] = [None] * workers
        self._maps: list[mmap.mmap | None] = [None] * workers
        own = self._table_path(index)
        descriptor = os.open(own, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(descriptor, slots * 8)
            mapped = mmap.mmap(descriptor, slots * 8)
        finally:
            os.close(descriptor)
        self._maps[index] = mapped
        table: U64 = np.frombuffer(mapped, dtype=np.uint64)
        table[:] = 0  # the same file as before a restart (mapped by the others): emptied, as the cache is
        self._tables[index] = table

    def _table_path(self, index: int) -> Path:
        return self._folder / f"prefixes-{index}.table"

    def _table(self, index: int) -> U64 | None:
        table = self._tables[index]
        if table is None:
            try:
                with open(self._table_path(index), "rb") as file:
                    mapped = mmap.mmap(file.fileno(), self._slots * 8, prot=mmap.PROT_READ)
            except (OSError, ValueError):  # not started yet
                return None
            self._maps[index] = mapped
            table = self._tables[index] = np.frombuffer(mapped, dtype=np.uint64)
        return table

    def holder(self, hashes: U64) -> int | None:
        """The worker to answer a prompt of these block ``hashes``: one holding its longest
        prefix that any worker holds, this one when it is among them, None when none holds any."""
        slots = hashes & self._mask
        hits = []
        for index in range(len(self._tables)):
            table = self._table(index)
            hits.append(None if table is None else table[slots] == hashes)
        held = [h for h in hits if h is not None]
        anywhere = np.flatnonzero(np.logical_or.reduce(held)) if held else _NONE
        if len(anywhere) == 0:
            return None
        longest = anywhere[-1]
        own = hits[self.index]
        if own is not None and own[longest]:
            return self.index
        return next(index for index, hit in enumerate(hits) if hit is not None and hit[longest])

    def record(self, hashes: U64) -> None:
        """This worker now holds these prefixes."""
        table = self._tables[self.index]
        assert table is not None
        table[hashes & self._mask] = hashes

    def close(self) -> None:
        self._tables = [None] * len(self._tables)
        for mapped in self._maps:
            if mapped is not None:
                with contextlib.suppress(BufferError):  # a table still referenced elsewhere
                    mapped.close()


class PrefixRouter:
    """Answers the requests whose prefix this worker holds (or nobody does); forwards the others.

    Args:
        sockets: worker index -> its private Unix socket.
        token: marks a forwarded request: the worker receiving it answers it itself.
    """

    def __init__(self, directory: PrefixDirectory, sockets: Callable[[int], Path], token: str) -> None:
        self.directory = directory
        self._sockets = sockets
        self._token = token.encode()
        self.forwarded = 0
        """Requests sent to the worker holding their prefix."""
        self.fell_back = 0
        """Requests whose holder could not be reached, answered here."""

    def wrap(self, path: str, local: Handler) -> Handler:
        async def handler(request: HttpRequest) -> HttpResponse:
            hashes = prefix_hashes(path, request.body, request.headers.get(b"authorization"))
            return await self._route(request, hashes, lambda: local(request))

        return handler

    def wrap_model(self, local: ModelRouteHandler) -> ModelRouteHandler:
        """The same for a model route (OIP ``generate``, ``generate_stream``): by its
        ``text_input`` and the model of its path."""

        def handler(request: HttpRequest, name: str, version: str | None) -> RouteResult:
            if request.method != "POST":
                return local(request, name, version)
            hashes = generate_hashes(name, request.body, request.headers.get(b"authorization"))
            return self._route(request, hashes, lambda: local(request, name, version))

        return handler

    async def _route(
        self, request: HttpRequest, hashes: U64, local: Callable[[], RouteResult]
    ) -> HttpResponse:
        """The holder's answer when another worker holds the longest prefix, else ``local``'s."""
        if len(hashes):
            if request.headers.get(TOKEN_HEADER) != self._token:
                chosen = self.directory.holder(hashes)
                if chosen is not None and chosen != self.directory.index:
                    response = await self._forward(request, chosen)
                    if response is not None:
                        return response
            self.directory.record(hashes)
        return await resolve_response(local())

    async def _forward(self, request: HttpRequest, chosen: int) -> HttpResponse | None:
        """The holder's answer, or None if it could not be asked (nothing was answered yet)."""
        try:
            reader, writer = await asyncio.open_unix_connection(str(self._sockets(chosen)), limit=1 << 16)
        except OSError:
            self.fell_back += 1
            return None
        try:
            target = request.path + (f"?{request.query}" if request.query else "")
            lines = [f"{request.method} {target} HTTP/1.1".encode(), b"host: localhost", b"connection: close"]
            lines += [
                n + b": " + v
                for n, v in request.headers.items()
                if n not in _NOT_PASSED and n != TOKEN_HEADER
            ]
            lines += [TOKEN_HEADER + b": " + self._token, b"content-length: %d" % len(request.body)]
            writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + request.body)
            status, headers = await _read_head(reader)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError):
            writer.close()
            self.fell_back += 1
            return None
        self.forwarded += 1
        content_type = headers.get(b"content-type", b"application/json")
        passed = [(n, v) for n, v in headers.items() if n not in _NOT_RETURNED]
        passed.append((FORWARDED_HEADER, b"%d" % chosen))
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            return HttpResponse(status, [], content_type, passed, stream=_relay(reader, writer))
        try:
            body = await reader.readexactly(int(headers.get(b"content-length", b"0")))
        finally:
            writer.close()
        return HttpResponse(status, [body], content_type, passed)


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    status_line = await reader.readuntil(b"\r\n")
    status = int(status_line.split(b" ", 2)[1])
    headers: dict[bytes, bytes] = {}
    size = len(status_line)
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        size += len(line)
        if size > _MAX_HEAD_BYTES:
            raise ValueError("answer head too large")
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> AsyncIterator[bytes]:
    """The holder's chunked body, one chunk at a time; closing it (the client went away) hangs
    up on the holder, which then stops generating."""
    try:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                return
            piece = await reader.readexactly(size + 2)
            yield piece[:-2]
    finally:
        writer.close()


def route_by_prefix(app: HttpApp, launch: WorkerLaunch, index: int) -> PrefixRouter | None:
    """Route ``app``'s OpenAI and OIP generate requests to the worker holding their prefix
    (None: one worker, nothing to route)."""
    if launch.workers < 2:
        return None
    router = PrefixRouter(
        PrefixDirectory(launch.run_dir, index, launch.workers), launch.worker_socket, launch.token
    )
    operations = app.routes()
    for path in ROUTED_PATHS:
        local = app.route("POST", path)
        if local is not None:
            app.add_route("POST", path, router.wrap(path, local), operations.get(("POST", path)))
    for last in GENERATE_ROUTES:
        model_local = app.model_route(last)
        if model_local is not None:
            app.add_model_route("POST", last, router.wrap_model(model_local), _described(operations, last))
    return router


def _described(operations: dict[tuple[str, str], Operation | None], last: str) -> Callable[[str], Operation]:
    """The route's description as it was added (``add_model_route`` writes it again)."""
    return lambda path: operations.get(("POST", path)) or {"summary": last}
