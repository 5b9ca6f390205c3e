"""Routing a conversation's turns to the worker holding its prefix (``--workers N``): the
hashes of a prompt's leading cuts, the workers' shared tables, and the forward over a worker's
private socket (streamed and whole answers, the holder away)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from ortserve.server.deferred import Deferred
from ortserve.server.http.messages import HttpRequest, HttpResponse, resolve_response
from ortserve.supervisor.plan import TOKEN_HEADER
from ortserve.supervisor.prefix_route import (
    U64,
    PrefixDirectory,
    PrefixRouter,
    generate_hashes,
    prefix_hashes,
)

_CHAT = "/v1/chat/completions"
_COMPLETIONS = "/v1/completions"


def _body(**fields: object) -> bytes:
    return json.dumps({"model": "m", **fields}).encode()


def _starts_with(longer: U64, shorter: U64) -> bool:
    return len(shorter) > 0 and bool(np.array_equal(longer[: len(shorter)], shorter))


@pytest.mark.parametrize("length", [64, 70, 200, 1000, 5000])
def test_a_text_follow_up_repeats_every_cut_of_its_first_turn(length: int) -> None:
    first = "".join(chr(97 + (i * 7) % 26) for i in range(length))
    second = first + " the reply, then the next question"
    a, b = prefix_hashes(_COMPLETIONS, _body(prompt=first)), prefix_hashes(_COMPLETIONS, _body(prompt=second))
    assert _starts_with(b, a)
    assert len(a) == length // 64 and len(set(a.tolist())) == len(a)  # one per 64 bytes


def test_a_token_follow_up_and_a_chat_follow_up_repeat_their_first_turns_cuts() -> None:
    ids = [(i * 37) % 250 + 3 for i in range(100)]
    a = prefix_hashes(_COMPLETIONS, _body(prompt=ids))
    assert len(a) == 6  # one per 16 ids
    assert _starts_with(prefix_hashes(_COMPLETIONS, _body(prompt=ids + [5, 6, 7] * 40)), a)
    turn = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Tell me about the lighthouse keeper and the ships at sea."},
    ]
    later = [*turn, {"role": "assistant", "content": "He kept a log."}, {"role": "user", "content": "Why?"}]
    assert _starts_with(
        prefix_hashes(_CHAT, _body(messages=later)), prefix_hashes(_CHAT, _body(messages=turn))
    )


def test_the_model_and_the_salt_separate_prefixes_and_nothing_usable_hashes_to_nothing() -> None:
    prompt = "x" * 300
    plain = prefix_hashes(_COMPLETIONS, _body(prompt=prompt))
    salted = prefix_hashes(_COMPLETIONS, _body(prompt=prompt, cache_salt="user-1"))
    other = prefix_hashes(_COMPLETIONS, json.dumps({"model": "n", "prompt": prompt}).encode())
    keyed = prefix_hashes(_COMPLETIONS, _body(prompt=prompt), b"Bearer tenant-a")
    hashes = [set(h.tolist()) for h in (plain, salted, other, keyed)]
    assert len(plain) == 4 and all(not a & b for i, a in enumerate(hashes) for b in hashes[i + 1 :])
    assert all(value % 2 == 1 for value in plain.tolist())
    for body in (
        b"not json",
        b"[1]",
        _body(prompt="short"),
        _body(prompt=[1, 2, 3]),
        _body(prompt=[1.5] * 20),
    ):
        assert len(prefix_hashes(_COMPLETIONS, body)) == 0
    assert len(prefix_hashes(_CHAT, _body(messages=[]))) == 0
    assert len(prefix_hashes(_COMPLETIONS, _body(prompt=[2**63] * 20))) == 0


def test_the_longest_prefix_held_decides_and_a_new_conversation_stays_where_it_landed(tmp_path: Path) -> None:
    zero, one = PrefixDirectory(tmp_path, 0, 2, slots=1024), PrefixDirectory(tmp_path, 1, 2, slots=1024)
    preamble = "You are a helpful assistant who answers briefly. " * 3  # 150 bytes: 2 blocks
    conversation = prefix_hashes(
        _COMPLETIONS, _body(prompt=preamble + "Q1: where do the ships go at night? " * 3)
    )
    elsewhere = prefix_hashes(
        _COMPLETIONS, _body(prompt=preamble + "Q9: and the keeper, where does he go? " * 3)
    )
    assert zero.holder(conversation) is None and one.holder(conversation) is None
    one.record(conversation)
    assert zero.holder(conversation) == 1 and one.holder(conversation) == 1
    # both hold the shared preamble: a new conversation over it is not sent anywhere
    zero.record(elsewhere)
    new = prefix_hashes(_COMPLETIONS, _body(prompt=preamble + "Q5: what is the log for? " * 4))
    assert zero.holder(new) == 0 and one.holder(new) == 1
    follow_up = prefix_hashes(
        _COMPLETIONS, _body(prompt=preamble + "Q1: where do the ships go at night? " * 3 + "Home. Q2: why?")
    )
    assert zero.holder(follow_up) == 1
    restarted = PrefixDirectory(tmp_path, 1, 2, slots=1024)  # a restarted worker's cache is empty
    assert zero.holder(conversation) == 0  # (the shared preamble: zero holds it)
    assert restarted.holder(prefix_hashes(_COMPLETIONS, _body(prompt="z" * 500))) is None
    for directory in (zero, one, restarted):
        directory.close()


class _Holder:
    """Worker 1's private socket: answers what the forward sends, streamed or whole."""

    def __init__(self, path: Path, token: str, stream: bool) -> None:
        self.path, self.token, self.stream = path, token, stream
        self.requests: list[tuple[bytes, dict[bytes, bytes], bytes]] = []
        self.hung_up = asyncio.Event()

    async def __aenter__(self) -> _Holder:
        self._server = await asyncio.start_unix_server(self._serve, str(self.path))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readuntil(b"\r\n")
        headers: dict[bytes, bytes] = {}
        while (field := await reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = field.partition(b":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers[b"content-length"]))
        self.requests.append((line, headers, body))
        if not self.stream:
            answer = b'{"answered":"by one"}'
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-extra: 7\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(answer), answer)
            )
            await writer.drain()
            writer.close()
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        try:
            for index in range(3):
                event = b'data: {"n": %d}\n\n' % index
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            await reader.read()  # until the forwarding side hangs up
        finally:
            self.hung_up.set()
            writer.close()


