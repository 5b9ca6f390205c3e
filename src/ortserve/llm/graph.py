"""A Llama-style decoder as an ONNX graph in the Hugging Face / Optimum layout, built with
``onnx.helper`` (no torch): ``input_ids``, ``attention_mask``, ``position_ids``,
``past_key_values.{i}.key|value`` in; ``logits``, ``present.{i}.key|value`` out.

The attention mask is applied per key position, so a batch whose rows have masked holes in
their caches (continuous batching) computes each row exactly as it would alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortserve.llm.weights import DecoderWeights

__all__ = ["build_decoder"]

_IR_VERSION = 9
_OPSET = 17


class _Graph:
    """Collects nodes and initializers; each call returns the name of its output."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, value: npt.NDArray[np.generic] | np.generic, hint: str = "c") -> str:
        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, kind: str, inputs: list[str], hint: str = "", **attrs: Any) -> str:
        out = self.name(hint or kind.lower())
        self.nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def op_to(self, kind: str, inputs: list[str], out: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out


def _ints(*values: int) -> npt.NDArray[np.int64]:
    return np.array(values, dtype=np.int64)


def _rms_norm(g: _Graph, x: str, weight: npt.NDArray[np.float32], eps: float) -> str:
    mean = g.op("ReduceMean", [g.op("Mul", [x, x])], axes=[-1], keepdims=1)
    inv = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [mean, g.const(np.float32(eps))])])])
    return g.op("Mul", [g.op("Mul", [x, inv]), g.const(weight, "norm")])


def _rotate(g: _Graph, x: str, cos: str, sin: str, half: int) -> str:
    """HF's ``x * cos + rotate_half(x) * sin`` on [B, heads, S, head_dim]."""
    first = g.op("Slice", [x, g.const(_ints(0)), g.const(_ints(half)), g.const(_ints(3))])
    second = g.op("Slice", [x, g.const(_ints(half)), g.const(_ints(2 * half)), g.const(_ints(3))])
    rotated = g.op("Concat", [g.op("Neg", [second]), first], axis=3)
    return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rotated, sin])])


def _heads(g: _Graph, x: str, heads: int, head_dim: int) -> str:
    """[B, S, heads*head_dim] -> [B, heads, S, head_dim]."""
    return g.op("Transpose", [g.op("Reshape", [x, g.const(_ints(0, 0, heads, head_dim))])], perm=[0, 2, 1, 3])


def _rope_tables(g: _Graph, weights: DecoderWeights) -> tuple[str, str]:
    """cos and sin [B, 1, S, head_dim] from ``position_ids``, shared by every layer."""
    shape = weights.shape
    inv_freq = 1.0 / (
        shape.rope_theta ** (np.arange(0, shape.head_dim, 2, dtype=np.float64) / shape.head_dim)
    )
    positions = g.op("Unsqueeze", [g.op("Cast", ["position_ids"], to=TensorProto.FLOAT), g.const(_ints(2))])
    freqs = g.op("Mul", [positions, g.const(inv_freq.astype(np.float32), "inv_freq")])
    emb = g.op("Unsqueeze", [g.op("Concat", [freqs, freqs], axis=2), g.const(_ints(1))])
    return g.op("Cos", [emb]), g.op("Sin", [emb])


def _mask(g: _Graph, groups: int) -> str:
    """Additive mask [B, 1, groups*S, T]: causal over positions in the cache, and 0/1 per key.

    Query i of S new tokens sits at cache index T - S + i and sees key j <= that index whose
    ``attention_mask`` is 1; rows are tiled ``groups`` times to match the grouped queries.
    """
    mask_shape = g.op("Shape", ["attention_mask"])
    total = g.op("Gather", [mask_shape, g.const(_ints(1))], axis=0)
    ids_shape = g.op("Shape", ["input_ids"])
    new = g.op("Gather", [ids_shape, g.const(_ints(1))], axis=0)
    one = g.const(np.int64(1))
    zero = g.const(np.int64(0))
    keys = g.op("Range", [zero, g.op("Squeeze", [total]), one])
    queries = g.op(
        "Add",
        [g.op("Range", [zero, g.op("Squeeze", [new]), one]), g.op("Squeeze", [g.op("Sub", [total, new])])],
    )
    causal = g.op(
        "LessOrEqual",
        [g.op("Unsqueeze", [keys, g.const(_ints(0))]), g.op("Unsqueeze", [queries, g.const(_ints(1))])],
    )
    present = g.op("Unsqueeze", [g.op("Cast", ["attention_mask"], to=TensorProto.BOOL), g.const(_ints(1, 2))])
    allowed = g.op("And", [g.op("Unsqueeze", [causal, g.const(_ints(0, 1))]), present])
    lowest = np.float32(np.finfo(np.float32).min)
    additive = g.op("Where", [allowed, g.const(np.float32(0.0)), g.const(lowest)])
    return additive if groups == 1 else g.op("Tile", [additive, g.const(_ints(1, 1, groups, 1))])


