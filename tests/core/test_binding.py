"""The device data path (IOBinding over a reusable arena), checked on the CPU against session.run."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from model_builders import serialized
from ortserve.core.binding import BindingRun, DeviceSpec, bindable, binding_device
from ortserve.core.runner import OrtRunner

_TYPES = {
    "f32": (TensorProto.FLOAT, np.float32),
    "f16": (TensorProto.FLOAT16, np.float16),
    "f64": (TensorProto.DOUBLE, np.float64),
    "i64": (TensorProto.INT64, np.int64),
    "i32": (TensorProto.INT32, np.int32),
    "i8": (TensorProto.INT8, np.int8),
    "u8": (TensorProto.UINT8, np.uint8),
    "b": (TensorProto.BOOL, np.bool_),
}
_CPU = DeviceSpec("cpu")


def _every_type_model() -> onnx.ModelProto:
    """Per datatype an identity of shape [batch, 3]; a float matmul; a sum over the batch
    (first dim 1, not the batch: left for ONNX Runtime to allocate)."""
    inputs, outputs, nodes = [], [], []
    for key, (proto, _) in _TYPES.items():
        inputs.append(helper.make_tensor_value_info(f"x_{key}", proto, ["batch", 3]))
        outputs.append(helper.make_tensor_value_info(f"y_{key}", proto, ["batch", 3]))
        nodes.append(helper.make_node("Identity", [f"x_{key}"], [f"y_{key}"]))
    weights = helper.make_tensor("w", TensorProto.FLOAT, [3, 5], np.linspace(-1, 1, 15).tolist())
    nodes.append(helper.make_node("MatMul", ["x_f32", "w"], ["mm"]))
    outputs.append(helper.make_tensor_value_info("mm", TensorProto.FLOAT, ["batch", 5]))
    nodes.append(helper.make_node("ReduceSum", ["x_f64", "axis0"], ["total"], keepdims=1))
    outputs.append(helper.make_tensor_value_info("total", TensorProto.DOUBLE, [1, 3]))
    axis0 = helper.make_tensor("axis0", TensorProto.INT64, [1], [0])
    graph = helper.make_graph(nodes, "every_type", inputs, outputs, initializer=[weights, axis0])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    return ort.InferenceSession(serialized(_every_type_model()), providers=["CPUExecutionProvider"])


def _feeds(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for key, (_, dtype) in _TYPES.items():
        if dtype is np.bool_:
            feeds[f"x_{key}"] = rng.integers(0, 2, (rows, 3)).astype(np.bool_)
        elif np.issubdtype(dtype, np.integer):
            feeds[f"x_{key}"] = rng.integers(-100 if dtype is not np.uint8 else 0, 100, (rows, 3)).astype(
                dtype
            )
        else:
            feeds[f"x_{key}"] = rng.standard_normal((rows, 3)).astype(dtype)
    return feeds


def _names(session: ort.InferenceSession) -> list[str]:
    return [arg.name for arg in session.get_outputs()]


@settings(max_examples=40, deadline=None)
@given(batches=st.lists(st.tuples(st.integers(1, 9), st.integers(0, 2**31)), min_size=1, max_size=8))
def test_bound_runs_equal_session_run_for_every_type_and_batch(
    session: ort.InferenceSession, batches: list[tuple[int, int]]
) -> None:
    bound = BindingRun(session, _names(session), _CPU, arena_shapes=4)
    kept: list[tuple[list[np.ndarray], list[np.ndarray]]] = []
    for rows, seed in batches:
        feeds = _feeds(rows, seed)
        got = bound(feeds)
        want = session.run(_names(session), feeds)
        kept.append((got, want))
        for name, g, w in zip(_names(session), got, want):
            assert g.dtype == w.dtype and g.shape == w.shape, name
            np.testing.assert_array_equal(g, w, err_msg=name)
    # What a caller was handed is its own: later batches through the same arena left it alone.
    for got, want in kept:
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_the_arena_stays_bounded_over_ten_thousand_batches(session: ort.InferenceSession) -> None:
    bound = BindingRun(session, ["mm", "y_f32"], _CPU, arena_shapes=6)
    zeros: dict[str, np.ndarray] = {
        f"x_{key}": np.zeros((40, 3), dtype) for key, (_, dtype) in _TYPES.items()
    }
    for index in range(10_000):
        rows = 1 + index % 40
        (mm, _) = bound({name: array[:rows] for name, array in zeros.items()})
        assert mm.shape == (rows, 5)
        assert bound.arena_size() <= 6


def _strings_model() -> onnx.ModelProto:
    text_in = helper.make_tensor_value_info("text", TensorProto.STRING, ["batch"])
    text_out = helper.make_tensor_value_info("text_out", TensorProto.STRING, ["batch"])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["text_out"])], "s", [text_in], [text_out]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_a_graph_with_strings_keeps_session_run_even_when_told_to_bind() -> None:
    session = ort.InferenceSession(serialized(_strings_model()), providers=["CPUExecutionProvider"])
    assert not bindable(session)
    runner = OrtRunner(session, 1, "strings", bind_on=_CPU)
    try:
        (out,), _ = runner.run_blocking({"text": np.array(["a", "bc"], dtype=object)})
        assert out.tolist() == ["a", "bc"]
    finally:
        runner.close()


def test_a_host_session_is_not_bound_and_a_runner_can_be_told_to(session: ort.InferenceSession) -> None:
    assert binding_device(session) is None and bindable(session)
    feeds = _feeds(4, 7)
    plain = OrtRunner(session, 1, "plain")
    bound = OrtRunner(session, 1, "bound", bind_on=_CPU)
    try:
        want, _ = plain.run_blocking(feeds)
        got, _ = bound.run_blocking(feeds)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    finally:
        plain.close()
        bound.close()
