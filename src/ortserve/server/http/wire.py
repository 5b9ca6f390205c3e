"""The bytes of an HTTP/1.1 response head, and responses encoded once and written many times.

The connection writes every response through :func:`response_head`; a
:class:`CannedResponse` is the same bytes kept whole, for answers that repeat by the thousand
under overload (the edge's 429s), so refusing costs one ``write`` of bytes already made.
"""

from __future__ import annotations

from http import HTTPStatus

from ortserve.server.http.messages import HttpResponse

__all__ = ["CannedResponse", "canned", "response_head", "status_line"]

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_STATUS_LINES: dict[int, bytes] = {}
_CONNECTION_CLOSE = b"connection: close\r\n"


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))
        _STATUS_LINES[status] = line
    return line


def response_head(response: HttpResponse, keep_alive: bool) -> bytes:
    """Status line and header lines up to and including the blank line."""
    head = [status_line(response.status)]
    if response.status != 204:  # no content, and no Content-Length either (RFC 9110 8.6)
        length = sum(len(c) for c in response.chunks)
        head += [b"content-type: ", response.content_type, b"\r\ncontent-length: %d\r\n" % length]
    for name, value in response.headers:
        head.append(name + b": " + value + b"\r\n")
    if not keep_alive:
        head.append(_CONNECTION_CLOSE)
    head.append(b"\r\n")
    return b"".join(head)


class CannedResponse:
    """A whole response as bytes, its head still open for per-request header lines.

    Args:
        head: the status line and header lines (no blank line yet).
        body: the body, after the blank line.
    """

    __slots__ = ("_kept_alive", "body", "head")

    def __init__(self, head: bytes, body: bytes) -> None:
        self.head = head
        self.body = body
        self._kept_alive = b"".join((head, b"\r\n", body))  # the common case, joined once

    def wire(self, keep_alive: bool) -> bytes:
        """The bytes to write."""
        if keep_alive:
            return self._kept_alive
        return b"".join((self.head, _CONNECTION_CLOSE, b"\r\n", self.body))

    def with_header(self, name: bytes, value: bytes) -> CannedResponse:
        """The same response with one more header line (a request's own id, say)."""
        return CannedResponse(self.head + name + b": " + value + b"\r\n", self.body)


def canned(response: HttpResponse) -> CannedResponse:
    """``response`` (no stream, not HEAD) encoded once."""
    head = response_head(response, keep_alive=True)
    return CannedResponse(head[:-2], b"".join(response.chunks))
