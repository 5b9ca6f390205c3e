"""The ordered chain of execution levels behind one served version, each behind a breaker.

The chain stands where the runner's session stood (it has the session's ``run``), so the
runner, the scheduler and the transports are unchanged: a batch is offered to the first level
whose breaker is closed; a failure that is not the input's fault is counted against that level
and the same batch goes on to the next level, so no request is failed more than once. The
answer of any level but the primary carries a degraded mark (:mod:`ortserve.core.marks`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from ortserve.core.marks import mark
from ortserve.core.types import Degraded
from ortserve.errors import InvalidInput, ModelNotReady
from ortserve.resilience.breaker import Breaker, BreakerState
from ortserve.resilience.classify import FailureKind, classify
from ortserve.resilience.defaults import DefaultAnswers, NoDefaultAnswer
from ortserve.resilience.levels import Level, SessionLevel

__all__ = ["FallbackChain", "NoUsableLevel"]

logger = logging.getLogger(__name__)

Array = npt.NDArray[np.generic]
Feeds = dict[str, Array]


class NoUsableLevel(ModelNotReady):
    """Every level failed or is open: 503 with each level's reason."""


class FallbackChain:
    """Session-like front of the levels (``run``, ``get_inputs``, ``get_outputs``, ``get_providers``).

    Args:
        label: ``model version N`` for logs.
        primary: level 0's session (metadata, providers).
        levels: in order; ``levels[0]`` is the primary.
        breakers: one per level.
        defaults: level 3's answers, to remember good answers into when configured.
        degraded_status: HTTP status of a degraded answer.
        on_open: called (on the worker thread) when a breaker opens: the prober reschedules.
    """

    def __init__(
        self,
        label: str,
        primary: ort.InferenceSession,
        levels: Sequence[Level],
        breakers: Sequence[Breaker],
        defaults: DefaultAnswers | None = None,
        degraded_status: int = 200,
        on_open: Callable[[], None] | None = None,
    ) -> None:
        self.label = label
        self._primary = primary
        self.levels = list(levels)
        self.breakers = list(breakers)
        first = self.levels[0]
        self._first_session = first if isinstance(first, SessionLevel) else None
        """Level 0 when a session backs it: run through its ``direct`` (one call, usually)."""
        self._remember = defaults if defaults is not None and defaults.remembers else None
        self._degraded_status = degraded_status
        self.on_open = on_open
        self.armed = False
        """False during warm-up: runs go to the primary only, with no faults and no counting."""
        self._lock = threading.Lock()
        self.answered_level = 0
        self.transitions: dict[tuple[int, int], int] = {}
        self.failures: dict[tuple[int, str], int] = {}
        self.last_error: dict[int, str] = {}

    # -- the session's face -----------------------------------------------------------
    def get_inputs(self) -> list[ort.NodeArg]:
        return list(self._primary.get_inputs())

    def get_outputs(self) -> list[ort.NodeArg]:
        return list(self._primary.get_outputs())

    def get_providers(self) -> list[str]:
        return list(self._primary.get_providers())

    def run(self, output_names: list[str], feeds: Feeds) -> list[Array]:
        """Answer the batch from the first level that can (all outputs, graph order).

        Raises:
            InvalidInput: the input made the run fail (400; no level is blamed).
            NoUsableLevel: every level is open or failed on this batch (503).
        """
        if not self.armed:
            return list(self._primary.run(output_names, feeds))
        level, breaker = self.levels[0], self.breakers[0]
        if not breaker.allows:
            return self._fall_back(feeds, [f"{level.name}: circuit open ({breaker.reason})"])
        # Level 0 with its breaker closed: the common case, kept short (every line here is
        # paid by every batch; a small model's run is ~30 us).
        try:
            direct = None if self._first_session is None else self._first_session.direct
            outputs = level.run(feeds) if direct is None else direct(feeds)
        except Exception as exc:
            self._failed(level, breaker, exc)
            return self._fall_back(feeds, [f"{level.name}: {exc}"])
        breaker.succeeded()
        if self.answered_level == 0 and self._remember is None:
            return outputs
        return self._answered(level, feeds, outputs, [])

    def _fall_back(self, feeds: Feeds, reasons: list[str]) -> list[Array]:
        """Answer from the first level after level 0 that can (``reasons``: why not level 0)."""
        for level, breaker in zip(self.levels[1:], self.breakers[1:], strict=True):
            if not breaker.allows:
                reasons.append(f"{level.name}: circuit open ({breaker.reason})")
                continue
            try:
                outputs = level.run(feeds)
            except NoDefaultAnswer as exc:
                reasons.append(f"{level.name}: {exc}")
                continue
            except Exception as exc:
                self._failed(level, breaker, exc)
                reasons.append(f"{level.name}: {exc}")
                continue
            breaker.succeeded()
            return self._answered(level, feeds, outputs, reasons)
        raise NoUsableLevel(f"{self.label} has no usable execution level: " + "; ".join(reasons))

    # -- state read by readiness, metadata and metrics --------------------------------
    def current_level(self) -> int | None:
        """The level traffic goes to now (None: every breaker is open)."""
        for level, breaker in zip(self.levels, self.breakers, strict=True):
            if breaker.allows:
                return level.index
        return None

    def status(self) -> tuple[int | None, str]:
        """The current level and why the levels before it are skipped ("" at level 0)."""
        level = self.current_level()
        return level, self._skip_reason(level)

    def next_probe_at(self) -> float | None:
        """The earliest due time (monotonic) of any open breaker's probe."""
        due = [at for b in self.breakers if (at := b.probe_at()) is not None]
        return min(due) if due else None

    def probe(self) -> None:
        """Probe every level whose probe is due, with the warm-up inputs (blocking)."""
        for level, breaker in zip(self.levels, self.breakers, strict=True):
            if not breaker.begin_probe():
                continue
            try:
                level.probe()
            except Exception as exc:
                breaker.end_probe(False, f"probe failed: {exc}")
                logger.warning("%s: %s still failing (probe: %s)", self.label, level.name, exc)
            else:
                breaker.end_probe(True)
                logger.warning("%s: %s recovered (probe succeeded); circuit closed", self.label, level.name)

    # -- internals ---------------------------------------------------------------------
    def _failed(self, level: Level, breaker: Breaker, exc: Exception) -> None:
        kind = classify(exc)
        if kind is FailureKind.INPUT:
            raise InvalidInput(f"the model could not run this input: {exc}") from None
        with self._lock:
            key = (level.index, kind.value)
            self.failures[key] = self.failures.get(key, 0) + 1
            self.last_error[level.index] = str(exc)
        if breaker.record(kind):
            logger.warning(
                "%s: %s circuit opened: %s (last error: %s)", self.label, level.name, breaker.reason, exc
            )
            if self.on_open is not None:
                self.on_open()

    def _answered(self, level: Level, feeds: Feeds, outputs: list[Array], reasons: list[str]) -> list[Array]:
        previous = self.answered_level
        if previous != level.index:
            with self._lock:
                key = (previous, level.index)
                self.transitions[key] = self.transitions.get(key, 0) + 1
                self.answered_level = level.index
            logger.warning(
                "%s: traffic moved from level %d to level %d (%s)",
                self.label,
                previous,
                level.index,
                "; ".join(reasons) or "recovered",
            )
        if self._remember is not None and level.index < 3:
            self._remember.remember(feeds, outputs)
        if level.index == 0:
            return outputs
        reason = "; ".join(reasons) or self._skip_reason(level.index)
        return mark(outputs, Degraded(level.index, reason, self._degraded_status))

    def _skip_reason(self, level: int | None) -> str:
        parts = []
        for index, breaker in enumerate(self.breakers):
            if level is not None and self.levels[index].index >= level:
                break
            if breaker.state is not BreakerState.CLOSED or not breaker.allows:
                parts.append(f"{self.levels[index].name}: circuit open ({breaker.reason})")
        return "; ".join(parts)
