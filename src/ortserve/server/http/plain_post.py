"""Refusing whole plain POSTs from their bytes alone, before the parser sees them.

Under overload most requests are refused, and a refusal that costs a parse, a request object
and a write each is what made 1,600 clients wait seconds for their 429 (issue 30). A request
whose framing leaves no doubt (:func:`plain_post`) is refused from its target and length read
off its head, and every refusal at the start of one read leaves in one write
(:func:`screen_whole`). Anything in doubt goes to the parser, which answers it as before; the
checks here are a subset of what llhttp accepts, so a refusal never reads a length the parser
would not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ortserve.server.http.deadlines import ConnectionLimits
from ortserve.server.http.wire import CannedResponse

__all__ = ["Screened", "TargetScreen", "plain_post", "screen_whole"]


class TargetScreen(Protocol):
    """Refuses a plain POST from its target alone, before the connection parses it
    (:meth:`~ortserve.server.http.admission.EarlyRefusal.refuse_target`)."""

    def __call__(self, url: bytes, *, again: bool = False) -> CannedResponse | bool:
        """The refusal to write, True (admitted: not asked again), or False (ask with the headers)."""
        ...


@dataclass(frozen=True, slots=True)
class Screened:
    """What :func:`screen_whole` made of the start of one read."""

    answers: bytes
    """The refusals of the requests it took, to write in one go (empty: none taken)."""
    rest: int
    """Where the bytes for the parser start (the first request not taken)."""
    admitted: bool
    """That request was screened and admitted: the parser need not ask again at its head."""


def screen_whole(data: bytes, screen: TargetScreen, limits: ConnectionLimits) -> Screened:
    """Refuse the whole plain POSTs at the start of ``data``; stop at the first request that is
    not plain, not whole in ``data``, or that the screen admits or leaves to its headers."""
    answers: list[bytes] = []
    start, size = 0, len(data)
    admitted = False
    while True:
        end = data.find(b"\r\n\r\n", start, start + limits.max_header_bytes)
        if end < 0:
            break
        framing = _framing(data[start:end], limits)
        if framing is None:
            break
        url, length = framing
        whole = end + 4 + length
        if whole > size:
            break
        verdict = screen(url)
        if verdict is True:
            admitted = True
            break
        if verdict is False:
            break
        answers.append(verdict.wire(True))
        start = whole
        if data[start : start + 5] != b"POST ":
            break
    return Screened(answers[0] if len(answers) == 1 else b"".join(answers), start, admitted)


_MAX_KEPT_HEADS = 256
_MAX_KEPT_HEAD = 2048
_PLAIN_HEADS: dict[bytes, tuple[bytes, int]] = {}
"""Heads found plain, by their bytes: a client sends the same head again and again, so the
checks of :func:`plain_post` run once per distinct head (the limits are the server's, one per
process; a head kept is within them)."""


def _framing(head: bytes, limits: ConnectionLimits) -> tuple[bytes, int] | None:
    """:func:`plain_post` through the cache of heads found plain."""
    framing = _PLAIN_HEADS.get(head)
    if framing is not None:
        return None if framing[1] > limits.max_body_bytes else framing  # another listener's limits
    framing = plain_post(head, limits)
    if framing is not None and len(head) <= _MAX_KEPT_HEAD:
        if len(_PLAIN_HEADS) >= _MAX_KEPT_HEADS:
            _PLAIN_HEADS.clear()
        _PLAIN_HEADS[head] = framing
    return framing


_TOKEN = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
"""A field name's bytes, lower case (RFC 9110 5.6.2: tchar)."""
_CONTROL = bytes(c for c in range(32) if c != 9) + b"\x7f"
"""Bytes no field value holds (a bare CR or LF among them; a tab is allowed)."""
_REFUSED_FIELDS = (b"\r\ntransfer-encoding:", b"\r\nexpect:", b"\r\nupgrade:", b"\r\nx-request-id:")


def plain_post(head: bytes, limits: ConnectionLimits) -> tuple[bytes, int] | None:
    """``(url, content length)`` of a request head (without its blank line) whose framing
    leaves no doubt, else None (the parser takes it).

    The request line is ``POST <target> HTTP/1.1`` (no control byte in the target); the fields hold exactly one
    Content-Length of digits within the body limit, no Transfer-Encoding (the two together
    are a smuggling attempt the parser answers 400), no Expect (the client waits for 100
    Continue), no Upgrade, no X-Request-ID (echoed: the headers path answers it), a
    Connection field only of ``keep-alive``, every field name a token (no folded line, no
    space before a colon) and no control byte in a value, a bare LF included: llhttp rejects
    those, and a refusal must not read a length, or keep a connection, the parser would not.
    """
    line_end = head.find(b"\r\n")
    if line_end < 0:
        return None
    parts = head[:line_end].split(b" ")
    if len(parts) != 3 or parts[0] != b"POST" or parts[2] != b"HTTP/1.1":
        return None
    if not parts[1] or len(parts[1].translate(None, _CONTROL)) != len(parts[1]):
        return None
    fields = head[line_end:].lower()
    if fields.count(b"\r\n") > limits.max_headers:
        return None
    for line in fields[2:].split(b"\r\n"):
        name, colon, value = line.partition(b":")
        if (
            not colon
            or not name
            or name.translate(None, _TOKEN)
            or len(value.translate(None, _CONTROL)) != len(value)
        ):
            return None  # not a token before the colon (a folded line, a space), or a control byte
    for name in _REFUSED_FIELDS:
        if name in fields:
            return None
    at = fields.find(b"\r\nconnection:")
    if at >= 0:
        stop = fields.find(b"\r\n", at + 2)
        if fields[at + 13 : stop if stop >= 0 else len(fields)].strip(b" \t") != b"keep-alive":
            return None
    at = fields.find(b"\r\ncontent-length:")
    if at < 0 or fields.find(b"\r\ncontent-length:", at + 2) >= 0:
        return None
    stop = fields.find(b"\r\n", at + 2)
    value = fields[at + 17 : stop if stop >= 0 else len(fields)].strip(b" \t")
    if not value.isdigit() or len(value) > 12:
        return None
    length = int(value)
    if length > limits.max_body_bytes:
        return None
    return parts[1], length
