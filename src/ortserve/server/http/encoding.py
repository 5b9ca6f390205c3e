"""HTTP content codings: gzip/deflate request bodies inflated within the body limit, infer
answers compressed when the client's ``Accept-Encoding`` asks (as Triton does).

Only successful infer answers (and metrics scrapes) of at least ``COMPRESS_MIN_BYTES`` are
compressed, as Triton compresses only infer responses: tritonclient's aio HTTP client reads every other answer (and
every error) without undoing a coding, while aiohttp always sends ``Accept-Encoding: gzip``.
A small answer gains nothing from gzip (13 bytes of ``{"live":true}`` became 33).

A compressed body is a promise of size, not size: a few hundred kilobytes of gzip can inflate
to gigabytes. Inflation therefore stops at the body limit as it goes (the client gets 413;
the server never holds more than the limit), and it never stalls the event loop: the first
``INLINE_BUDGET`` bytes inflate on the loop (the common small request costs no thread hop),
the rest in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ortserve.errors import InvalidInput, PayloadTooLarge, UnsupportedEncoding
from ortserve.server.http.messages import HttpRequest, HttpResponse, RouteResult, resolve_response
from ortserve.server.inflate_ratio import MAX_INFLATE_RATIO, inflate_limit

__all__ = [
    "COMPRESS_MIN_BYTES",
    "INLINE_BUDGET",
    "SUPPORTED_CODINGS",
    "Inflation",
    "accepted_coding",
    "answer_coding",
    "compress_answer",
    "inflate_then_route",
]

INLINE_BUDGET = 256 * 1024
"""Inflated bytes produced on the event loop per request; the rest is a worker thread's job."""
COMPRESS_MIN_BYTES = 1024
"""Infer answers smaller than this go out as they are: a few hundred bytes of JSON save a
few hundred bytes, which the gzip header and a zlib stream's set-up cost back."""
_THREAD_COMPRESS_BYTES = 256 * 1024
_STEP = 64 * 1024
# zlib window bits per coding: gzip's wrapper, and zlib's for "deflate" (RFC 9110 8.4.1.2).
_WBITS = {b"gzip": 16 + zlib.MAX_WBITS, b"x-gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}
_PREFERENCE = (b"gzip", b"deflate")
SUPPORTED_CODINGS = ("gzip", "deflate", "identity")
"""Request codings the server undoes, in the order a 415's Accept-Encoding lists them."""


def _background_priority() -> None:
    """Inflating threads yield the CPU to the event loop (Linux: SCHED_BATCH and nice 10).

    On a server pinned to one core the loop and an inflating thread share it; at equal
    priority a probe waited up to a scheduler slice (benchmarks/bench_inflate.py).
    """
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


# Two threads: bodies past INLINE_BUDGET are rare and each is bounded by the body limit.
_INFLATERS = ThreadPoolExecutor(2, "ortserve-inflate", _background_priority)


class Inflation:
    """One compressed request body, inflated a bounded number of bytes at a time.

    Args:
        body: the body as received (already within the connection's body limit).
        coding: the ``Content-Encoding`` value, lower-case.
        limit: most inflated bytes accepted.

    Raises:
        UnsupportedEncoding: the coding is not gzip, deflate or identity (415).
    """

    def __init__(self, body: bytes, coding: bytes, limit: int) -> None:
        wbits = _WBITS.get(coding)
        if wbits is None:
            name = coding.decode("latin-1")
            raise UnsupportedEncoding(
                f"Content-Encoding {name!r} is not supported (gzip, deflate, identity)", SUPPORTED_CODINGS
            )
        self._coding = coding.decode("latin-1")
        self._wbits = wbits
        self._members = 1
        self._inflater = zlib.decompressobj(wbits)
        self._body = memoryview(body)
        self._read = 0
        self._pending: bytes | memoryview = b""
        self._chunks: list[bytes] = []
        self._size = 0
        self._size_limit = limit
        self._limit = inflate_limit(len(body), limit)  # a ratio too: see inflate_ratio.py

    def run(self, budget: int) -> bool:
        """Inflate up to ``budget`` more bytes; True once the whole body is inflated.

        Raises:
            PayloadTooLarge: the inflated body passes the limit.
            InvalidInput: the body is not valid for its coding, cut short, or followed by data.
        """
        produced = 0
        while produced < budget:
            if not self._pending:  # the input goes in slices: zlib copies what it leaves unread
                self._pending = self._body[self._read : self._read + _STEP]
                self._read += len(self._pending)
            room = min(_STEP, budget - produced, self._limit - self._size + 1)
            try:
                chunk = self._inflater.decompress(self._pending, room)
            except zlib.error:
                raise InvalidInput(f"the request body is not valid {self._coding} data") from None
            self._pending = self._inflater.unconsumed_tail
            self._size += len(chunk)
            produced += len(chunk)
            if self._size > self._limit and self._limit < self._size_limit:
                raise PayloadTooLarge(
                    f"the request body inflates more than {MAX_INFLATE_RATIO} times its compressed size"
                )
            if self._size > self._limit:
                raise PayloadTooLarge(f"the request body inflates past the size limit of {self._limit} bytes")
            if chunk:
                self._chunks.append(chunk)
            if self._inflater.eof:
                rest = self._inflater.unused_data
                if not rest and self._read == len(self._body):
                    return True
                following = (
                    rest[:2] if len(rest) >= 2 else bytes(self._body[self._read - len(rest) : self._read + 2])
                )
                if self._coding != "gzip" or self._members >= _MAX_MEMBERS or following[:2] != _GZIP_MAGIC:
                    raise InvalidInput(f"data follows the end of the {self._coding} request body")
                # gzip allows members one after another (RFC 1952 2.2: `cat a.gz b.gz`); a
                # few, not a flood of empty ones that inflate to nothing each.
                self._members += 1
                self._inflater = zlib.decompressobj(self._wbits)
                self._pending = rest
            if not chunk and not self._pending and self._read == len(self._body):
                raise InvalidInput(f"the {self._coding} request body is cut short")
        return False

    def body(self) -> bytes:
        """The inflated body (after :meth:`run` returned True)."""
        return self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)


