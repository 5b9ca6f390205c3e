"""The built-in demo repository: two seeded MLPs written with onnx.helper and NumPy."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortserve.apps.seeds import write_seed_apps

__all__ = ["build_mlp", "write_demo_repository"]

# ONNX Runtime 1.16+ reads IR 9 / opset 17; pinning keeps the files loadable by older builds.
_IR_VERSION = 9
_OPSET = 17

_CONFIG = """\
# Dynamic batching: runs at once when idle, gathers requests while busy.
batching:
  max_batch_size: 32
  max_queue_delay_ms: 1.0
  max_queue_size: 1024
"""


def build_mlp(layer_sizes: list[int], seed: int, name: str) -> onnx.ModelProto:
    """A ReLU MLP with input ``input`` [-1, layer_sizes[0]] and output ``output``.

    Weights are He-initialised from ``seed`` so outputs are deterministic and well scaled.
    """
    rng = np.random.default_rng(seed)
    nodes = []
    initializers = []
    current = "input"
    last = len(layer_sizes) - 2
    for index, (fan_in, fan_out) in enumerate(itertools.pairwise(layer_sizes)):
        weight = (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        bias = (rng.standard_normal(fan_out) * 0.01).astype(np.float32)
        initializers += [
            numpy_helper.from_array(weight, f"w{index}"),
            numpy_helper.from_array(bias, f"b{index}"),
        ]
        out = "output" if index == last else f"h{index}"
        gemm_out = out if index == last else f"g{index}"
        nodes.append(helper.make_node("Gemm", [current, f"w{index}", f"b{index}"], [gemm_out]))
        if index != last:
            nodes.append(helper.make_node("Relu", [gemm_out], [out]))
        current = out
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", layer_sizes[0]])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", layer_sizes[-1]])],
        initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="ortserve"
    )
    model.ir_version = _IR_VERSION
    onnx.checker.check_model(model)
    return model


DEMO_MODELS = {
    "small_mlp": ([64, 256, 16], 1),
    "heavy_mlp": ([512, 2048, 2048, 2048, 2048, 128], 2),
}


def write_demo_repository(root: Path) -> list[str]:
    """Write the demo models (and their configs) under ``root``; returns the model names."""
    for name, (sizes, seed) in DEMO_MODELS.items():
        version_dir = root / name / "1"
        version_dir.mkdir(parents=True, exist_ok=True)
        onnx.save(build_mlp(sizes, seed, name), str(version_dir / "model.onnx"))
        (root / name / "config.yaml").write_text(_CONFIG, encoding="utf-8")
    return list(DEMO_MODELS) + write_seed_apps(root)