async def _collect(stream: AsyncIterator[bytes] | None) -> list[bytes]:
    assert stream is not None
    return [piece async for piece in stream]


def _router(tmp_path: Path, token: str) -> tuple[PrefixRouter, PrefixDirectory, list[HttpRequest]]:
    directory = PrefixDirectory(tmp_path, 0, 2, slots=1024)
    served: list[HttpRequest] = []
    router = PrefixRouter(directory, lambda index: tmp_path / f"worker-{index}.sock", token)
    return router, directory, served


def _local(served: list[HttpRequest]) -> object:
    async def local(request: HttpRequest) -> HttpResponse:
        served.append(request)
        return HttpResponse(200, [b'{"answered":"here"}'])

    return local


@pytest.mark.parametrize("stream", [True, False])
def test_a_request_whose_prefix_another_worker_holds_is_answered_by_it(tmp_path: Path, stream: bool) -> None:
    token = "secret-token"
    router, directory, served = _router(tmp_path, token)
    body = _body(prompt="the keeper of the lighthouse wrote in the log " * 4, stream=stream)
    holder_table = PrefixDirectory(tmp_path, 1, 2, slots=1024)
    holder_table.record(prefix_hashes(_COMPLETIONS, body, b"Bearer k"))  # salted by the API key
    handler = router.wrap(_COMPLETIONS, _local(served))  # type: ignore[arg-type]
    request = HttpRequest(
        "POST",
        _COMPLETIONS,
        "",
        {b"authorization": b"Bearer k", b"content-length": b"1", b"host": b"x", TOKEN_HEADER: b"forged"},
        body,
    )

    async def run() -> tuple[HttpResponse, list[bytes], _Holder]:
        async with _Holder(tmp_path / "worker-1.sock", token, stream) as holder:
            response = await handler(request)
            pieces = await _collect(response.stream) if response.stream is not None else []
            if stream:
                await asyncio.wait_for(holder.hung_up.wait(), 5)
            return response, pieces, holder

    response, pieces, holder = asyncio.run(run())
    assert served == [] and router.forwarded == 1
    ((line, headers, sent),) = holder.requests
    assert line == b"POST /v1/completions HTTP/1.1\r\n" and sent == body
    assert headers[TOKEN_HEADER] == token.encode() and headers[b"authorization"] == b"Bearer k"
    assert headers[b"host"] == b"localhost" and headers[b"content-length"] == str(len(body)).encode()
    if stream:
        assert response.content_type == b"text/event-stream" and response.chunks == []
        assert pieces == [b'data: {"n": %d}\n\n' % i for i in range(3)]
    else:
        assert response.chunks == [b'{"answered":"by one"}'] and (b"x-extra", b"7") in response.headers
    assert all(name not in (b"content-length", b"transfer-encoding") for name, _ in response.headers)
    assert (b"x-ortserve-prefix-worker", b"1") in response.headers
    directory.close()
    holder_table.close()


