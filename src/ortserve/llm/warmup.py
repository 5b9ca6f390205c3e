"""What a loaded decoder's steps cost, measured before the version is ready: the engine's
automatic defaults (latency target, prefill chunk) and its cost models' priors come from here."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from ortserve.llm.kv_backend import DecoderSession, StepFeeds

__all__ = ["StepCosts", "measure"]

_ROWS = 8
"""The wide step's rows: what one more row adds is (wide - one row) / (rows - 1)."""


@dataclass(frozen=True, slots=True)
class StepCosts:
    one_row_s: float
    """A decode step of one row."""
    row_s: float
    """What each further decoding row adds."""
    prefill_token_s: float
    """A prompt token's share of a chunk, beyond the chunk's fixed part."""
    chunk_fixed_s: float
    """What a prefill chunk pays whatever its length (reading the weights)."""
    riding_token_s: float | None = None
    """What a prompt token adds to a decode step it rides with, in one run of the step graph
    (None: the decoder has none)."""


def measure(
    decoder: DecoderSession, max_context_len: int, prompt_tokens: int = 64, steps: int = 9
) -> StepCosts:
    """Time prefills of a prompt and of a quarter of it, then one-row and eight-row decode
    steps, each several times. The decode steps count by their median: a step stretched by a
    neighbour on a shared core inflated the latency target tenfold with it (and the running set
    grew to the pool's limit), and the fastest of five, taken instead, moved the target from
    39 to 74 ms between loads on a quiet core (one-row steps of 3.8-7.4 ms around a median of
    5.5), and the engine's running set and tokens/s under overload with it. The prefills count
    by their fastest run (two each). Not on the engine thread; the model time it spends is not
    counted in ``decoder.run_seconds``."""
    prompt_tokens = max(8, min(prompt_tokens, max_context_len - steps - 1))
    riding: list[float] = []
    if decoder.layout.shared_buffer:
        full, short, times, wide = _measure_in_place(decoder, prompt_tokens, steps, riding)
    else:
        full, short, times, wide = _measure_optimum(decoder, prompt_tokens, steps)
    # Warm-up is no engine step: its model time must not count in the steps' share of
    # ONNX Runtime (it made model_run_seconds exceed engine_step_seconds on a fresh server).
    decoder.run_seconds = 0.0
    quarter = prompt_tokens // 4
    token_s = max((full - short) / (prompt_tokens - quarter), 1e-7)
    fixed = min(max(full - token_s * prompt_tokens, 0.0), full / 2)
    one_row = statistics.median(times)
    return StepCosts(
        one_row,
        max(statistics.median(wide) - one_row, 0.0) / (_ROWS - 1),
        (full - fixed) / prompt_tokens,
        fixed,
        max(statistics.median(riding) / prompt_tokens, 1e-7) if riding else None,
    )


def _measure_in_place(
    decoder: DecoderSession, prompt_tokens: int, steps: int, riding: list[float]
) -> tuple[float, float, list[float], list[float]]:
    """Time the prefills and decode steps on a pool-shaped buffer; with a step graph, also
    what the whole prompt as a chunk adds to the wide decode step it rides with (into
    ``riding``, once per step; the chunk goes to a row of its own)."""
    layout = decoder.layout
    ids = np.ones((1, prompt_tokens), dtype=np.int64)
    positions = np.arange(prompt_tokens, dtype=np.int64)[None]
    shape = (_ROWS + 1, layout.kv_heads, prompt_tokens + steps + 1, layout.head_dim)
    buffers = [np.zeros(shape, dtype=np.float32) for _ in range(decoder.parts)]
    prefills: dict[int, float] = {}
    for size in (prompt_tokens, prompt_tokens // 4) * 2:
        started = time.perf_counter()
        decoder.run_in_place(ids[:, :size], positions[:, :size], [size], [b[:1] for b in buffers])
        prefills[size] = min(prefills.get(size, 1e9), time.perf_counter() - started)
    # The quarter prompt rewrote the first keys and values with what they held: the cache
    # still holds the whole prompt for the decode steps.
    times, wide = [], []
    for step in range(steps):
        total = prompt_tokens + step + 1
        started = time.perf_counter()
        decoder.run_in_place(ids[:, :1], positions[:, :1] + total - 1, [total], [b[:1] for b in buffers])
        times.append(time.perf_counter() - started)
        decode = StepFeeds(
            np.ones((_ROWS, 1), np.int64),
            np.full((_ROWS, 1), total - 1),
            [total] * _ROWS,
            [b[:_ROWS] for b in buffers],
        )
        started = time.perf_counter()
        decoder.run_in_place(decode.ids, decode.positions, decode.lengths, decode.buffers)
        wide.append(time.perf_counter() - started)
        if decoder.fused is not None:
            chunk = StepFeeds(ids, positions, [prompt_tokens], [b[_ROWS:] for b in buffers])
            started = time.perf_counter()
            decoder.run_fused(decode, chunk)
            riding.append(max(time.perf_counter() - started - wide[-1], 0.0))
    return prefills[prompt_tokens], prefills[prompt_tokens // 4], times, wide


def _measure_optimum(
    decoder: DecoderSession, prompt_tokens: int, steps: int
) -> tuple[float, float, list[float], list[float]]:
    ids = np.ones((1, prompt_tokens), dtype=np.int64)
    positions = np.arange(prompt_tokens, dtype=np.int64)[None]
    prefills: dict[int, float] = {}
    for size in (prompt_tokens // 4, prompt_tokens) * 2:  # the full prompt last: its cache goes on
        started = time.perf_counter()
        _, past = decoder.run(
            ids[:, :size], positions[:, :size], np.ones_like(ids[:, :size]), decoder.empty_past(1)
        )
        prefills[size] = min(prefills.get(size, 1e9), time.perf_counter() - started)
    times, wide = [], []
    for step in range(steps):
        total = prompt_tokens + step + 1
        started = time.perf_counter()
        _, past = decoder.run(
            ids[:, :1], positions[:, :1] + total - 1, np.ones((1, total), dtype=np.int64), past
        )
        times.append(time.perf_counter() - started)
        tiled = [np.repeat(part, _ROWS, axis=0) for part in past]
        started = time.perf_counter()
        decoder.run(
            np.ones((_ROWS, 1), np.int64),
            np.full((_ROWS, 1), total),
            np.ones((_ROWS, total + 1), np.int64),
            tiled,
        )
        wide.append(time.perf_counter() - started)
    return prefills[prompt_tokens], prefills[prompt_tokens // 4], times, wide
