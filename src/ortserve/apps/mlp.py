"""A small sigmoid-output MLP: trained with NumPy (Adam, cross-entropy) and exported to ONNX."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["MlpWeights", "export_mlp", "finish_model", "mlp_graph_parts", "predict", "train_mlp"]

Matrix = npt.NDArray[np.float32]
_IR_VERSION = 9
_OPSET = 17


@dataclass(frozen=True, slots=True)
class MlpWeights:
    """One ReLU hidden layer, sigmoid outputs."""

    w1: Matrix
    b1: Matrix
    w2: Matrix
    b2: Matrix


def _sigmoid(z: Matrix) -> Matrix:
    return (1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))).astype(np.float32)


def predict(weights: MlpWeights, x: Matrix) -> Matrix:
    """Probabilities for each output column (the same function the ONNX graph computes)."""
    hidden = np.maximum(x @ weights.w1 + weights.b1, 0)
    return _sigmoid(hidden @ weights.w2 + weights.b2)


def _init(features: int, hidden: int, outputs: int, rng: np.random.Generator, prior: Matrix) -> list[Matrix]:
    w1 = (rng.standard_normal((features, hidden)) * np.sqrt(2.0 / features)).astype(np.float32)
    w2 = (rng.standard_normal((hidden, outputs)) * np.sqrt(1.0 / hidden)).astype(np.float32)
    # Output biases start at the base rates' logits, so training begins calibrated.
    p = np.clip(prior, 1e-4, 1 - 1e-4)
    b2 = np.log(p / (1 - p)).astype(np.float32)
    return [w1, np.zeros(hidden, np.float32), w2, b2]


def _gradients(params: list[Matrix], x: Matrix, y: Matrix, l2: float) -> list[Matrix]:
    w1, b1, w2, b2 = params
    pre = x @ w1 + b1
    hidden = np.maximum(pre, 0)
    error = (_sigmoid(hidden @ w2 + b2) - y) / len(x)
    back = (error @ w2.T) * (pre > 0)
    return [x.T @ back + l2 * w1, back.sum(0), hidden.T @ error + l2 * w2, error.sum(0)]


def train_mlp(
    x: Matrix, y: Matrix, hidden: int, epochs: int, seed: int, lr: float = 0.01, l2: float = 1e-4
) -> MlpWeights:
    """Minimise sigmoid cross-entropy with Adam on mini-batches of 256; deterministic per seed."""
    rng = np.random.default_rng(seed)
    params = _init(x.shape[1], hidden, y.shape[1], rng, y.mean(0))
    moments = [np.zeros_like(p) for p in params]
    squares = [np.zeros_like(p) for p in params]
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), 256):
            rows = order[start : start + 256]
            step += 1
            for i, grad in enumerate(_gradients(params, x[rows], y[rows], l2)):
                moments[i] = 0.9 * moments[i] + 0.1 * grad
                squares[i] = 0.999 * squares[i] + 0.001 * grad * grad
                m_hat = moments[i] / (1 - 0.9**step)
                v_hat = squares[i] / (1 - 0.999**step)
                params[i] = (params[i] - lr * m_hat / (np.sqrt(v_hat) + 1e-8)).astype(np.float32)
    return MlpWeights(*params)


def mlp_graph_parts(
    weights: MlpWeights, input_name: str, output_name: str, prefix: str = ""
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes and initializers of Gemm -> Relu -> Gemm -> Sigmoid, to embed in a larger graph."""
    names = {key: prefix + key for key in ("w1", "b1", "w2", "b2", "g1", "h1", "logits")}
    initializers = [
        numpy_helper.from_array(np.asarray(getattr(weights, key), np.float32), names[key])
        for key in ("w1", "b1", "w2", "b2")
    ]
    nodes = [
        helper.make_node("Gemm", [input_name, names["w1"], names["b1"]], [names["g1"]]),
        helper.make_node("Relu", [names["g1"]], [names["h1"]]),
        helper.make_node("Gemm", [names["h1"], names["w2"], names["b2"]], [names["logits"]]),
        helper.make_node("Sigmoid", [names["logits"]], [output_name]),
    ]
    return nodes, initializers


def finish_model(
    nodes: list[onnx.NodeProto],
    initializers: list[onnx.TensorProto],
    name: str,
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
) -> onnx.ModelProto:
    """A checked model pinned to IR 9 / opset 17 (loadable by ONNX Runtime 1.16 and later)."""
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="ortserve"
    )
    model.ir_version = _IR_VERSION
    onnx.checker.check_model(model)
    return model


def export_mlp(weights: MlpWeights, name: str, input_name: str, output_name: str) -> onnx.ModelProto:
    """The MLP alone, with a dynamic batch dimension."""
    nodes, initializers = mlp_graph_parts(weights, input_name, output_name)
    return finish_model(
        nodes,
        initializers,
        name,
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", weights.w1.shape[0]])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", weights.w2.shape[1]])],
    )
