"""Weights for the demo decoder computed from a corpus's n-gram statistics, so it says something.

Random weights make gibberish and training needs torch; instead the network is wired by hand
to compute a smoothed trigram model of the corpus:

- the residual stream has four parts: the current token (one-hot), the previous token
  (one-hot), logit corrections, and one constant channel that dominates RMSNorm, so every
  norm is a known constant scale;
- attention copies the previous token into its part: every query and key comes from the
  constant channel, shaped so that the rotary embeddings score "one position back" highest
  by a wide margin; values carry the current token's one-hot;
- the SwiGLU MLP has one hidden unit per (previous, current) pair seen in the corpus; it fires
  only when both are present and writes log p(next | pair) - log p(next | current);
- the head adds log p(next | current) (a smoothed bigram table) to those corrections.

So greedy decoding continues a corpus sentence, and sampling wanders between them.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

import numpy as np

from ortserve.llm.weights import F32, DecoderShape, DecoderWeights, LayerWeights

__all__ = ["fit_trigram_decoder"]

_BIAS = 1000.0  # the constant channel: large enough that RMSNorm barely depends on the rest
_GATE = 40.0  # a hidden unit's gate is +GATE/2 when its pair is present, <= -GATE/2 otherwise
_MARGIN = 30.0  # attention logit margin of "one position back" over any other position
_SMOOTH = 0.05


def _log_tables(sequences: Sequence[Sequence[int]], vocab: int) -> tuple[F32, dict[tuple[int, int], F32]]:
    """Smoothed log p(next | current) [V, V] and log p(next | prev, current) for seen pairs."""
    unigram = np.full(vocab, 0.1)
    bigram = np.zeros((vocab, vocab))
    trigram: dict[tuple[int, int], Counter[int]] = {}
    for seq in sequences:
        for token in seq:
            unigram[token] += 1
        for a, c in itertools.pairwise(seq):
            bigram[a, c] += 1
        for b, a, c in zip(seq, seq[1:], seq[2:]):
            trigram.setdefault((b, a), Counter())[c] += 1
    unigram /= unigram.sum()
    p_bi = (bigram + _SMOOTH * unigram) / (bigram.sum(axis=1, keepdims=True) + _SMOOTH)
    log_bi = np.log(p_bi)
    corrections = {}
    for pair, counts in trigram.items():
        row = _SMOOTH * p_bi[pair[1]]
        for c, n in counts.items():
            row[c] += n
        p_tri = row / (sum(counts.values()) + _SMOOTH)
        corrections[pair] = (np.log(p_tri) - log_bi[pair[1]]).astype(np.float32)
    return log_bi.astype(np.float32), corrections


def _norm_scale(ones: int, hidden: int, eps: float) -> float:
    """RMSNorm's factor for a residual of ``ones`` unit channels plus the constant channel."""
    return float(1.0 / np.sqrt((ones + _BIAS**2) / hidden + eps))


def _previous_token_attention(shape: DecoderShape, layer: LayerWeights) -> None:
    """Fill wq/wk/wv/wo so attention copies the previous token's one-hot into its part."""
    vocab, hd, bias = shape.vocab_size, shape.head_dim, 3 * shape.vocab_size
    half = hd // 2
    theta = 1.0 / (shape.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    # Query pair i = e^{-i theta}, key pair = 1: the score is sum_i cos((delta - 1) theta_i).
    offsets = np.arange(0, shape.max_position_embeddings + 1, dtype=np.float64)
    totals = np.cos(np.outer(offsets - 1, theta)).sum(axis=1)
    gap = totals[1] - np.max(np.delete(totals, 1))
    amplitude = _MARGIN * np.sqrt(hd) / gap
    scale = _norm_scale(1, shape.hidden_size, shape.rms_norm_eps)
    x_bias, x_one = _BIAS * scale, scale
    query = np.concatenate([np.cos(theta), -np.sin(theta)]) * amplitude / x_bias
    key = np.concatenate([np.ones(half), np.zeros(half)]) / x_bias
    for head in range(shape.num_attention_heads):
        layer.wq[bias, head * hd : (head + 1) * hd] = query
    groups = shape.num_attention_heads // shape.num_key_value_heads
    for kv_head in range(shape.num_key_value_heads):
        layer.wk[bias, kv_head * hd : (kv_head + 1) * hd] = key
        for t in range(hd):
            token = kv_head * hd + t
            if token < vocab:
                layer.wv[token, kv_head * hd + t] = 1.0 / x_one
                # Only the first query head of each group writes (the others see the same).
                layer.wo[kv_head * groups * hd + t, vocab + token] = 1.0


def _pair_mlp(
    shape: DecoderShape, layer: LayerWeights, pairs: list[tuple[int, int]], corr: list[F32]
) -> None:
    vocab, bias = shape.vocab_size, 3 * shape.vocab_size
    scale = _norm_scale(2, shape.hidden_size, shape.rms_norm_eps)
    x_bias, x_one = _BIAS * scale, scale
    fired = (_GATE / 2) / (1 + np.exp(-_GATE / 2))
    for unit, ((prev, cur), correction) in enumerate(zip(pairs, corr)):
        layer.w_gate[cur, unit] += _GATE / x_one
        layer.w_gate[vocab + prev, unit] += _GATE / x_one
        layer.w_gate[bias, unit] = -1.5 * _GATE / x_bias
        layer.w_up[bias, unit] = 1.0 / x_bias
        layer.w_down[unit, 2 * vocab : 3 * vocab] = correction / fired


def fit_trigram_decoder(
    sequences: Sequence[Sequence[int]], vocab_size: int, head_dim: int = 64, rope_theta: float = 10000.0
) -> DecoderWeights:
    """A one-layer decoder whose logits are a smoothed trigram model of ``sequences``.

    Args:
        sequences: the corpus as token ids, one document each (ending with EOS).
        vocab_size: the tokenizer's vocabulary size.
    """
    log_bi, corrections = _log_tables(sequences, vocab_size)
    hidden = -(-(3 * vocab_size + 1) // (2 * head_dim)) * (2 * head_dim)
    pairs = sorted(corrections)
    heads = hidden // head_dim
    shape = DecoderShape(vocab_size, hidden, 1, heads, heads // 2, len(pairs), rope_theta, 1e-5, 2048)
    shape.check()
    d, kv = hidden, shape.num_key_value_heads * head_dim

    def zeros(rows: int, cols: int) -> F32:
        return np.zeros((rows, cols), dtype=np.float32)

    layer = LayerWeights(
        np.ones(d, np.float32), zeros(d, d), zeros(d, kv), zeros(d, kv), zeros(d, d),
        np.ones(d, np.float32), zeros(d, len(pairs)), zeros(d, len(pairs)), zeros(len(pairs), d),
    )  # fmt: skip
    _previous_token_attention(shape, layer)
    _pair_mlp(shape, layer, pairs, [corrections[p] for p in pairs])
    embed = zeros(vocab_size, d)
    embed[np.arange(vocab_size), np.arange(vocab_size)] = 1.0
    embed[:, 3 * vocab_size] = _BIAS
    head_scale = 1.0 / _norm_scale(2, d, shape.rms_norm_eps)
    lm_head = zeros(d, vocab_size)
    lm_head[:vocab_size] = log_bi * head_scale
    lm_head[2 * vocab_size : 3 * vocab_size] = np.eye(vocab_size, dtype=np.float32) * head_scale
    return DecoderWeights(shape, embed, (layer,), np.ones(d, np.float32), lm_head)
