"""Counting a request message's fields before parsing it: exact, bounded, and wired in."""

from __future__ import annotations

import pytest
from google.protobuf import empty_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.unknown_fields import UnknownFieldSet
from hypothesis import given, settings
from hypothesis import strategies as st

from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.server.grpc.errors import GrpcAbort, StatusCode
from ortserve.server.grpc.field_budget import FieldBudgetExceeded, check_field_budget, field_budget
from ortserve.server.grpc.messages import parse_message

REQUEST = pb.ModelInferRequest.DESCRIPTOR
VARINT_CPP_TYPES = {
    FieldDescriptor.CPPTYPE_INT32,
    FieldDescriptor.CPPTYPE_INT64,
    FieldDescriptor.CPPTYPE_UINT32,
    FieldDescriptor.CPPTYPE_UINT64,
    FieldDescriptor.CPPTYPE_BOOL,
    FieldDescriptor.CPPTYPE_ENUM,
}


def counted(data: bytes, descriptor: Descriptor) -> int:
    """The fields of ``data`` the way protobuf's own parser sees them: every field as unknown
    (parsed into Empty), descending into the fields the descriptor says are messages."""
    holder = empty_pb2.Empty()
    holder.ParseFromString(data)
    total = 0
    for field in UnknownFieldSet(holder):
        total += 1
        known = descriptor.fields_by_number.get(field.field_number)
        if field.wire_type != 2 or known is None:
            continue
        if known.message_type is not None:
            total += counted(field.data, known.message_type)
        elif known.label == FieldDescriptor.LABEL_REPEATED and known.cpp_type in VARINT_CPP_TYPES:
            total += len(field.data) // 8  # packed varints: charged a field per 8 bytes
    return total


def fewest_passing(data: bytes) -> int:
    """The smallest budget ``check_field_budget`` lets ``data`` through with."""
    low, high = 0, 1
    while True:
        try:
            check_field_budget(data, REQUEST, high)
            break
        except FieldBudgetExceeded:
            low, high = high, high * 2
    while low < high:
        middle = (low + high) // 2
        try:
            check_field_budget(data, REQUEST, middle)
            high = middle
        except FieldBudgetExceeded:
            low = middle + 1
    return low


_TEXT = st.text(max_size=5)
_PARAMETER = st.one_of(
    st.builds(lambda v: pb.InferParameter(int64_param=v), st.integers(-(2**40), 2**40)),
    st.builds(lambda v: pb.InferParameter(string_param=v), _TEXT),
    st.builds(lambda v: pb.InferParameter(bool_param=v), st.booleans()),
)


@st.composite
def requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=draw(_TEXT), id=draw(_TEXT))
    for key, value in draw(st.dictionaries(_TEXT, _PARAMETER, max_size=3)).items():
        message.parameters[key].CopyFrom(value)
    for _ in range(draw(st.integers(0, 4))):
        tensor = message.inputs.add(name=draw(_TEXT), datatype=draw(_TEXT))
        tensor.shape.extend(draw(st.lists(st.integers(-5, 2**40), max_size=4)))
        for key, value in draw(st.dictionaries(_TEXT, _PARAMETER, max_size=2)).items():
            tensor.parameters[key].CopyFrom(value)
        tensor.contents.bytes_contents.extend(draw(st.lists(st.binary(max_size=4), max_size=6)))
        tensor.contents.fp32_contents.extend(draw(st.lists(st.floats(width=32), max_size=4)))
    message.raw_input_contents.extend(draw(st.lists(st.binary(max_size=8), max_size=3)))
    for _ in range(draw(st.integers(0, 2))):
        message.outputs.add(name=draw(_TEXT))
    return message


@settings(max_examples=300, deadline=None)
@given(requests())
def test_the_count_is_the_parsers_own_count_of_fields(message: pb.ModelInferRequest) -> None:
    data = message.SerializeToString()
    assert fewest_passing(data) == counted(data, REQUEST)


@settings(max_examples=200, deadline=None)
@given(requests(), st.data())
def test_cut_or_corrupted_bytes_never_raise_anything_but_the_budget(
    message: pb.ModelInferRequest, data: st.DataObject
) -> None:
    wire = bytearray(message.SerializeToString())
    if wire:
        wire = wire[: data.draw(st.integers(0, len(wire)))]
        if wire:
            wire[data.draw(st.integers(0, len(wire) - 1))] = data.draw(st.integers(0, 255))
    try:
        check_field_budget(bytes(wire), REQUEST, 10_000)
    except FieldBudgetExceeded:
        pytest.fail("a message this small never holds 10,000 fields")


def test_the_count_stops_at_the_budget_whatever_the_message_holds() -> None:
    empty_inputs = b"\x0a\x01m" + b"\x2a\x00" * 3_000_000  # 6 MB of empty `inputs`
    with pytest.raises(FieldBudgetExceeded, match="more than 1,000 fields"):
        check_field_budget(empty_inputs, REQUEST, 1_000)


def test_packed_numbers_are_charged_for_what_they_become() -> None:
    """63 MiB of one-byte varints in a packed shape is one field on the wire and 63 million
    8-byte numbers parsed (1 GiB and a second of the loop): charged a field per 8 bytes."""
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="INT64", shape=[1] * 800_000)
    data = pb.ModelInferRequest(model_name="m", inputs=[tensor]).SerializeToString()
    with pytest.raises(FieldBudgetExceeded):
        check_field_budget(data, REQUEST, 99_999)
    check_field_budget(data, REQUEST, 100_010)


def test_small_messages_are_not_counted_and_large_ones_by_their_size() -> None:
    assert field_budget(64 * 1024) is None
    assert field_budget(64 << 20) == 65_536 + (64 << 20) // 256


def test_parse_message_refuses_a_flood_of_tiny_fields_as_resource_exhausted() -> None:
    flood = b"\x0a\x09small_mlp" + b"\x2a\x00" * (4 << 20)  # 8 MiB: 4 million empty inputs
    with pytest.raises(GrpcAbort) as caught:
        parse_message(pb.ModelInferRequest, flood)
    assert caught.value.code == StatusCode.RESOURCE_EXHAUSTED and "raw_input_contents" in caught.value.message
    # One input of 8 MiB of raw bytes: three fields, parsed.
    raw = pb.ModelInferRequest(model_name="m", raw_input_contents=[bytes(8 << 20)]).SerializeToString()
    assert isinstance(parse_message(pb.ModelInferRequest, raw), pb.ModelInferRequest)
