"""Training the dispatch scorer on generated scenarios; export with its analytic heads to ONNX.

The ONNX model maps pair features to four columns: the combined score, the learned on-time
probability, the distance cost and the load balance. Scoring all pairs is one batched call.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortserve.apps.dispatch.features import FEATURE_NAMES, NOMINAL_KMH
from ortserve.apps.mlp import MlpWeights, finish_model, mlp_graph_parts, train_mlp

__all__ = ["INPUT", "OBJECTIVE_WEIGHTS", "OUTPUT", "SCORE_COLUMNS", "generate_scenarios", "train_dispatch"]

INPUT = "pairs"
OUTPUT = "scores"
SCORE_COLUMNS = ("score", "on_time", "distance_cost", "load_balance")
OBJECTIVE_WEIGHTS = (0.45, 0.35, 0.20)
"""Weights of on-time probability, nearness (1 - distance cost) and load balance in the score.

They are the seed's routing weights mapped onto delivery: P99 latency 0.45 -> on-time
probability (the tail a customer feels), throughput 0.35 -> nearness (shorter trips, more
deliveries per courier-hour), cost 0.20 -> load balance (an overloaded courier costs overtime
and late orders later)."""
DISTANCE_COST_KM = 10.0
"""Distance at which the distance cost saturates at 1."""


def _simulate_on_time(features: npt.NDArray[np.float32], rng: np.random.Generator) -> npt.NDArray[np.float32]:
    """Whether a delivery made it: speed falls with load, pickup waits grow with the queue."""
    distance = features[:, 0] * 10.0
    minutes = features[:, 1] * 60.0 + distance / NOMINAL_KMH * 60.0
    load = features[:, 2]
    speed = 18.0 * (1 - 0.35 * load) * rng.lognormal(0.0, 0.2, len(features))
    pickup = 4.0 + 12.0 * load - 2.0 * features[:, 4] + rng.exponential(1.5, len(features))
    return (distance / speed * 60.0 + pickup <= minutes).astype(np.float32)


def generate_scenarios(size: int, seed: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """Pair features of random but realistic order/courier pairs and their on-time outcomes."""
    rng = np.random.default_rng(seed)
    distance = np.clip(rng.lognormal(np.log(1.5), 0.9, size), 0.02, 30.0)
    minutes = rng.uniform(0.0, 120.0, size)
    capacity = rng.uniform(5.0, 20.0, size)
    load_ratio = rng.uniform(0.0, 1.0, size)
    weight = rng.choice([1.0, 1.0, 1.0, 2.0, 3.0, 5.0], size)
    near = (distance < 0.3) & (rng.random(size) < 0.8)
    features = np.stack(
        [
            distance / 10.0,
            (minutes - distance / NOMINAL_KMH * 60.0) / 60.0,
            load_ratio,
            load_ratio + weight / capacity,
            near.astype(np.float64),
            weight / 10.0,
        ],
        axis=1,
    ).astype(np.float32)
    return features, _simulate_on_time(features, rng)[:, None]


def _constant(name: str, value: float | list[int]) -> onnx.TensorProto:
    array = np.asarray(value, dtype=np.int64 if isinstance(value, list) else np.float32)
    return numpy_helper.from_array(array, name)


def _column(index: int, out: str) -> onnx.NodeProto:
    return helper.make_node("Slice", [INPUT, f"start{index}", f"end{index}", "axis1"], [out])


def export_scorer(weights: MlpWeights) -> onnx.ModelProto:
    """MLP on-time head plus the distance-cost and load-balance heads, combined into a score."""
    nodes, initializers = mlp_graph_parts(weights, INPUT, "on_time")
    w_time, w_near, w_balance = OBJECTIVE_WEIGHTS
    initializers += [
        _constant("axis1", [1]),
        _constant("one", 1.0),
        _constant("km_scale", 10.0 / DISTANCE_COST_KM),
    ]
    initializers += [
        _constant(n, v) for n, v in (("w_time", w_time), ("w_near", w_near), ("w_balance", w_balance))
    ]
    for index in (0, 3):
        initializers += [_constant(f"start{index}", [index]), _constant(f"end{index}", [index + 1])]
    nodes += [
        _column(0, "distance_col"),
        helper.make_node("Mul", ["distance_col", "km_scale"], ["distance_scaled"]),
        helper.make_node("Min", ["distance_scaled", "one"], ["distance_cost"]),
        _column(3, "load_after"),
        helper.make_node("Min", ["load_after", "one"], ["load_capped"]),
        helper.make_node("Sub", ["one", "load_capped"], ["load_balance"]),
        helper.make_node("Sub", ["one", "distance_cost"], ["nearness"]),
        helper.make_node("Mul", ["on_time", "w_time"], ["part_time"]),
        helper.make_node("Mul", ["nearness", "w_near"], ["part_near"]),
        helper.make_node("Mul", ["load_balance", "w_balance"], ["part_balance"]),
        helper.make_node("Sum", ["part_time", "part_near", "part_balance"], ["score"]),
        helper.make_node("Concat", ["score", "on_time", "distance_cost", "load_balance"], [OUTPUT], axis=1),
    ]
    return finish_model(
        nodes,
        initializers,
        "dispatch_scorer",
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["batch", len(FEATURE_NAMES)])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", len(SCORE_COLUMNS)])],
    )


def train_dispatch(version_dir: Path, seed: int = 11, samples: int = 20000, epochs: int = 15) -> MlpWeights:
    """Generate scenarios, fit the on-time head, write ``model.onnx``."""
    version_dir.mkdir(parents=True, exist_ok=True)
    x, y = generate_scenarios(samples, seed)
    weights = train_mlp(x, y, hidden=16, epochs=epochs, seed=seed)
    onnx.save(export_scorer(weights), str(version_dir / "model.onnx"))
    return weights
