"""gRPC message framing without I/O: any split of a stream's bytes gives back its messages."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ortserve.server.grpc.errors import GrpcAbort, StatusCode
from ortserve.server.grpc.framing import MessageFramer

LIMIT = 64

messages = st.lists(st.tuples(st.binary(max_size=LIMIT), st.booleans()), max_size=6)


def framed(message: bytes, compressed: bool) -> bytes:
    return bytes([int(compressed)]) + len(message).to_bytes(4, "big") + message


def feed_all(framer: MessageFramer, wire: bytes, cuts: list[int]) -> list[tuple[bytes, bool]]:
    found: list[tuple[bytes, bool]] = []
    bounds = [0, *sorted(c % (len(wire) + 1) for c in cuts), len(wire)]
    for start, end in itertools.pairwise(bounds):
        framer.feed(
            memoryview(wire)[start:end], lambda data, compressed: found.append((bytes(data), compressed))
        )
    return found


@settings(max_examples=300, deadline=None)
@given(messages, st.lists(st.integers(min_value=0), max_size=12))
def test_any_split_of_the_bytes_gives_back_the_messages_in_order(
    sent: list[tuple[bytes, bool]], cuts: list[int]
) -> None:
    wire = b"".join(framed(m, c) for m, c in sent)
    framer = MessageFramer(LIMIT)
    assert feed_all(framer, wire, cuts) == sent
    assert not framer.inside_message and framer.held == 0


@settings(max_examples=200, deadline=None)
@given(messages.filter(bool), st.integers(min_value=1), st.lists(st.integers(min_value=0), max_size=6))
def test_a_stream_cut_inside_a_message_is_seen_as_such(
    sent: list[tuple[bytes, bool]], short: int, cuts: list[int]
) -> None:
    wire = b"".join(framed(m, c) for m, c in sent)
    last = len(framed(*sent[-1]))
    cut = wire[: len(wire) - 1 - short % (last - 1)]  # ends inside the last message
    framer = MessageFramer(LIMIT)
    found = feed_all(framer, cut, cuts)
    assert framer.inside_message
    assert found == sent[:-1]
    assert framer.held <= LIMIT + 5  # what it buffers of the unfinished message, never more


def test_a_message_over_the_limit_is_refused_from_its_prefix() -> None:
    framer = MessageFramer(LIMIT)
    with pytest.raises(GrpcAbort) as caught:
        framer.feed(memoryview(b"\x00" + (LIMIT + 1).to_bytes(4, "big")), lambda data, compressed: None)
    assert caught.value.code is StatusCode.RESOURCE_EXHAUSTED


def test_an_unknown_compression_flag_is_refused() -> None:
    with pytest.raises(GrpcAbort) as caught:
        MessageFramer(LIMIT).feed(memoryview(b"\x02\x00\x00\x00\x01x"), lambda data, compressed: None)
    assert caught.value.code is StatusCode.INTERNAL


def test_a_message_whole_in_one_payload_is_a_view_of_it() -> None:
    wire = framed(b"abc", False)
    found: list[object] = []
    MessageFramer(LIMIT).feed(memoryview(wire), lambda data, compressed: found.append(data))
    assert isinstance(found[0], memoryview) and bytes(found[0]) == b"abc"
