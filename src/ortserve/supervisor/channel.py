"""HTTP/1.1 over a Unix socket between the supervisor and its workers: one request, one answer.

The supervisor asks each worker for its own metrics, statistics and model control; a worker
hands the requests that must see all workers to the supervisor. Both ends are ortserve's own
HTTP server, so a minimal client suffices: one request per connection, ``Connection: close``,
the answer read to its Content-Length, bounded in size and time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Answer", "ChannelError", "request"]

MAX_ANSWER_BYTES = 64 * 1024 * 1024
_DROPPED = {b"host", b"content-length", b"connection", b"transfer-encoding", b"content-encoding"}


class ChannelError(Exception):
    """The other process did not answer (gone, restarting, too slow, or a malformed answer)."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    content_type: bytes = b"application/json"
    headers: dict[bytes, bytes] = field(default_factory=dict)


async def request(
    socket_path: Path,
    method: str,
    target: str,
    body: bytes = b"",
    headers: dict[bytes, bytes] | None = None,
    timeout_s: float = 30.0,
) -> Answer:
    """Send one request over the Unix socket at ``socket_path`` and read the answer.

    ``headers`` are passed on except those describing the connection or the body's framing
    (the body given is already decoded).

    Raises:
        ChannelError: no answer within ``timeout_s``, or none that parses.
    """
    try:
        return await asyncio.wait_for(_exchange(socket_path, method, target, body, headers or {}), timeout_s)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
        raise ChannelError(f"{method} {target} over {socket_path.name}: {exc!r}") from None


async def _exchange(
    socket_path: Path, method: str, target: str, body: bytes, headers: dict[bytes, bytes]
) -> Answer:
    reader, writer = await asyncio.open_unix_connection(str(socket_path), limit=1 << 16)
    try:
        head = [f"{method} {target} HTTP/1.1".encode(), b"host: localhost", b"connection: close"]
        head += [name + b": " + value for name, value in headers.items() if name.lower() not in _DROPPED]
        head.append(b"content-length: %d" % len(body))
        writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        status_line = await reader.readuntil(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        answer_headers: dict[bytes, bytes] = {}
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.partition(b":")
            answer_headers[name.strip().lower()] = value.strip()
        length = int(answer_headers.get(b"content-length", b"0"))
        if not 0 <= length <= MAX_ANSWER_BYTES:
            raise ValueError(f"answer of {length} bytes")
        content = await reader.readexactly(length)
        content_type = answer_headers.get(b"content-type", b"application/json")
        return Answer(status, content, content_type, answer_headers)
    finally:
        writer.close()
