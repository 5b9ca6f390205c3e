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