def _attention(
    g: _Graph, x: str, layer: int, weights: DecoderWeights, rope: tuple[str, str], mask: str
) -> str:
    shape = weights.shape
    lw = weights.layers[layer]
    hd, heads, kv_heads = shape.head_dim, shape.num_attention_heads, shape.num_key_value_heads
    cos, sin = rope
    q = _rotate(g, _heads(g, g.op("MatMul", [x, g.const(lw.wq, "wq")]), heads, hd), cos, sin, hd // 2)
    k = _rotate(g, _heads(g, g.op("MatMul", [x, g.const(lw.wk, "wk")]), kv_heads, hd), cos, sin, hd // 2)
    v = _heads(g, g.op("MatMul", [x, g.const(lw.wv, "wv")]), kv_heads, hd)
    keys = g.op_to("Concat", [f"past_key_values.{layer}.key", k], f"present.{layer}.key", axis=2)
    values = g.op_to("Concat", [f"past_key_values.{layer}.value", v], f"present.{layer}.value", axis=2)
    # Grouped queries: [B, H, S, hd] -> [B, Hkv, groups*S, hd], so one MatMul per kv head.
    grouped = g.op("Reshape", [q, g.const(_ints(0, kv_heads, -1, hd))])
    scores = g.op("MatMul", [grouped, g.op("Transpose", [keys], perm=[0, 1, 3, 2])])
    scaled = g.op("Add", [g.op("Mul", [scores, g.const(np.float32(1.0 / np.sqrt(hd)))]), mask])
    context = g.op("MatMul", [g.op("Softmax", [scaled], axis=-1), values])
    per_head = g.op("Reshape", [context, g.const(_ints(0, heads, -1, hd))])
    merged = g.op(
        "Reshape", [g.op("Transpose", [per_head], perm=[0, 2, 1, 3]), g.const(_ints(0, 0, heads * hd))]
    )
    return g.op("MatMul", [merged, g.const(lw.wo, "wo")])


def _mlp(g: _Graph, x: str, layer: int, weights: DecoderWeights) -> str:
    lw = weights.layers[layer]
    gate = g.op("MatMul", [x, g.const(lw.w_gate, "w_gate")])
    up = g.op("MatMul", [x, g.const(lw.w_up, "w_up")])
    silu = g.op("Mul", [gate, g.op("Sigmoid", [gate])])
    return g.op("MatMul", [g.op("Mul", [silu, up]), g.const(lw.w_down, "w_down")])


def build_decoder(weights: DecoderWeights, name: str = "decoder") -> onnx.ModelProto:
    """The decoder as an ONNX model (opset 17, weights as initializers).

    Raises:
        ValueError: inconsistent sizes.
    """
    shape = weights.shape
    shape.check()
    g = _Graph()
    groups = shape.num_attention_heads // shape.num_key_value_heads
    rope = _rope_tables(g, weights)
    mask = _mask(g, groups)
    hidden = g.op("Gather", [g.const(weights.embed, "embed"), "input_ids"], axis=0)
    for layer in range(shape.num_hidden_layers):
        lw = weights.layers[layer]
        attended = _attention(
            g, _rms_norm(g, hidden, lw.attn_norm, shape.rms_norm_eps), layer, weights, rope, mask
        )
        hidden = g.op("Add", [hidden, attended])
        hidden = g.op(
            "Add", [hidden, _mlp(g, _rms_norm(g, hidden, lw.mlp_norm, shape.rms_norm_eps), layer, weights)]
        )
    return finish_decoder(g, hidden, weights, name, present="total")


def finish_decoder(
    g: _Graph,
    hidden: str,
    weights: DecoderWeights,
    name: str,
    present: str,
    domains: tuple[str, ...] = (),
) -> onnx.ModelProto:
    """The decoder's head (final norm, logits) and its declared inputs and outputs: the
    Optimum names every layout shares. ``present`` names the present KV's length dimension
    (``total`` when present = past + new; ``present`` for a shared buffer); ``domains`` are
    the extra operator sets the graph uses (opset 1 each)."""
    shape = weights.shape
    normed = _rms_norm(g, hidden, weights.final_norm, shape.rms_norm_eps)
    g.op_to("MatMul", [normed, g.const(weights.lm_head, "lm_head")], "logits")
    kv: list[str | int | None] = ["batch", shape.num_key_value_heads, "past", shape.head_dim]
    kv_out: list[str | int | None] = ["batch", shape.num_key_value_heads, present, shape.head_dim]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence"]),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", shape.vocab_size])
    ]
    for layer in range(shape.num_hidden_layers):
        for part in ("key", "value"):
            inputs.append(
                helper.make_tensor_value_info(f"past_key_values.{layer}.{part}", TensorProto.FLOAT, kv)
            )
            outputs.append(
                helper.make_tensor_value_info(f"present.{layer}.{part}", TensorProto.FLOAT, kv_out)
            )
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.initializers)
    opsets = [helper.make_opsetid("", _OPSET), *(helper.make_opsetid(domain, 1) for domain in domains)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="ortserve")
    model.ir_version = _IR_VERSION
    return model
