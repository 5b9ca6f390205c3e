"""config.pbtxt ``optional`` inputs: left out, the graph's default (its initializer) is used."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortserve.core.types import InferInput, InferRequest
from ortserve.errors import InvalidInput
from ortserve.repository.effective_config import effective_config
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.settings import ServerSettings

BIAS = np.array([[10.0, 20.0, 30.0, 40.0]], np.float32)

CONFIG = """
max_batch_size: 8
input [
  { name: "x" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "bias" data_type: TYPE_FP32 dims: [ 4 ] optional: true }
]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def write_model(root: Path, config: str, bias: np.ndarray = BIAS) -> None:
    """``y = x + bias``; ``bias`` is a graph input with a default (an initializer)."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["y"])],
        "m",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["batch", 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(bias, "bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    (root / "m" / "1").mkdir(parents=True)
    onnx.save(model, str(root / "m" / "1" / "model.onnx"))
    (root / "m" / "config.pbtxt").write_text(config)


def tensor(name: str, value: np.ndarray) -> InferInput:
    return InferInput(name, "FP32", value.shape, value)


async def answer(manager: LifecycleManager, *inputs: InferInput) -> np.ndarray:
    response = await manager.registry.resolve("m", None).submit(InferRequest("m", list(inputs)))
    return np.asarray(response.outputs[0].data)


async def test_an_omitted_optional_input_gets_the_graphs_default_for_every_row(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_model(tmp_path, CONFIG)
    manager = LifecycleManager(ModelRegistry(), ServerSettings(tmp_path, intra_op_threads=1))
    with caplog.at_level(logging.WARNING):
        await manager.start()
    try:
        assert not [r for r in caplog.records if "not supported" in r.getMessage()]
        served = manager.registry.resolve("m", None)
        assert [s.name for s in served.info.inputs] == ["x", "bias"]
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_array_equal(await answer(manager, tensor("x", x)), x + BIAS)
        given = np.ones((3, 4), np.float32)
        np.testing.assert_array_equal(await answer(manager, tensor("x", x), tensor("bias", given)), x + 1)
        with pytest.raises(InvalidInput, match=r"missing inputs \['x'\]"):
            served.submit(InferRequest("m", [tensor("bias", given)]))
        config = effective_config(served.info, manager.registry.entry("m").config)
        assert [(i.name, i.optional) for i in config.input] == [("x", False), ("bias", True)]
    finally:
        await manager.close(5.0)


@pytest.mark.parametrize(
    ("config", "bias", "message"),
    [
        (CONFIG.replace('"bias" data_type', '"x2" data_type'), BIAS, "'x2' optional: it is not an input"),
        (
            CONFIG.replace(
                '"x" data_type: TYPE_FP32 dims: [ 4 ] }',
                '"x" data_type: TYPE_FP32 dims: [ 4 ] optional: true }',
            ),
            BIAS,
            "'x' optional: the graph requires it",
        ),
        (
            CONFIG,
            np.ones((2, 4), np.float32),
            "default has shape [2, 4]; a batching model's default must be one row",
        ),
    ],
)
async def test_an_optional_input_without_a_one_row_default_is_refused(
    tmp_path: Path, config: str, bias: np.ndarray, message: str
) -> None:
    write_model(tmp_path, config, bias)
    manager = LifecycleManager(ModelRegistry(), ServerSettings(tmp_path, intra_op_threads=1))
    await manager.start()
    try:
        entry = manager.registry.entry("m")
        assert not entry.versions and message in (entry.error or "")
    finally:
        await manager.close(5.0)
