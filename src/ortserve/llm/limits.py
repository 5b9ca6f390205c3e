"""The bounds of one generation engine (from the model's ``llm`` config) and the prefill shares
that trade a stream's inter-token latency against a prompt's time to first token."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BEHIND", "BEHIND_SHARE", "MIN_CHUNK_TOKENS", "PREFILL_SHARE", "EngineLimits"]

PREFILL_SHARE = 1.5
"""Prompt prefill a step may carry, in decode steps of the running set: a stream's step with a
chunk is at most 2.5 times one without (the ITL p99 / p50 bound is 3)."""

MIN_CHUNK_TOKENS = 32
"""The smallest automatic prefill chunk: a chunk reads every weight once whatever its length,
so a smaller one would spend most of its time on that (a 32-token chunk of the 30.6M decoder:
about 6 ms fixed, 10.5 ms for its tokens)."""

BEHIND = 0.5
"""A prompt is behind when it has been prefilling longer than this many times its own prefill
at the calm pace: the step's prefill then takes up to ``BEHIND_SHARE`` decode steps."""
BEHIND_SHARE = 1.75
"""Prefill a step may carry while a prompt is behind, in decode steps of the width the set is
heading for: a step with a chunk is at most 2.75 of them (issue 28's ITL p99 / p50 bound is 3:
2.0 gave 3.07 under a loose target, the heading step being wider than the plain one), and
never beyond the latency target."""


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """Bounds of one engine (from the model's ``llm`` config)."""

    max_num_seqs: int = 16
    """Sequences running together at most (an upper bound: the cost model picks fewer)."""
    max_waiting: int = 64
    """Requests waiting for a place at most; beyond, 429."""
    max_context_len: int = 2048
    prefill_tokens_per_step: int = 2048
    """Upper bound of the automatic prefill chunk."""
    prefill_chunk_tokens: int = 0
    """Prompt tokens prefilled per step (0: from the measured step cost)."""
    max_itl_ms: float = 0.0
    """Target inter-token latency of running streams (0: from the measured one-row step)."""
    max_queue_wait_s: float = 30.0
    """A request that could not get its first token within this long is refused (429)."""
    kv_pool_bytes: int = 1 << 30
    """Keys and values of running sequences at most (the pool); beyond, preemption."""
    prefill_share: float = PREFILL_SHARE
    """Prompt prefill a step may carry beside its decode, in decode steps (time to first token
    against ITL p99 / p50; see :data:`PREFILL_SHARE`)."""
    behind_share: float = BEHIND_SHARE
    """The share while a prompt is behind its calm pace (:data:`BEHIND`)."""
