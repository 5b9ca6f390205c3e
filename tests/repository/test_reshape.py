"""config.pbtxt ``reshape``: clients send and get ``dims``, the graph takes and gives ``reshape``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortserve.core.types import InferInput, InferRequest
from ortserve.repository.config_source import read_model_source
from ortserve.repository.effective_config import effective_config
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.settings import ServerSettings

WEIGHTS = np.array([[1.0, 2.0], [3.0, 5.0]], np.float32)

BATCHED = """
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
"""

SCALAR = """
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape: { } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] reshape: { } } ]
"""


def _save(graph: onnx.GraphProto, folder: Path, external: bool) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    folder.mkdir(parents=True)
    path = str(folder / "model.onnx")
    if external:
        onnx.save(model, path, save_as_external_data=True, location="weights.bin", size_threshold=0)
    else:
        onnx.save(model, path)


def write_matmul(root: Path, config: str) -> None:
    """``y = x @ W`` on [batch, 2, 2] tensors, W in an external-data file."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, 2])],
        [numpy_helper.from_array(WEIGHTS, "w")],
    )
    _save(graph, root / "m" / "1", external=True)
    (root / "m" / "config.pbtxt").write_text(config)


def write_scalar(root: Path) -> None:
    """``y = 2 x`` on scalars."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])],
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    _save(graph, root / "m" / "1", external=False)
    (root / "m" / "config.pbtxt").write_text(SCALAR)


async def _answer(manager: LifecycleManager, rows: np.ndarray) -> np.ndarray:
    served = manager.registry.resolve("m", None)
    response = await served.submit(InferRequest("m", [InferInput("x", "FP32", rows.shape, rows)]))
    return np.asarray(response.outputs[0].data)


async def test_clients_send_and_get_dims_while_the_graph_takes_and_gives_its_reshape(tmp_path: Path) -> None:
    write_matmul(tmp_path, BATCHED)
    manager = LifecycleManager(ModelRegistry(), ServerSettings(tmp_path, intra_op_threads=1))
    await manager.start()
    try:
        served = manager.registry.resolve("m", None)
        assert [s.shape for s in served.info.inputs + served.info.outputs] == [(-1, 4), (-1, 4)]
        rows = np.arange(12, dtype=np.float32).reshape(3, 4)
        answer = await _answer(manager, rows)
        assert answer.shape == (3, 4)
        np.testing.assert_array_equal(answer, (rows.reshape(3, 2, 2) @ WEIGHTS).reshape(3, 4))
        config = effective_config(served.info, manager.registry.entry("m").config)
        assert list(config.input[0].dims) == [4] and list(config.output[0].dims) == [4]
    finally:
        await manager.close(5.0)


async def test_an_empty_reshape_feeds_a_scalar_graph_from_a_one_element_tensor(tmp_path: Path) -> None:
    write_scalar(tmp_path)
    manager = LifecycleManager(ModelRegistry(), ServerSettings(tmp_path, intra_op_threads=1))
    await manager.start()
    try:
        answer = await _answer(manager, np.array([1.5], np.float32))
        assert answer.shape == (1,) and answer[0] == 3.0
    finally:
        await manager.close(5.0)


async def test_a_reshape_the_graph_contradicts_makes_the_version_unavailable_naming_it(
    tmp_path: Path,
) -> None:
    write_matmul(tmp_path, BATCHED.replace("shape: [ 2, 2 ] } } ]\noutput", "shape: [ 4, 1 ] } } ]\noutput"))
    manager = LifecycleManager(ModelRegistry(), ServerSettings(tmp_path, intra_op_threads=1))
    await manager.start()
    try:
        entry = manager.registry.entry("m")
        assert not entry.versions
        assert "input 'x' reshape: [4, 1], but the graph takes [2, 2]" in (entry.error or "")
    finally:
        await manager.close(5.0)


@pytest.mark.parametrize(
    ("reshape", "message"),
    [
        ("[ 3 ]", "does not hold the elements of dims [4]"),
        ("[ -1, -1 ]", "has more than one -1"),
        ("[ 0, 4 ]", "dimensions must be positive or -1"),
    ],
)
async def test_a_reshape_that_cannot_hold_the_dims_is_refused(
    tmp_path: Path, reshape: str, message: str
) -> None:
    write_matmul(
        tmp_path, BATCHED.replace("shape: [ 2, 2 ] } } ]\noutput", f"shape: {reshape} }} }} ]\noutput")
    )
    assert read_model_source(tmp_path / "m").inputs[0].reshape is not None
    manager = LifecycleManager(ModelRegistry(), ServerSettings(tmp_path, intra_op_threads=1))
    await manager.start()
    try:
        assert message in (manager.registry.entry("m").error or "")
    finally:
        await manager.close(5.0)


def test_a_reshape_equal_to_the_dims_is_no_reshape(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(BATCHED.replace("[ 2, 2 ]", "[ 4 ]"))
    assert read_model_source(tmp_path / "m").reshapes() == ()