_MAX_MEMBERS = 64
"""gzip members a body may hold, one after another."""
_GZIP_MAGIC = b"\x1f\x8b"


def inflate_then_route(
    request: HttpRequest, coding: bytes, limit: int, route: Callable[[HttpRequest], RouteResult]
) -> RouteResult:
    """Route ``request`` with its body inflated: at once when small, after a worker thread if not.

    Raises:
        InvalidInput, PayloadTooLarge, UnsupportedEncoding: from :class:`Inflation` (inline part).
    """
    inflation = Inflation(request.body, coding, limit)
    if inflation.run(INLINE_BUDGET):
        request.body = inflation.body()
        return route(request)
    return _route_after_thread(request, inflation, limit, route)


async def _route_after_thread(
    request: HttpRequest, inflation: Inflation, limit: int, route: Callable[[HttpRequest], RouteResult]
) -> HttpResponse:
    await asyncio.get_running_loop().run_in_executor(_INFLATERS, inflation.run, limit + 1)
    request.body = inflation.body()
    return await resolve_response(route(request))


def accepted_coding(accept: bytes) -> bytes | None:
    """The coding to answer with for an ``Accept-Encoding`` value: gzip, deflate or None."""
    weights: dict[bytes, float] = {}
    for item in accept.lower().split(b","):
        name, _, params = item.strip().partition(b";")
        weight = 1.0
        params = params.strip()
        if params.startswith(b"q="):
            try:
                weight = float(params[2:])
            except ValueError:
                weight = 0.0
        weights[name.strip()] = weight
    wildcard = weights.get(b"*", 0.0)
    ranked = [(weights.get(c, wildcard), -i, c) for i, c in enumerate(_PREFERENCE)]
    weight, _, coding = max(ranked)
    return coding if weight > 0 else None


def answer_coding(request: HttpRequest) -> bytes | None:
    """The coding an answer to ``request`` may be compressed with: None unless it is an infer
    request (``POST .../infer``) or a Prometheus scrape (``GET /metrics``: Prometheus asks for
    gzip and reads it) whose ``Accept-Encoding`` takes gzip or deflate."""
    infer = request.method == "POST" and request.path.endswith("/infer")
    if not infer and not (request.method == "GET" and request.path == "/metrics"):
        return None
    accept = request.headers.get(b"accept-encoding")
    return None if accept is None else accepted_coding(accept)


def compress_answer(result: RouteResult, coding: bytes) -> RouteResult:
    """``result`` compressed with ``coding`` when it is a successful answer of at least
    ``COMPRESS_MIN_BYTES``; large bodies are compressed in a worker thread.

    Errors stay plain: clients that undo the coding of an infer answer read an error's JSON
    as it comes (tritonclient's aio client among them).
    """
    if isinstance(result, HttpResponse) and _size(result) <= _THREAD_COMPRESS_BYTES:
        return _compressed(result, coding)
    return _compress_later(result, coding)


async def _compress_later(result: RouteResult, coding: bytes) -> HttpResponse:
    response = await resolve_response(result)
    if _size(response) <= _THREAD_COMPRESS_BYTES:
        return _compressed(response, coding)
    return await asyncio.to_thread(_compressed, response, coding)


def _size(response: HttpResponse) -> int:
    return sum(len(chunk) for chunk in response.chunks)


def _compressed(response: HttpResponse, coding: bytes) -> HttpResponse:
    if response.status != 200 or response.stream is not None or _size(response) < COMPRESS_MIN_BYTES:
        return response
    # Level 1: most of gzip's gain on tensors and JSON at a fraction of the default's CPU.
    compressor = zlib.compressobj(1, zlib.DEFLATED, _WBITS[coding])
    chunks = [compressor.compress(chunk) for chunk in response.chunks]
    chunks.append(compressor.flush())
    headers = [*response.headers, (b"content-encoding", coding), (b"vary", b"accept-encoding")]
    return dataclasses.replace(response, chunks=[chunk for chunk in chunks if chunk], headers=headers)
