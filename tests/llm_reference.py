"""A NumPy forward pass of the Llama-style decoder (the tests' reference for the ONNX graph),
and small helpers to build LLM version folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from ortserve.llm.demo import train_tokenizer, write_llm_version
from ortserve.llm.weights import DecoderShape, DecoderWeights, random_weights

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]


def _rms(x: npt.NDArray[np.float64], weight: F32, eps: float) -> npt.NDArray[np.float64]:
    normed: npt.NDArray[np.float64] = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight
    return normed


def _rope(x: npt.NDArray[np.float64], positions: I64, theta: float) -> npt.NDArray[np.float64]:
    """x [B, heads, S, hd] rotated by position (HF's rotate_half convention)."""
    hd = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    angles = positions[:, None, :, None] * inv  # [B, 1, S, hd/2]
    cos, sin = np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))
    rotated = np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], -1)
    out: npt.NDArray[np.float64] = x * cos + rotated * sin
    return out


def reference_forward(
    w: DecoderWeights, ids: I64, mask: I64, positions: I64, past: list[F32]
) -> tuple[npt.NDArray[np.float64], list[npt.NDArray[np.float64]]]:
    """Logits [B, S, V] and present keys/values, in float64."""
    s = w.shape
    batch, new = ids.shape
    hd, groups = s.head_dim, s.num_attention_heads // s.num_key_value_heads
    hidden = w.embed[ids].astype(np.float64)
    total = mask.shape[1]
    causal = np.arange(total)[None, :] <= (np.arange(new) + total - new)[:, None]
    allowed = causal[None, None] & (mask[:, None, None, :] == 1)
    present: list[npt.NDArray[np.float64]] = []
    for index, layer in enumerate(w.layers):
        x = _rms(hidden, layer.attn_norm, s.rms_norm_eps)

        def heads(m: F32, count: int, x: npt.NDArray[np.float64] = x) -> npt.NDArray[np.float64]:
            return (x @ m).reshape(batch, new, count, hd).transpose(0, 2, 1, 3)

        q = _rope(heads(layer.wq, s.num_attention_heads), positions, s.rope_theta)
        k = _rope(heads(layer.wk, s.num_key_value_heads), positions, s.rope_theta)
        v = heads(layer.wv, s.num_key_value_heads)
        keys = np.concatenate([past[2 * index].astype(np.float64), k], axis=2)
        values = np.concatenate([past[2 * index + 1].astype(np.float64), v], axis=2)
        present += [keys, values]
        keys_rep, values_rep = np.repeat(keys, groups, axis=1), np.repeat(values, groups, axis=1)
        scores = q @ keys_rep.transpose(0, 1, 3, 2) / np.sqrt(hd)
        scores = np.where(allowed, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ values_rep).transpose(0, 2, 1, 3).reshape(batch, new, -1)
        hidden = hidden + context @ layer.wo
        x = _rms(hidden, layer.mlp_norm, s.rms_norm_eps)
        gate = x @ layer.w_gate
        hidden = hidden + (gate / (1 + np.exp(-gate)) * (x @ layer.w_up)) @ layer.w_down
    logits = _rms(hidden, w.final_norm, s.rms_norm_eps) @ w.lm_head
    return logits, present


def small_shape(layers: int = 2, heads: int = 4, kv_heads: int = 2, vocab: int = 96) -> DecoderShape:
    return DecoderShape(vocab, 64, layers, heads, kv_heads, 96, 10000.0, 1e-5, 256)


def write_random_llm(folder: Path, shape: DecoderShape, seed: int = 0) -> DecoderWeights:
    """A version folder with random weights and a tokenizer of ``shape.vocab_size`` tokens."""
    tokenizer = train_tokenizer(["the quick brown fox jumps over the lazy dog " * 4], shape.vocab_size)
    actual = tokenizer.get_vocab_size()
    weights = random_weights(DecoderShape(actual, *_rest(shape)), seed)
    write_llm_version(folder, weights, tokenizer)
    return weights


def _rest(shape: DecoderShape) -> tuple[int, int, int, int, int, float, float, int]:
    return (
        shape.hidden_size,
        shape.num_hidden_layers,
        shape.num_attention_heads,
        shape.num_key_value_heads,
        shape.intermediate_size,
        shape.rope_theta,
        shape.rms_norm_eps,
        shape.max_position_embeddings,
    )
