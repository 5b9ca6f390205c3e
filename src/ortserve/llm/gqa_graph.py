"""The same Llama-style decoder as :mod:`ortserve.llm.graph`, with attention done by ONNX
Runtime's ``com.microsoft.GroupQueryAttention`` in the layout onnxruntime-genai's model builder
writes: ``input_ids``, ``attention_mask``, ``position_ids``, ``past_key_values.{i}.key|value``
in; ``logits``, ``present.{i}.key|value`` out, with ``seqlens_k`` and ``total_sequence_length``
computed in the graph from the attention mask (``ReduceSum - 1`` and its width).

Why: the Optimum graph's ``present = Concat(past, new)`` copies every row's padded cache at each
step and its left-padded rows pay for the longest one. GroupQueryAttention reads each row only
to its own length (``seqlens_k``, right-padded rows) and, when ``present`` is bound to the very
buffer given as ``past`` (``past_present_share_buffer``), writes the new keys and values in
place: the engine's KV pool (:mod:`ortserve.llm.kv_pool`) is that buffer.

Rotary embeddings are applied before the attention node from ``position_ids`` (as in the
Optimum graph), so the two layouts compute the same numbers.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from ortserve.llm.graph import _Graph, _ints, _mlp, _rms_norm, finish_decoder
from ortserve.llm.weights import DecoderWeights

__all__ = ["build_gqa_decoder", "lengths", "rope_tables", "rotated"]


def rope_tables(
    g: _Graph, weights: DecoderWeights, positions: str = "position_ids", axis: int = 2
) -> tuple[str, str]:
    """cos and sin from ``positions`` with a head axis of 1 inserted at ``axis`` (the positions'
    rank): [B, S, 1, head_dim] from [B, S] (BSNH), [N, 1, head_dim] from flattened [N]."""
    shape = weights.shape
    inv_freq = 1.0 / (
        shape.rope_theta ** (np.arange(0, shape.head_dim, 2, dtype=np.float64) / shape.head_dim)
    )
    column = g.op("Unsqueeze", [g.op("Cast", [positions], to=TensorProto.FLOAT), g.const(_ints(axis))])
    freqs = g.op("Mul", [column, g.const(inv_freq.astype(np.float32), "inv_freq")])
    emb = g.op("Unsqueeze", [g.op("Concat", [freqs, freqs], axis=axis), g.const(_ints(axis))])
    return g.op("Cos", [emb]), g.op("Sin", [emb])


def rotated(g: _Graph, x: str, heads: int, head_dim: int, rope: tuple[str, str], lead: int = 2) -> str:
    """``x`` [*lead, heads*hd] rotated per head (HF's rotate_half), back to its shape (``lead``:
    its leading axes, 2 for [B, S], 1 for flattened tokens)."""
    cos, sin = rope
    half, axis = head_dim // 2, lead + 1
    split = g.op("Reshape", [x, g.const(_ints(*[0] * lead, heads, head_dim))])
    first = g.op("Slice", [split, g.const(_ints(0)), g.const(_ints(half)), g.const(_ints(axis))])
    second = g.op("Slice", [split, g.const(_ints(half)), g.const(_ints(2 * half)), g.const(_ints(axis))])
    turned = g.op("Concat", [g.op("Neg", [second]), first], axis=axis)
    out = g.op("Add", [g.op("Mul", [split, cos]), g.op("Mul", [turned, sin])])
    return g.op("Reshape", [out, g.const(_ints(*[0] * lead, heads * head_dim))])


def lengths(g: _Graph, mask: str = "attention_mask") -> tuple[str, str]:
    """``seqlens_k`` [B] (each row's total length - 1) and ``total_sequence_length`` (scalar)
    from an attention mask."""
    ones = g.op("ReduceSum", [mask, g.const(_ints(1))], keepdims=0)
    seqlens = g.op("Cast", [g.op("Sub", [ones, g.const(np.int64(1))])], to=TensorProto.INT32)
    width = g.op("Gather", [g.op("Shape", [mask]), g.const(np.int64(1))], axis=0)
    return seqlens, g.op("Cast", [width], to=TensorProto.INT32)


def build_gqa_decoder(weights: DecoderWeights, name: str = "decoder") -> onnx.ModelProto:
    """The decoder with GroupQueryAttention (opset 17 plus com.microsoft 1).

    Raises:
        ValueError: inconsistent sizes.
    """
    shape = weights.shape
    shape.check()
    g = _Graph()
    hd, heads, kv_heads = shape.head_dim, shape.num_attention_heads, shape.num_key_value_heads
    rope = rope_tables(g, weights)
    seqlens, total = lengths(g)
    hidden = g.op("Gather", [g.const(weights.embed, "embed"), "input_ids"], axis=0)
    for layer in range(shape.num_hidden_layers):
        lw = weights.layers[layer]
        x = _rms_norm(g, hidden, lw.attn_norm, shape.rms_norm_eps)
        q = rotated(g, g.op("MatMul", [x, g.const(lw.wq, "wq")]), heads, hd, rope)
        k = rotated(g, g.op("MatMul", [x, g.const(lw.wk, "wk")]), kv_heads, hd, rope)
        v = g.op("MatMul", [x, g.const(lw.wv, "wv")])
        context = g.name("attention")
        g.nodes.append(
            helper.make_node(
                "GroupQueryAttention",
                [q, k, v, f"past_key_values.{layer}.key", f"past_key_values.{layer}.value", seqlens, total],
                [context, f"present.{layer}.key", f"present.{layer}.value"],
                domain="com.microsoft",
                num_heads=heads,
                kv_num_heads=kv_heads,
            )
        )
        hidden = g.op("Add", [hidden, g.op("MatMul", [context, g.const(lw.wo, "wo")])])
        hidden = g.op(
            "Add", [hidden, _mlp(g, _rms_norm(g, hidden, lw.mlp_norm, shape.rms_norm_eps), layer, weights)]
        )
    return finish_decoder(g, hidden, weights, name, present="present", domains=("com.microsoft",))
