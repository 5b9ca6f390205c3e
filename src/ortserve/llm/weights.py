"""The shape and weights of a Llama-style decoder, as plain NumPy arrays.

Separate from the graph builder so the numpy reference forward pass, the corpus fit and the
random initialiser share one description of the architecture (RMSNorm, rotary embeddings,
grouped-query attention, SwiGLU).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["DecoderShape", "DecoderWeights", "LayerWeights", "random_weights"]

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class DecoderShape:
    """Sizes of the decoder, as Hugging Face's ``LlamaConfig`` names them."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def check(self) -> None:
        """Raise ValueError for sizes the architecture cannot have."""
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ValueError("the head dimension must be even (rotary embeddings)")

    def parameters(self) -> int:
        """Number of weights (embedding and head counted separately, as they are not tied)."""
        d, kv = self.hidden_size, self.num_key_value_heads * self.head_dim
        per_layer = 2 * d + d * d * 2 + 2 * d * kv + 3 * d * self.intermediate_size
        return 2 * self.vocab_size * d + d + self.num_hidden_layers * per_layer


@dataclass(frozen=True, slots=True)
class LayerWeights:
    """One decoder layer; matrices are [in, out] (what MatMul multiplies by)."""

    attn_norm: F32
    wq: F32
    wk: F32
    wv: F32
    wo: F32
    mlp_norm: F32
    w_gate: F32
    w_up: F32
    w_down: F32


@dataclass(frozen=True, slots=True)
class DecoderWeights:
    """Every weight of the decoder."""

    shape: DecoderShape
    embed: F32
    layers: tuple[LayerWeights, ...]
    final_norm: F32
    lm_head: F32


def random_weights(shape: DecoderShape, seed: int) -> DecoderWeights:
    """Scaled Gaussian weights: deterministic, numerically tame, meaningless (tests, benchmarks)."""
    shape.check()
    rng = np.random.default_rng(seed)
    d, kv = shape.hidden_size, shape.num_key_value_heads * shape.head_dim

    def matrix(rows: int, cols: int) -> F32:
        value: F32 = (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32)
        return value

    def norm() -> F32:
        return (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)

    layers = tuple(
        LayerWeights(
            norm(),
            matrix(d, d),
            matrix(d, kv),
            matrix(d, kv),
            matrix(d, d),
            norm(),
            matrix(d, shape.intermediate_size),
            matrix(d, shape.intermediate_size),
            matrix(shape.intermediate_size, d),
        )
        for _ in range(shape.num_hidden_layers)
    )
    embed = rng.standard_normal((shape.vocab_size, d)).astype(np.float32)
    return DecoderWeights(shape, embed, layers, norm(), matrix(d, shape.vocab_size))
