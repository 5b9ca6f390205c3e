"""One engine step as one graph: the decode of every running row and one prompt's prefill
chunk, with the weights read once.

Why: on one core a prefill chunk run on its own pays about 6 ms whatever its length (reading
the 30.6M decoder's weights and some 300 small kernels), beside 0.37 ms a prompt token. Under
overload most steps carry a chunk, and the chunks the room beside a wide decode leaves are
small (32-63 tokens), so that fixed part was 0.2-0.3 ms of every output token's 2-2.8 ms.

The graph flattens the step's tokens (``R`` decode rows of one token, then ``C`` chunk tokens)
into ``[R + C, hidden]`` for everything that is per token (embedding, norms, rotary
embeddings, projections, MLP), and splits them only for attention: one GroupQueryAttention
over the decode rows' cache rows, one over the chunk's row, each writing its new keys and
values in place (``past_present_share_buffer``) as :mod:`ortserve.llm.gqa_graph` does.

Inputs: the plain graph's ``input_ids`` [R, 1], ``position_ids`` [R, 1], ``attention_mask``
[R, T] and ``past_key_values.{i}.key|value`` for the decode rows; ``chunk_ids`` [1, C],
``chunk_position_ids`` [1, C], ``chunk_attention_mask`` [1, Tc] and ``chunk_past.{i}.key|value``
for the chunk. Outputs: ``logits`` [R + 1, vocab] (each decode row's, then the chunk's last
token's), ``present.{i}.*`` and ``chunk_present.{i}.*``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from ortserve.llm.gqa_graph import lengths, rope_tables, rotated
from ortserve.llm.graph import _IR_VERSION, _OPSET, _Graph, _ints, _mlp, _rms_norm
from ortserve.llm.weights import DecoderWeights

__all__ = ["CHUNK_PREFIX", "build_fused_decoder"]

CHUNK_PREFIX = "chunk_"
"""The chunk's inputs and outputs are the decode's names with this prefix (``chunk_ids`` for
``input_ids``, ``chunk_past.{i}.key`` for ``past_key_values.{i}.key``)."""


def _flat(g: _Graph, decode: str, chunk: str) -> str:
    """[R, 1] and [1, C] int64 inputs as one [R + C] vector."""
    flat = g.const(_ints(-1))
    return g.op("Concat", [g.op("Reshape", [decode, flat]), g.op("Reshape", [chunk, flat])], axis=0)


def _attend(
    g: _Graph, qkv: list[str], layer: int, prefix: str, seqlens: tuple[str, str], weights: DecoderWeights
) -> str:
    """GroupQueryAttention over one part's cache rows; returns its context [tokens, hidden]."""
    shape = weights.shape
    context = g.name(f"{prefix}attention")
    past = "chunk_past" if prefix else "past_key_values"
    present = "chunk_present" if prefix else "present"
    g.nodes.append(
        helper.make_node(
            "GroupQueryAttention",
            [*qkv, f"{past}.{layer}.key", f"{past}.{layer}.value", *seqlens],
            [context, f"{present}.{layer}.key", f"{present}.{layer}.value"],
            domain="com.microsoft",
            num_heads=shape.num_attention_heads,
            kv_num_heads=shape.num_key_value_heads,
        )
    )
    return g.op("Reshape", [context, g.const(_ints(-1, shape.hidden_size))])


