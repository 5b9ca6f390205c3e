"""Running bfloat16 graphs through OrtValues: uint16 bit patterns in and out, no casts."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from model_builders import bf16_model, failing_model, serialized
from ortserve.core.datatypes import bf16_from_float32, bf16_to_float32
from ortserve.core.ortvalues import OrtValueRun, needs_ort_values
from ortserve.errors import RepositoryError


def session(model_bytes: bytes) -> ort.InferenceSession:
    return ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def bf16_session() -> ort.InferenceSession:
    return session(serialized(bf16_model()))


def test_only_graphs_with_a_bf16_tensor_need_ort_values(bf16_session: ort.InferenceSession) -> None:
    assert needs_ort_values(bf16_session)
    assert not needs_ort_values(session(serialized(failing_model())))


def test_bf16_bits_go_in_and_come_out_as_uint16(bf16_session: ort.InferenceSession) -> None:
    x = bf16_from_float32(np.array([[1.0, -1.5, 0.1, np.nan], [3.140625, 0.0, -0.0, np.inf]]))
    y, y_f32 = OrtValueRun(bf16_session, ["y", "y_f32"])({"x": x})
    doubled = bf16_to_float32(x) * 2
    assert y.dtype == np.uint16 and y.shape == (2, 4)
    np.testing.assert_array_equal(y, bf16_from_float32(doubled))
    assert y[0, 0] == 0x4000 and y[0, 3] == 0x7FC0  # 2.0, and NaN stays NaN
    assert y_f32.dtype == np.float32
    np.testing.assert_array_equal(y_f32, doubled)


def test_outputs_follow_the_requested_order_and_own_their_memory(bf16_session: ort.InferenceSession) -> None:
    x = bf16_from_float32(np.ones((3, 4)))
    y_f32, y = OrtValueRun(bf16_session, ["y_f32", "y"])({"x": x})
    assert y_f32.dtype == np.float32 and y.dtype == np.uint16
    assert y.flags.owndata and y.flags.writeable
    np.testing.assert_array_equal(y, np.full((3, 4), 0x4000, np.uint16))


def test_read_only_and_strided_inputs_are_read_correctly(bf16_session: ort.InferenceSession) -> None:
    body = bf16_from_float32(np.arange(16, dtype=np.float32).reshape(2, 8)).tobytes()
    wide = np.frombuffer(body, dtype=np.uint16).reshape(2, 8)
    (y,) = OrtValueRun(bf16_session, ["y"])({"x": wide[:, ::2]})
    np.testing.assert_array_equal(bf16_to_float32(y), [[0, 4, 8, 12], [16, 20, 24, 28]])


def test_an_empty_batch_gives_empty_outputs(bf16_session: ort.InferenceSession) -> None:
    y, y_f32 = OrtValueRun(bf16_session, ["y", "y_f32"])({"x": np.empty((0, 4), np.uint16)})
    assert y.shape == (0, 4) and y.dtype == np.uint16 and y_f32.shape == (0, 4)


def mixed_model(bf16_output: bool) -> onnx.ModelProto:
    """BF16 b and string s in; b -> Cast to float -> c (BF16 when asked), s -> t."""
    out = TensorProto.BFLOAT16 if bf16_output else TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Cast", ["b"], ["c"], to=out), helper.make_node("Identity", ["s"], ["t"])],
        "mixed",
        [
            helper.make_tensor_value_info("b", TensorProto.BFLOAT16, [2]),
            helper.make_tensor_value_info("s", TensorProto.STRING, [2]),
        ],
        [
            helper.make_tensor_value_info("c", out, [2]),
            helper.make_tensor_value_info("t", TensorProto.STRING, [2]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_bf16_inputs_next_to_string_inputs_run_when_no_output_is_bf16() -> None:
    run = OrtValueRun(session(serialized(mixed_model(bf16_output=False))), ["c", "t"])
    c, t = run({"b": np.array([0x3F80, 0xC040], np.uint16), "s": np.array(["a", "b"], dtype=object)})
    assert c.tolist() == [1.0, -3.0] and t.tolist() == ["a", "b"]


def test_a_graph_with_bf16_outputs_and_string_inputs_is_refused_when_loaded() -> None:
    with pytest.raises(RepositoryError, match="string inputs \\(s\\)"):
        OrtValueRun(session(serialized(mixed_model(bf16_output=True))), ["c", "t"])