def test_a_forwarded_request_a_new_one_and_an_unreachable_holder_are_answered_here(tmp_path: Path) -> None:
    token = "secret-token"
    router, directory, served = _router(tmp_path, token)
    handler = router.wrap(_COMPLETIONS, _local(served))  # type: ignore[arg-type]
    held = _body(prompt="a conversation worker one has seen before, long enough " * 2)
    other = PrefixDirectory(tmp_path, 1, 2, slots=1024)
    other.record(prefix_hashes(_COMPLETIONS, held))

    async def run() -> list[HttpResponse]:
        return [
            await handler(HttpRequest("POST", _COMPLETIONS, "", {}, held)),  # worker 1 has no socket
            await handler(HttpRequest("POST", _COMPLETIONS, "", {TOKEN_HEADER: token.encode()}, held)),
            await handler(
                HttpRequest("POST", _COMPLETIONS, "", {}, _body(prompt="never seen anywhere " * 5))
            ),
        ]

    answers = asyncio.run(run())
    assert [a.chunks for a in answers] == [[b'{"answered":"here"}']] * 3 and len(served) == 3
    assert router.forwarded == 0 and router.fell_back == 1
    # what this worker answered, it now holds: the next turn of each comes here
    assert directory.holder(prefix_hashes(_COMPLETIONS, held)) == 0
    directory.close()
    other.close()


def test_a_generate_body_hashes_as_the_same_text_prompt_does_and_its_salt_separates_it() -> None:
    text = "the keeper of the lighthouse wrote in the log " * 5
    completions = prefix_hashes(_COMPLETIONS, _body(prompt=text), b"Bearer k")
    generate = generate_hashes("m", json.dumps({"text_input": text}).encode(), b"Bearer k")
    assert len(generate) == len(text) // 64 and np.array_equal(generate, completions)
    salted = generate_hashes(
        "m", json.dumps({"text_input": text, "parameters": {"cache_salt": "u"}}).encode()
    )
    other_model = generate_hashes("n", json.dumps({"text_input": text}).encode(), b"Bearer k")
    assert not set(salted.tolist()) & set(generate.tolist())
    assert not set(other_model.tolist()) & set(generate.tolist())
    for body in (b"nope", b"[]", b'{"text_input": 5}', b'{"text_input": "short"}'):
        assert len(generate_hashes("m", body)) == 0


def test_a_generate_request_whose_prefix_another_worker_holds_is_answered_by_it(tmp_path: Path) -> None:
    token = "secret-token"
    router, directory, _ = _router(tmp_path, token)
    text = "the keeper of the lighthouse wrote in the log " * 4
    body = json.dumps({"text_input": text, "parameters": {"max_tokens": 4}}).encode()
    holder_table = PrefixDirectory(tmp_path, 1, 2, slots=1024)
    holder_table.record(generate_hashes("m", body))
    calls: list[tuple[str, str | None]] = []

    def local(request: HttpRequest, name: str, version: str | None) -> HttpResponse:
        calls.append((name, version))
        return HttpResponse(200, [b'{"answered":"here"}'])

    handler = router.wrap_model(local)
    path = "/v2/models/m/versions/2/generate_stream"

    async def run() -> tuple[HttpResponse, list[bytes], HttpResponse, _Holder]:
        async with _Holder(tmp_path / "worker-1.sock", token, True) as holder:
            routed = handler(HttpRequest("POST", path, "", {}, body), "m", "2")
            assert not isinstance(routed, (HttpResponse, Deferred))
            response = await routed
            pieces = await _collect(response.stream)
            await asyncio.wait_for(holder.hung_up.wait(), 5)
            new = await resolve_response(
                handler(
                    HttpRequest("POST", path, "", {}, json.dumps({"text_input": "x" * 200}).encode()),
                    "m",
                    "2",
                )
            )
            return response, pieces, new, holder

    response, pieces, new, holder = asyncio.run(run())
    ((line, _, sent),) = holder.requests
    assert line == f"POST {path} HTTP/1.1\r\n".encode() and sent == body
    assert pieces == [b'data: {"n": %d}\n\n' % i for i in range(3)] and router.forwarded == 1
    assert (b"x-ortserve-prefix-worker", b"1") in response.headers
    assert new.chunks == [b'{"answered":"here"}'] and calls == [("m", "2")]  # a new prompt stays here
    plain = handler(HttpRequest("GET", path, "", {}, b""), "m", None)  # not routed: the route says 405
    assert isinstance(plain, HttpResponse) and calls[-1] == ("m", None)
    directory.close()
    holder_table.close()