def build_fused_decoder(weights: DecoderWeights, name: str = "decoder_fused") -> onnx.ModelProto:
    """The decode-plus-chunk step graph (opset 17 plus com.microsoft 1), on the same weights as
    :func:`~ortserve.llm.gqa_graph.build_gqa_decoder` and computing the same numbers.

    Raises:
        ValueError: inconsistent sizes.
    """
    shape = weights.shape
    shape.check()
    g = _Graph()
    hd, heads, kv_heads = shape.head_dim, shape.num_attention_heads, shape.num_key_value_heads
    rope = rope_tables(g, weights, _flat(g, "position_ids", "chunk_position_ids"), axis=1)
    rows = g.op("Gather", [g.op("Shape", ["input_ids"]), g.const(_ints(0))], axis=0)
    chunk_tokens = g.op("Gather", [g.op("Shape", ["chunk_ids"]), g.const(_ints(1))], axis=0)
    sizes = g.op("Concat", [rows, chunk_tokens], axis=0)
    decode_lengths, chunk_lengths = lengths(g, "attention_mask"), lengths(g, "chunk_attention_mask")
    # Each part's q, k, v as the [batch, sequence, width] its attention takes.
    as_rows = {
        (prefix, width): g.const(_ints(-1, 1, width) if not prefix else _ints(1, -1, width))
        for prefix in ("", CHUNK_PREFIX)
        for width in (heads * hd, kv_heads * hd)
    }
    hidden = g.op("Gather", [g.const(weights.embed, "embed"), _flat(g, "input_ids", "chunk_ids")], axis=0)
    for layer in range(shape.num_hidden_layers):
        lw = weights.layers[layer]
        x = _rms_norm(g, hidden, lw.attn_norm, shape.rms_norm_eps)
        q = rotated(g, g.op("MatMul", [x, g.const(lw.wq, "wq")]), heads, hd, rope, lead=1)
        k = rotated(g, g.op("MatMul", [x, g.const(lw.wk, "wk")]), kv_heads, hd, rope, lead=1)
        v = g.op("MatMul", [x, g.const(lw.wv, "wv")])
        parts: dict[str, list[str]] = {"": [], CHUNK_PREFIX: []}
        for tensor, width in ((q, heads * hd), (k, kv_heads * hd), (v, kv_heads * hd)):
            decode_part, chunk_part = (g.name("split"), g.name("split"))
            g.nodes.append(helper.make_node("Split", [tensor, sizes], [decode_part, chunk_part], axis=0))
            for prefix, part in (("", decode_part), (CHUNK_PREFIX, chunk_part)):
                parts[prefix].append(g.op("Reshape", [part, as_rows[prefix, width]]))
        contexts = [
            _attend(g, parts[""], layer, "", decode_lengths, weights),
            _attend(g, parts[CHUNK_PREFIX], layer, CHUNK_PREFIX, chunk_lengths, weights),
        ]
        context = g.op("Concat", contexts, axis=0)
        hidden = g.op("Add", [hidden, g.op("MatMul", [context, g.const(lw.wo, "wo")])])
        hidden = g.op(
            "Add", [hidden, _mlp(g, _rms_norm(g, hidden, lw.mlp_norm, shape.rms_norm_eps), layer, weights)]
        )
    # Only the rows that are sampled: each decode row, and the chunk's last token.
    decode_rows = g.op("Slice", [hidden, g.const(_ints(0)), rows, g.const(_ints(0))])
    last = g.op(
        "Slice", [hidden, g.const(_ints(-1)), g.const(_ints(np.iinfo(np.int64).max)), g.const(_ints(0))]
    )
    kept = g.op("Concat", [decode_rows, last], axis=0)
    normed = _rms_norm(g, kept, weights.final_norm, shape.rms_norm_eps)
    g.op_to("MatMul", [normed, g.const(weights.lm_head, "lm_head")], "logits")
    return _model(g, weights, name)


def _model(g: _Graph, weights: DecoderWeights, name: str) -> onnx.ModelProto:
    shape = weights.shape
    kv: list[str | int | None] = [shape.num_key_value_heads, "past", shape.head_dim]
    kv_out: list[str | int | None] = [shape.num_key_value_heads, "present", shape.head_dim]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", 1]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", 1]),
        helper.make_tensor_value_info("chunk_ids", TensorProto.INT64, [1, "chunk"]),
        helper.make_tensor_value_info("chunk_attention_mask", TensorProto.INT64, [1, "chunk_total"]),
        helper.make_tensor_value_info("chunk_position_ids", TensorProto.INT64, [1, "chunk"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["rows", shape.vocab_size])]
    for past, present, batch in (("past_key_values", "present", "batch"), ("chunk_past", "chunk_present", 1)):
        for layer in range(shape.num_hidden_layers):
            for part in ("key", "value"):
                inputs.append(
                    helper.make_tensor_value_info(f"{past}.{layer}.{part}", TensorProto.FLOAT, [batch, *kv])
                )
                outputs.append(
                    helper.make_tensor_value_info(
                        f"{present}.{layer}.{part}", TensorProto.FLOAT, [batch, *kv_out]
                    )
                )
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.initializers)
    opsets = [helper.make_opsetid("", _OPSET), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="ortserve")
    model.ir_version = _IR_VERSION
    return model
