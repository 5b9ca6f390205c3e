"""The status page's data: rates over the last interval, a short history, recent errors.

Computed when a page asks and at most once per ``min_interval_s`` (every open page shares one
computation: ten pages cost what one does), from the server's own Prometheus exposition (see
totals.py). Nothing runs while no page is open.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from ortserve.server.status.events import EventLog
from ortserve.server.status.totals import ModelTotals, ServerTotals, read_totals

__all__ = ["StatusBoard", "quantile"]

_HISTORY = 120
"""Points of history per model (two minutes at one poll a second)."""
_RECENT = 50


def quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """The ``q`` quantile of the observations between two cumulative histograms (Prometheus'
    ``histogram_quantile``: linear inside a bucket); None when nothing was observed."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank, lower, below = q * counts[-1], 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = bound, count
    return lower


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


class StatusBoard:
    """Turns successive totals into the page's JSON document.

    Args:
        exposition: the server's metrics text (a worker's is the supervisor's merge).
        clock: monotonic seconds (injected: tests drive it).
        wall_clock: seconds since the epoch, for the times the page shows.
        events: recent warnings and errors from the server's log.
        min_interval_s: a poll sooner than this after the last computation gets the same answer.
    """

    def __init__(
        self,
        exposition: Callable[[], Awaitable[str | None]],
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        events: EventLog,
        min_interval_s: float = 1.0,
    ) -> None:
        self._exposition = exposition
        self._clock = clock
        self._wall = wall_clock
        self._events = events
        self._min_interval_s = min_interval_s
        self._lock = asyncio.Lock()
        self._previous: tuple[float, ServerTotals] | None = None
        self._answer: bytes | None = None
        self._history: dict[str, deque[list[float | None]]] = {}
        self._errors: deque[dict[str, Any]] = deque(maxlen=_RECENT)
        self.computations = 0
        """How many times the document was computed (tests and the CPU benchmark read it)."""

    async def document(self) -> bytes:
        """The JSON document, recomputed when the last one is older than the interval."""
        async with self._lock:
            now = self._clock()
            if self._answer is not None and self._previous and now - self._previous[0] < self._min_interval_s:
                return self._answer
            text = await self._exposition()
            totals = read_totals(text) if text is not None else ServerTotals()
            self._answer = orjson.dumps(self._build(now, totals, metrics=text is not None))
            self._previous = (now, totals)
            self.computations += 1
            return self._answer

    def _build(self, now: float, totals: ServerTotals, metrics: bool) -> dict[str, Any]:
        before = self._previous
        interval = now - before[0] if before else 0.0
        wall = self._wall()
        models = []
        for name, model in sorted(totals.models.items()):
            if not model.shown():
                self._history.pop(name, None)
                continue
            old = before[1].models.get(name) if before else None
            models.append(self._model(name, model, old, interval, wall))
        for gone in set(self._history) - {m["name"] for m in models}:
            del self._history[gone]
        return {
            "time": wall,
            "interval_s": round(interval, 3),
            "metrics": metrics,
            "workers": totals.workers,
            "models": models,
            "errors": list(self._errors)[::-1],
            "events": self._events.recent(),
        }

    def _model(
        self, name: str, now: ModelTotals, old: ModelTotals | None, interval: float, wall: float
    ) -> dict[str, Any]:
        old = old if old is not None else ModelTotals(latency=dict.fromkeys(now.latency, 0.0))
        per_s = 1.0 / interval if interval > 0 else 0.0
        qps = max(0.0, now.requests - old.requests) * per_s
        p50 = quantile(0.5, old.latency, now.latency)
        p99 = quantile(0.99, old.latency, now.latency)
        self._note_errors(name, now, old, wall)
        point: list[float | None] = [wall, round(qps, 3), _ms(p50), _ms(p99), now.queue_depth]
        history = self._history.setdefault(name, deque(maxlen=_HISTORY))
        if interval > 0:
            history.append(point)
        routed = {v: now.routed.get(v, 0.0) - old.routed.get(v, 0.0) for v in now.routed}
        total_routed = sum(routed.values())
        return {
            "name": name,
            "versions": [
                {
                    "version": version,
                    "state": view.state,
                    "provider": view.provider,
                    "fallback_level": view.fallback_level,
                    "breakers_open": sorted(view.breakers_open),
                    "role": view.role,
                    "share": round(routed.get(version, 0.0) / total_routed, 4) if total_routed > 0 else None,
                }
                for version, view in sorted(now.versions.items(), key=lambda item: _version_key(item[0]))
            ],
            "qps": round(qps, 3),
            "p50_ms": _ms(p50),
            "p99_ms": _ms(p99),
            "errors_per_s": round(max(0.0, now.failures - old.failures) * per_s, 3),
            "queue_depth": now.queue_depth,
            "busy": now.busy,
            "rollout": None
            if now.rollout is None
            else {"candidate": now.rollout[0], "share": now.rollout[1]},
            "llm": self._llm(now, old, per_s),
            "history": list(history),
        }

    @staticmethod
    def _llm(now: ModelTotals, old: ModelTotals, per_s: float) -> dict[str, Any] | None:
        llm = now.llm
        if llm is None:
            return None
        previous = old.llm
        tokens = llm.generated_tokens - (previous.generated_tokens if previous else 0.0)
        return {
            "running": llm.running,
            "waiting": llm.waiting,
            "kv_bytes": llm.kv_bytes,
            "prefix_hit_ratio": llm.prefix_hit_ratio,
            "tokens_per_s": round(max(0.0, tokens) * per_s, 3),
            "ttft_p50_ms": _ms(quantile(0.5, previous.ttft if previous else {}, llm.ttft)),
            "itl_p50_ms": _ms(quantile(0.5, previous.itl if previous else {}, llm.itl)),
        }

    def _note_errors(self, name: str, now: ModelTotals, old: ModelTotals, wall: float) -> None:
        """Errors and refusals since the last computation, one entry per kind."""
        for outcome, count in sorted(now.outcomes.items()):
            grown = count - old.outcomes.get(outcome, 0.0)
            if outcome != "success" and grown > 0:
                self._errors.append({"time": wall, "model": name, "kind": outcome, "count": int(grown)})
        for reason, count in sorted(now.refusals.items()):
            grown = count - old.refusals.get(reason, 0.0)
            if grown > 0:
                self._errors.append(
                    {"time": wall, "model": name, "kind": f"refused: {reason}", "count": int(grown)}
                )


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (1 << 62, version)
