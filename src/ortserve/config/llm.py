"""The ``llm:`` section of a model's ``config.yaml`` (used when ``kind: llm``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LlmConfig"]


class LlmConfig(BaseModel):
    """How one LLM version generates: batch, queue, context and prefix-cache bounds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_num_seqs: Annotated[int, Field(ge=1, le=1024)] = 16
    """Sequences decoding together in one batch at most."""
    max_waiting: Annotated[int, Field(ge=0)] = 100
    """Requests waiting for a place in the batch at most; beyond, 429 with Retry-After."""
    max_context_len: Annotated[int, Field(ge=2)] | None = None
    """Prompt plus generated tokens at most; default: the model's max_position_embeddings."""
    default_max_tokens: Annotated[int, Field(ge=1)] | None = None
    """Tokens generated when a request names no limit; default: generation_config's
    max_new_tokens, else 256."""
    kv_cache_bytes: Annotated[int, Field(ge=0)] = 256 * 1024 * 1024
    """Bytes of keys and values the prefix cache keeps (0 turns prefix reuse off)."""
    context_ttl_s: Annotated[float, Field(gt=0)] = 600.0
    """A cached prefix unused for this long is dropped (a conversation's context)."""
    prefix_block_tokens: Annotated[int, Field(ge=1, le=4096)] = 16
    """Prefixes are matched in whole blocks of this many tokens."""
    prefill_tokens_per_step: Annotated[int, Field(ge=1)] = 2048
    """Prompt tokens prefilled between two decode steps at most (at least one request)."""
    prefill_chunk_tokens: Annotated[int, Field(ge=0, le=65536)] = 0
    """Prompt tokens prefilled per engine step, in chunks between decode steps (0: from the
    measured step cost, at most prefill_tokens_per_step)."""
    max_itl_ms: Annotated[float, Field(ge=0, le=600_000)] = 0.0
    """Target inter-token latency of running streams: the running set grows only while the
    predicted step stays within it (0: ten times the measured one-row step, at least 20 ms, and
    at least what holds half of it in decode beside the smallest prefill chunk)."""
    max_queue_wait_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    """A request that could not get its first token within this long is refused at once (429)."""
    kv_pool_bytes: Annotated[int, Field(ge=1 << 20)] = 1 << 30
    """Keys and values of running sequences at most; beyond, the newest are preempted."""
    fuse_steps: bool = True
    """Run each step's decode and its first prompt chunk as one graph run when the decoder is a
    GroupQueryAttention graph ortserve wrote (the weights are read once a step, not twice; they
    are then held by a second session, twice the weights' memory). Other graphs, quantized
    ones and device sessions keep separate runs."""
    enable_cuda_graph: bool = False
    """CUDA sessions: decode steps captured as CUDA graphs, one per row count (the keys and values
    pool is then allocated whole at the first request; limits in docs/device.md)."""
    cache_salt_header: Annotated[str, Field(min_length=1, max_length=64)] | None = "authorization"
    """Prefix-cache salt by tenant: requests whose value of this header differ never share a
    cached prefix nor learn of one through ``cached_tokens`` (null: only the ``cache_salt``
    request field salts)."""
