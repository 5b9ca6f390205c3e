"""gRPC's Length-Prefixed-Message on the server: framing an answer, the zlib window of a request's
``grpc-encoding``, and parsing a request message."""

from __future__ import annotations

from google.protobuf.message import DecodeError, Message

from ortserve.server.grpc.errors import GrpcAbort, StatusCode
from ortserve.server.grpc.field_budget import FieldBudgetExceeded, check_field_budget, field_budget
from ortserve.server.grpc.headers import ACCEPT_ENCODING

__all__ = ["framed", "parse_message", "wbits"]

_DECOMPRESSORS = {b"gzip": 31, b"deflate": 15}  # zlib wbits of each grpc-encoding


def framed(payload: bytes) -> bytes:
    """A Length-Prefixed-Message, uncompressed."""
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


def wbits(encoding: bytes) -> int:
    """zlib's window bits for a call's grpc-encoding.

    Raises:
        GrpcAbort: the encoding is not one the server inflates.
    """
    bits = _DECOMPRESSORS.get(encoding)
    if bits is None:
        if encoding == b"identity":
            raise GrpcAbort(StatusCode.INTERNAL, "compressed message without grpc-encoding")
        raise GrpcAbort(
            StatusCode.UNIMPLEMENTED,
            f"message compression {encoding.decode('latin-1')!r} is not supported",
            (("grpc-accept-encoding", ACCEPT_ENCODING.decode()),),
        )
    return bits


def parse_message(kind: type[Message], data: bytes | bytearray | memoryview) -> Message:
    """A request message of type ``kind``.

    A large message's fields are counted first (:mod:`~ortserve.server.grpc.field_budget`):
    parsing one made of millions of tiny fields would cost the loop seconds and gigabytes.

    Raises:
        GrpcAbort: INVALID_ARGUMENT, the bytes are not such a message; RESOURCE_EXHAUSTED,
            more fields than the message's size allows.
    """
    budget = field_budget(len(data))
    if budget is not None:
        try:
            check_field_budget(data, kind.DESCRIPTOR, budget)
        except FieldBudgetExceeded as exc:
            raise GrpcAbort(StatusCode.RESOURCE_EXHAUSTED, str(exc)) from None
    message = kind()
    try:
        message.ParseFromString(data)
    except DecodeError:
        raise GrpcAbort(
            StatusCode.INVALID_ARGUMENT, f"the request message is not a valid {kind.DESCRIPTOR.full_name}"
        ) from None
    return message
