"""Load failures of common user models say what to do: skl2onnx's ZipMap output, and a
generated warm-up that a graph with a baked size cannot run."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortserve.core.types import InferInput, InferRequest
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.settings import ServerSettings


def save(root: Path, model: onnx.ModelProto, config: str | None = None) -> None:
    model.ir_version = 9
    onnx.checker.check_model(model)
    folder = root / "m" / "1"
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    if config is not None:
        (root / "m" / "config.yaml").write_text(config)


def zipmap_classifier() -> onnx.ModelProto:
    """Probabilities [N, 3] through ZipMap, as skl2onnx converts a classifier by default."""
    probabilities = helper.make_tensor_type_proto(TensorProto.FLOAT, [])
    zipped = helper.make_sequence_type_proto(helper.make_map_type_proto(TensorProto.INT64, probabilities))
    graph = helper.make_graph(
        [
            helper.make_node(
                "ZipMap", ["x"], ["output_probability"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2]
            )
        ],
        "zipmap",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_value_info("output_probability", zipped)],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def baked_length_model() -> onnx.ModelProto:
    """x [N, S] reshaped to [-1, 4, 2]: as a TorchScript export traced at length 8, it runs only
    when N * S is a multiple of 8, so the generated warm-up's S = 1 fails."""
    shape = numpy_helper.from_array(np.array([-1, 4, 2], dtype=np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "baked",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 4, 2])],
        [shape],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


async def load(root: Path) -> LifecycleManager:
    manager = LifecycleManager(ModelRegistry(), ServerSettings(root, intra_op_threads=1))
    await manager.start()
    return manager


async def test_a_zipmap_output_is_refused_with_the_zipmap_false_hint(tmp_path: Path) -> None:
    save(tmp_path, zipmap_classifier())
    manager = await load(tmp_path)
    try:
        error = manager.registry.entry("m").error or ""
        assert "'output_probability'" in error
        assert "'zipmap': False" in error
    finally:
        await manager.close(5.0)


async def test_a_failing_generated_warm_up_says_so_and_how_to_give_a_real_sample(tmp_path: Path) -> None:
    save(tmp_path, baked_length_model(), "batching:\n  max_batch_size: 0\n")
    manager = await load(tmp_path)
    try:
        error = manager.registry.entry("m").error or ""
        assert "warm-up with generated inputs failed" in error
        assert "x [1, 1]" in error and "give a real sample" in error
        assert "Reshape" in error  # ONNX Runtime's own words follow
    finally:
        await manager.close(5.0)


async def test_with_a_real_sample_the_generated_failure_is_a_warning_and_the_model_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sample = (
        "batching:\n  max_batch_size: 0\nwarmup:\n  - name: real\n    batch_size: 1\n"
        "    inputs:\n      x: {datatype: FP32, dims: [1, 8], data: random}\n"
    )
    save(tmp_path, baked_length_model(), sample)
    with caplog.at_level(logging.WARNING):
        manager = await load(tmp_path)
    try:
        assert any("the model's own warm-up samples" in r.getMessage() for r in caplog.records)
        x = np.arange(8, dtype=np.float32).reshape(1, 8)
        answer = await manager.registry.resolve("m", None).infer(
            InferRequest("m", [InferInput("x", "FP32", x.shape, x)])
        )
        assert answer.outputs[0].data.shape == (1, 4, 2)
    finally:
        await manager.close(5.0)
