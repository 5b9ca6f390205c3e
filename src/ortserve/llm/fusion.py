"""The step graph for a served decoder: recognise a GroupQueryAttention decoder that ortserve
wrote, take its weights back out of the graph, build :mod:`ortserve.llm.fused_graph` on them,
and check the two graphs agree before the engine may use it.

Only ortserve's own builds are recognised (``producer_name`` ortserve, the initializer names its
builder gives, in its order): a graph from another builder, a quantized one or one whose
weights live in external data keeps the plain steps. The check at load runs a small decode
with a chunk through both graphs: a graph that looked like ours but computes something else is
refused there, never served.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from ortserve.llm.fused_graph import build_fused_decoder
from ortserve.llm.kv_backend import DecoderSession, StepFeeds
from ortserve.llm.weights import DecoderShape, DecoderWeights, LayerWeights

__all__ = ["agrees", "fused_graph_for", "recover_weights"]

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^(embed|norm|wq|wk|wv|wo|w_gate|w_up|w_down|lm_head)_(\d+)$")
_LAYER = ("norm", "wq", "wk", "wv", "wo", "norm", "w_gate", "w_up", "w_down")
_MAX_GRAPH_BYTES = 1 << 30
"""A larger decoder's step graph would pass protobuf's 2 GB (and doubles its weights' memory)."""


def recover_weights(model: onnx.ModelProto, config: Mapping[str, object]) -> DecoderWeights | None:
    """The weights of a GroupQueryAttention decoder that ortserve's builder wrote
    (:func:`~ortserve.llm.gqa_graph.build_gqa_decoder`), or None for any other graph.

    Args:
        config: the version's config.json (``rope_theta``, ``rms_norm_eps``,
            ``max_position_embeddings``: not recoverable from the graph as such).
    """
    if model.producer_name != "ortserve":
        return None
    attention = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    if not attention:
        return None
    named = []
    for tensor in model.graph.initializer:
        match = _NAME.match(tensor.name)
        if match is not None:
            if (
                tensor.data_location == onnx.TensorProto.EXTERNAL
                or tensor.data_type != onnx.TensorProto.FLOAT
            ):
                return None
            named.append((int(match.group(2)), match.group(1), tensor))
    named.sort(key=lambda item: item[0])
    kinds = [kind for _, kind, _ in named]
    layers = len(attention)
    if kinds != ["embed", *(_LAYER * layers), "norm", "lm_head"]:
        return None
    arrays = [numpy_helper.to_array(tensor).astype(np.float32, copy=False) for _, _, tensor in named]
    attrs = {a.name: a.i for a in attention[0].attribute}
    embed, lm_head = arrays[0], arrays[-1]
    try:
        shape = DecoderShape(
            vocab_size=int(embed.shape[0]),
            hidden_size=int(embed.shape[1]),
            num_hidden_layers=layers,
            num_attention_heads=int(attrs["num_heads"]),
            num_key_value_heads=int(attrs["kv_num_heads"]),
            intermediate_size=int(arrays[7].shape[1]),
            rope_theta=float(config.get("rope_theta", 10000.0)),  # type: ignore[arg-type]
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),  # type: ignore[arg-type]
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),  # type: ignore[call-overload]
        )
        shape.check()
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    per_layer = [LayerWeights(*arrays[1 + 9 * i : 10 + 9 * i]) for i in range(layers)]
    return DecoderWeights(shape, embed, tuple(per_layer), arrays[-2], lm_head)


def fused_graph_for(graph: bytes, config: Mapping[str, object]) -> bytes | None:
    """The step graph's bytes for a served decoder's graph, or None when it is not one of
    ortserve's own or too large."""
    if len(graph) > _MAX_GRAPH_BYTES:
        return None
    try:
        model = onnx.load_from_string(graph)
    except Exception:  # not ours to judge: the plain session already loaded it
        return None
    weights = recover_weights(model, config)
    if weights is None:
        return None
    return bytes(build_fused_decoder(weights).SerializeToString())


def agrees(decoder: DecoderSession, fused: object, tolerance: float = 1e-3) -> bool:
    """Whether ``fused`` computes what the decoder's plain graph does: three rows decode while
    a fourth prefills a 16-token chunk after 8 tokens, once as one run of ``fused`` and once as
    the plain graph's two runs, on the same random keys and values. Also the step graph's
    first run (its allocations) before any request waits on it."""
    layout = decoder.layout
    rng = np.random.default_rng(0)
    capacity, rows, width = 64, 3, 16
    pool = [
        rng.standard_normal((rows + 1, layout.kv_heads, capacity, layout.head_dim)).astype(np.float32)
        for _ in decoder.past_names
    ]
    copy = [part.copy() for part in pool]
    vocab = _vocab(decoder)
    ids = rng.integers(0, vocab, (rows, 1), dtype=np.int64)
    positions = np.array([[20], [9], [31]], dtype=np.int64)
    lengths = [21, 10, 32]
    chunk_ids = rng.integers(0, vocab, (1, width), dtype=np.int64)
    chunk_positions = np.arange(8, 8 + width, dtype=np.int64)[None]
    decode = StepFeeds(ids, positions, lengths, [part[:rows] for part in pool])
    chunk = StepFeeds(chunk_ids, chunk_positions, [8 + width], [part[rows:] for part in pool])
    probe = DecoderSession(decoder.session, layout)  # the served one's run time is not touched
    probe.fused = fused
    together = probe.run_fused(decode, chunk)
    apart = np.concatenate(
        [
            probe.run_in_place(ids, positions, lengths, [part[:rows] for part in copy]),
            probe.run_in_place(chunk_ids, chunk_positions, [8 + width], [part[rows:] for part in copy]),
        ]
    )
    worst = max(
        float(np.abs(together - apart).max()), *(float(np.abs(a - b).max()) for a, b in zip(pool, copy))
    )
    if worst > tolerance:
        logger.warning("the step graph differs from the decoder's by %.3g: steps stay separate", worst)
        return False
    return True


def _vocab(decoder: DecoderSession) -> int:
    vocab = decoder.session.get_outputs()[0].shape[-1]  # type: ignore[attr-defined]
    return vocab if isinstance(vocab, int) else 2


def step_session(
    decoder: DecoderSession, graph: bytes, config: Mapping[str, object], build: Callable[[bytes], object]
) -> object | None:
    """The checked step-graph session for a decoder (``build`` makes a session from graph
    bytes with the version's options), or None when there is none to build or it disagrees."""
    fused_bytes = fused_graph_for(graph, config)
    if fused_bytes is None:
        return None
    fused = build(fused_bytes)
    return fused if agrees(decoder, fused) else None
