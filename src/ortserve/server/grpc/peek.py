"""The model a ModelInferRequest names, read from its first bytes without parsing it.

Under overload most infer calls are refused; parsing every tensor of a message only to answer
RESOURCE_EXHAUSTED spends the CPU the model needs (issue 10). Protobuf serializers write
fields in field-number order, so ``model_name`` (field 1) and ``model_version`` (field 2)
come first in what every client sends. A message laid out otherwise is simply not peeked at
and takes the full path. A message that names a field again later (the last one wins when
parsed) is judged here by the first: it can only be refused for another model's load, never
served wrongly, and only a client that wrote it so can be affected.
"""

from __future__ import annotations

__all__ = ["peek_infer_target"]

_MODEL_NAME = 0x0A  # field 1, length-delimited
_MODEL_VERSION = 0x12  # field 2, length-delimited
_MAX_NAME = 1024  # longer names are left to the full path (and its own error)


def _length_delimited(data: bytes | bytearray | memoryview, pos: int) -> tuple[bytes, int] | None:
    """The bytes of a length-delimited field whose length starts at ``pos``, and where it ends."""
    length = shift = 0
    end = len(data)
    while True:
        if pos >= end or shift > 14:  # two varint bytes already say more than _MAX_NAME
            return None
        byte = data[pos]
        pos += 1
        length |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
    if length > _MAX_NAME or pos + length > end:
        return None
    return bytes(data[pos : pos + length]), pos + length


def peek_infer_target(data: bytes | bytearray | memoryview) -> tuple[str, str] | None:
    """``(model_name, model_version)`` ("" when absent) from a serialized ModelInferRequest
    whose first field is its model name, else None."""
    if not data or data[0] != _MODEL_NAME:
        return None
    name = _length_delimited(data, 1)
    if name is None:
        return None
    raw_name, pos = name
    version = b""
    if pos < len(data) and data[pos] == _MODEL_VERSION:
        found = _length_delimited(data, pos + 1)
        if found is None:
            return None
        version = found[0]
    try:
        return raw_name.decode("utf-8"), version.decode("utf-8")
    except UnicodeDecodeError:
        return None
