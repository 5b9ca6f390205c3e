"""The model a ModelInferRequest names, peeked from its first bytes, against protobuf's parse."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from ortserve.server.grpc.peek import peek_infer_target

names = st.text(max_size=80)


@given(names, names, st.binary(max_size=64), st.integers(0, 3))
def test_a_serialized_request_peeks_as_protobuf_parses_it(
    name: str, version: str, raw: bytes, inputs: int
) -> None:
    message = service_pb2.ModelInferRequest(model_name=name, model_version=version, id="request-7")
    for index in range(inputs):
        message.inputs.add(name=f"in{index}", datatype="FP32", shape=[1, 4])
        message.raw_input_contents.append(raw)
    data = message.SerializeToString()
    parsed = service_pb2.ModelInferRequest.FromString(data)
    if not name:
        assert peek_infer_target(data) is None  # an empty name is not written: the full path
    else:
        assert peek_infer_target(data) == (parsed.model_name, parsed.model_version)


@given(st.binary(max_size=200))
def test_any_bytes_peek_to_a_target_or_none_without_raising(data: bytes) -> None:
    target = peek_infer_target(data)
    assert target is None or (isinstance(target[0], str) and isinstance(target[1], str))


def test_messages_laid_out_otherwise_or_cut_short_take_the_full_path() -> None:
    name_last = service_pb2.ModelInferRequest(id="x").SerializeToString() + b"\x0a\x01m"
    assert peek_infer_target(name_last) is None
    assert peek_infer_target(b"\x0a\x05abc") is None  # the name runs past the end
    assert peek_infer_target(b"\x0a\xff\xff\xff\x0f") is None  # a huge declared length
    assert peek_infer_target(b"\x0a\x02\xff\xfe") is None  # not UTF-8
    assert peek_infer_target(memoryview(b"\x0a\x01m\x12\x01" + b"2")) == ("m", "2")
