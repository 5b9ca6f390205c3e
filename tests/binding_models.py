"""A graph with one identity per datatype, for the device data path's tests (CPU and CUDA)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

TYPES = {
    "f32": (TensorProto.FLOAT, np.float32),
    "f16": (TensorProto.FLOAT16, np.float16),
    "f64": (TensorProto.DOUBLE, np.float64),
    "i64": (TensorProto.INT64, np.int64),
    "i32": (TensorProto.INT32, np.int32),
    "i8": (TensorProto.INT8, np.int8),
    "u8": (TensorProto.UINT8, np.uint8),
    "b": (TensorProto.BOOL, np.bool_),
}


def every_type_model() -> onnx.ModelProto:
    """Per datatype an identity of shape [batch, 3]; a float matmul; a sum over the batch
    (first dim 1, not the batch: left for ONNX Runtime to allocate)."""
    inputs, outputs, nodes = [], [], []
    for key, (proto, _) in TYPES.items():
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


def every_type_feeds(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for key, (_, dtype) in TYPES.items():
        if dtype is np.bool_:
            feeds[f"x_{key}"] = rng.integers(0, 2, (rows, 3)).astype(np.bool_)
        elif np.issubdtype(dtype, np.integer):
            feeds[f"x_{key}"] = rng.integers(-100 if dtype is not np.uint8 else 0, 100, (rows, 3)).astype(
                dtype
            )
        else:
            feeds[f"x_{key}"] = rng.standard_normal((rows, 3)).astype(dtype)
    return feeds
