"""The plain-POST screen without a connection: where a read's scan stops, and a differential
check of :func:`plain_post` against llhttp (httptools): a head it reads as plain is one the
parser accepts, with the same target and Content-Length, whatever bytes the head holds."""

from __future__ import annotations

import httptools
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ortserve.server.http.deadlines import ConnectionLimits
from ortserve.server.http.plain_post import plain_post, screen_whole
from ortserve.server.http.wire import CannedResponse


def post(body: bytes = b"{}", target: bytes = b"/x", extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: a\r\n%sContent-Length: %d\r\n\r\n%s" % (target, extra, len(body), body)


REFUSED = CannedResponse(b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 2\r\nretry-after: 1\r\n", b"{}")


class Screen:
    """Refuses every target but the ones named."""

    def __init__(self, admit: bytes = b"", to_headers: bytes = b"") -> None:
        self.admit = admit
        self.to_headers = to_headers
        self.asked: list[bytes] = []

    def __call__(self, url: bytes, *, again: bool = False) -> CannedResponse | bool:
        self.asked.append(url)
        if url == self.admit:
            return True
        if url == self.to_headers:
            return False
        return REFUSED


def test_every_whole_refused_post_of_a_read_is_answered_in_one_piece() -> None:
    data = post() + post(b"[1]") + post()
    screened = screen_whole(data, Screen(), ConnectionLimits())
    assert screened.rest == len(data)
    assert screened.answers == REFUSED.wire(True) * 3
    assert not screened.admitted


def test_the_scan_stops_at_a_request_admitted_left_to_its_headers_or_not_plain() -> None:
    refused = post()
    for follower, admitted in (
        (post(target=b"/in"), True),
        (post(target=b"/ask"), False),
        (post(extra=b"Expect: 100-continue\r\n"), False),
        (b"GET /x HTTP/1.1\r\n\r\n", False),
        (post(b"{}")[:-1], False),  # its body not whole in this read
    ):
        screen = Screen(admit=b"/in", to_headers=b"/ask")
        screened = screen_whole(refused + follower, screen, ConnectionLimits())
        assert screened.rest == len(refused)
        assert screened.answers == REFUSED.wire(True)
        assert screened.admitted is admitted


def test_a_head_kept_as_plain_under_one_listeners_limits_is_not_taken_under_smaller_ones() -> None:
    data = post(b"x" * 100, target=b"/kept")
    assert screen_whole(data, Screen(), ConnectionLimits()).rest == len(data)
    screened = screen_whole(data, Screen(), ConnectionLimits(max_body_bytes=99))
    assert (screened.rest, screened.answers) == (0, b"")


class Parsed:
    """httptools' view of one request."""

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_message_complete(self) -> None:
        self.complete = True


_NAMES = st.sampled_from(
    [
        b"Host",
        b"Content-Length",
        b"content-length",
        b"Connection",
        b"Transfer-Encoding",
        b"Expect",
        b"Upgrade",
        b"X-Request-ID",
        b"Accept",
        b"Content-Length ",
        b"X\tY",
    ]
)
_VALUES = st.sampled_from(
    [
        b"12",
        b" 12 ",
        b"keep-alive",
        b"close",
        b"chunked",
        b"1x",
        b"-1",
        b"a",
        b"",
        b"0",
        b"a\x00b",
        b"a\rb",
        b"\tx",
    ]
)
_SEPARATORS = st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n", b"\r\n ", b"\r\n\t"])
_LINES = st.sampled_from(
    [
        b"POST /x HTTP/1.1",
        b"POST /v2/models/m/infer HTTP/1.1",
        b"POST /x HTTP/1.0",
        b"POST  /x HTTP/1.1",
        b"POST /x y HTTP/1.1",
        b"GET /x HTTP/1.1",
        b"POST /x\x01 HTTP/1.1",
        b"POST /x\x7f HTTP/1.1",
    ]
)


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    head = draw(_LINES)
    for _ in range(draw(st.integers(0, 5))):
        head += (
            draw(_SEPARATORS) + draw(_NAMES) + draw(st.sampled_from([b": ", b":", b" : "])) + draw(_VALUES)
        )
    if draw(st.booleans()):
        head += draw(st.binary(max_size=8))
    return head


@settings(max_examples=1000, deadline=None)
@given(heads())
def test_a_head_read_as_plain_is_one_llhttp_reads_with_the_same_target_and_length(head: bytes) -> None:
    assume(b"\r\n\r\n" not in head)  # a head is cut at its first blank line
    framing = plain_post(head, ConnectionLimits())
    if framing is None:
        return
    url, length = framing
    parsed = Parsed()
    parser = httptools.HttpRequestParser(parsed)
    parser.feed_data(head + b"\r\n\r\n" + b"b" * length)  # raises on anything llhttp refuses
    assert parsed.complete
    assert parser.get_method() == b"POST"
    assert parser.get_http_version() == "1.1"
    assert parsed.url == url
    lengths = [int(v) for n, v in parsed.headers if n == b"content-length"]
    assert lengths == [length]
