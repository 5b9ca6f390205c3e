"""The engine's automatic latency target comes from warm-up's decode steps: one fast or slow
outlier among them must not move it (issue 35: the fastest of five gave 39-74 ms targets)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from ortserve.llm import warmup
from ortserve.llm.kv_backend import StepFeeds


@dataclass
class _Layout:
    shared_buffer: bool = True
    kv_heads: int = 1
    head_dim: int = 2


class _ScriptedDecoder:
    """Each call moves a fake clock by the next scripted duration for its kind of step."""

    def __init__(self, clock: list[float], one_row_ms: list[float], wide_ms: list[float]) -> None:
        self.layout = _Layout()
        self.parts = 2
        self.run_seconds = 0.0
        self._clock = clock
        self._one_row = iter(one_row_ms)
        self._wide = iter(wide_ms)
        self.fused: object | None = None
        self.riding_token_s = 0.00008
        self._last_wide = 0.0

    def run_fused(self, decode: StepFeeds, chunk: StepFeeds) -> None:
        """The wide step just run again, plus what each chunk token adds to it."""
        self._clock[0] += self._last_wide + self.riding_token_s * chunk.ids.shape[1]

    def run_in_place(
        self, ids: np.ndarray, positions: np.ndarray, lengths: list[int], kv: list[np.ndarray]
    ) -> None:
        rows, new = ids.shape
        if new > 1:
            seconds = 0.001 + 0.0001 * new  # prefill: fixed part plus per token
        else:
            seconds = (next(self._one_row) if rows == 1 else next(self._wide)) / 1e3
            self._last_wide = seconds
        self._clock[0] += seconds


class _FakeTime:
    def __init__(self, clock: list[float]) -> None:
        self._clock = clock

    def perf_counter(self) -> float:
        return self._clock[0]


def test_the_one_row_step_is_the_median_of_warm_ups_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(warmup, "time", _FakeTime(clock))
    one_row = [5.5, 5.4, 3.8, 5.6, 5.5, 7.4, 5.5, 5.3, 5.7]  # one fast and one slow outlier
    wide = [12.0, 12.1, 9.0, 11.9, 12.0, 30.0, 12.0, 12.2, 11.8]
    decoder = _ScriptedDecoder(clock, one_row, wide)

    costs = warmup.measure(decoder, 2048)  # type: ignore[arg-type]

    assert costs.one_row_s == pytest.approx(0.0055)
    assert costs.row_s == pytest.approx((0.012 - 0.0055) / 7)
    assert costs.prefill_token_s > 0
    assert decoder.run_seconds == 0.0
    assert costs.riding_token_s is None  # no step graph


def test_a_riding_chunk_is_priced_by_what_it_adds_to_the_same_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(warmup, "time", _FakeTime(clock))
    decoder = _ScriptedDecoder(clock, [5.5] * 9, [12.0, 12.1, 9.0, 11.9, 12.0, 30.0, 12.0, 12.2, 11.8])
    decoder.fused = object()

    costs = warmup.measure(decoder, 2048)  # type: ignore[arg-type]

    assert costs.riding_token_s == pytest.approx(0.00008)
    assert costs.riding_token_s is not None and costs.riding_token_s < costs.prefill_token_s
