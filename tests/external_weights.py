"""A model whose weights live in an external-data file, for the tests of private weights and
version completion."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["ROWS", "external_model", "write_external_version"]

ROWS = 64


def external_model(value: float) -> onnx.ModelProto:
    """``y = (x * s) @ W`` with s all ones and W (64 x 4) all ``value``: 64 * value per unit
    input. Mul's operand is never prepacked: a request reads its external bytes where they are."""
    ones = numpy_helper.from_array(np.ones(ROWS, np.float32), "s")
    weights = numpy_helper.from_array(np.full((ROWS, 4), value, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "s"], ["h"]), helper.make_node("MatMul", ["h", "w"], ["y"])],
        "external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", ROWS])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [ones, weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def write_external_version(root: Path, name: str, version: int, value: float) -> Path:
    """``root/name/version/model.onnx`` with its weights in ``w.bin``; returns the folder."""
    folder = root / name / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(
        external_model(value), str(folder / "model.onnx"), save_as_external_data=True, location="w.bin",
        size_threshold=0,
    )  # fmt: skip
    return folder
