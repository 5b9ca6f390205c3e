"""Models built for tests (slow, failing at run time, unloadable) and a NumPy MLP reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_IR_VERSION = 9
ERROR_SERVER_MAX_BODY = 2_000_000
"""Body limit of the shared error-path server (conftest ``error_repository_server``)."""
ERROR_SERVER_SHM_REGIONS = 4
"""Most shared-memory regions the error-path server lets clients register."""
_OPSET = 17


def _save(model: onnx.ModelProto, root: Path, name: str, config: str | None = None) -> None:
    model.ir_version = _IR_VERSION
    onnx.checker.check_model(model)
    version = root / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(version / "model.onnx"))
    if config is not None:
        (root / name / "config.yaml").write_text(config, encoding="utf-8")


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)])


def slow_model(matmuls: int = 24, size: int = 256) -> onnx.ModelProto:
    """[-1, size, size] -> chain of self-multiplications: tens of ms per row on one core."""
    nodes = []
    current = "x"
    for index in range(matmuls):
        out = "y" if index == matmuls - 1 else f"m{index}"
        nodes.append(helper.make_node("MatMul", [current, "x"], [out]))
        current = out
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", size, size])],
    )
    return _model(graph)


def failing_model() -> onnx.ModelProto:
    """Reshapes [-1, 4] to [-1, 3]: fails at run time unless rows are a multiple of 3."""
    shape = numpy_helper.from_array(np.array([-1, 3], dtype=np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "failing",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
        [shape],
    )
    return _model(graph)


def typed_model() -> onnx.ModelProto:
    """Identity over INT64, BOOL, FP16 and string inputs, unbatched shapes with fixed dims."""
    specs = [
        ("i64", TensorProto.INT64, [2, 3]),
        ("flag", TensorProto.BOOL, [2]),
        ("half", TensorProto.FLOAT16, [4]),
        ("text", TensorProto.STRING, [2]),
    ]
    graph = helper.make_graph(
        [helper.make_node("Identity", [name], [f"{name}_out"]) for name, _, _ in specs],
        "typed",
        [helper.make_tensor_value_info(name, kind, shape) for name, kind, shape in specs],
        [helper.make_tensor_value_info(f"{name}_out", kind, shape) for name, kind, shape in specs],
    )
    return _model(graph)


def bf16_model() -> onnx.ModelProto:
    """BF16 x [-1, 4] -> y = x * 2 as BF16 (via float) and y_f32 = the same product in FP32."""
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["x_f32"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["x_f32", "two"], ["y_f32"]),
            helper.make_node("Cast", ["y_f32"], ["y"], to=TensorProto.BFLOAT16),
        ],
        "bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["batch", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.BFLOAT16, ["batch", 4]),
            helper.make_tensor_value_info("y_f32", TensorProto.FLOAT, ["batch", 4]),
        ],
        [two],
    )
    return _model(graph)


def serialized(model: onnx.ModelProto) -> bytes:
    """A checked model as bytes, for an in-memory ``onnxruntime.InferenceSession``."""
    model.ir_version = _IR_VERSION
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def write_error_repository(root: Path) -> None:
    """A repository exercising every error path next to a healthy model."""
    _save(slow_model(), root, "slow", "batching:\n  max_batch_size: 0\n  max_queue_size: 2\n")
    _save(failing_model(), root, "failing", "batching:\n  max_batch_size: 8\nwarmup_batch_sizes: [3, 6]\n")
    (root / "failing" / "labels.txt").write_text("cat\ndog\nbird\n")  # classification's labels
    _save(typed_model(), root, "typed")
    _save(bf16_model(), root, "bf16", "batching:\n  max_batch_size: 8\n")
    broken = root / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"this is not an onnx file")
    bad_config = root / "bad_config" / "1"
    bad_config.mkdir(parents=True)
    _save(failing_model(), root, "bad_config", "batching:\n  max_batch_size: -3\n")


def mlp_reference(model_path: Path, inputs: np.ndarray) -> np.ndarray:
    """The demo MLP's forward pass in NumPy, read from the ONNX file's initializers."""
    model = onnx.load(str(model_path))
    weights = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    layers = len([n for n in weights if n.startswith("w")])
    hidden = inputs.astype(np.float64)
    for index in range(layers):
        hidden = hidden @ weights[f"w{index}"] + weights[f"b{index}"]
        if index != layers - 1:
            hidden = np.maximum(hidden, 0.0)
    return hidden


def scaled_model(scale: float) -> onnx.ModelProto:
    """``y = x * scale`` on [-1, 4] FP32: the answer tells which version served it."""
    factor = numpy_helper.from_array(np.array(scale, dtype=np.float32), "scale")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "scale"], ["y"])],
        "scaled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [factor],
    )
    model = _model(graph)
    model.ir_version = _IR_VERSION
    return model


def write_scaled_version(root: Path, name: str, version: int, scale: float) -> Path:
    """Write ``root/name/version/model.onnx`` answering ``x * scale``; returns the folder."""
    folder = root / name / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(scaled_model(scale), str(folder / "model.onnx"))
    return folder
