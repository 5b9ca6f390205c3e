"""The device data path (IOBinding over a reusable arena), checked on the CPU against session.run."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from binding_models import TYPES, every_type_feeds, every_type_model
from model_builders import serialized
from ortserve.core.binding import BindingRun, DeviceSpec, bindable, binding_device
from ortserve.core.runner import OrtRunner

_CPU = DeviceSpec("cpu")


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    return ort.InferenceSession(serialized(every_type_model()), providers=["CPUExecutionProvider"])


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
        feeds = every_type_feeds(rows, seed)
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
    zeros: dict[str, np.ndarray] = {f"x_{key}": np.zeros((40, 3), dtype) for key, (_, dtype) in TYPES.items()}
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
    feeds = every_type_feeds(4, 7)
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
