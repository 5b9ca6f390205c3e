"""The execution levels a chain falls back through: sessions (built now or at first need) and
default answers."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Protocol

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from ortserve.resilience.classify import FailureKind, InjectedFault
from ortserve.resilience.defaults import DefaultAnswers
from ortserve.resilience.faults import FaultInjector

__all__ = ["DefaultLevel", "Level", "SessionLevel"]

Array = npt.NDArray[np.generic]
Feeds = dict[str, Array]


class Level(Protocol):
    """One way of answering a batch: all the graph's outputs, in order, or an exception."""

    index: int
    """0 primary, 1 other instance/device, 2 fallback session, 3 default answer."""
    name: str

    def run(self, feeds: Feeds) -> list[Array]: ...

    def probe(self) -> None:
        """Run the warm-up inputs (a half-open probe); raises when the level still fails."""
        ...


class SessionLevel:
    """A level backed by an ONNX Runtime session, built at once or at first need.

    Args:
        index, name: the level's place and a label for logs ("L2 cpu session").
        build: returns the session (called once, under a lock, on first use if not given).
        output_names: the primary graph's outputs, asked for in that order.
        warmup: the probe's feeds.
        faults: injected faults for this level, or None.
        chunk_rows: largest batch this session takes (its own batching); 0: any.
        session: an already built session (then ``build`` is not called).
    """

    def __init__(
        self,
        index: int,
        name: str,
        build: Callable[[], ort.InferenceSession],
        output_names: list[str],
        warmup: Feeds,
        faults: FaultInjector | None = None,
        chunk_rows: int = 0,
        session: ort.InferenceSession | None = None,
    ) -> None:
        self.index = index
        self.name = name
        self._build = build
        self._output_names = output_names
        self._warmup = warmup
        self._faults = faults
        self._chunk_rows = chunk_rows
        self._session = session
        self._lock = threading.Lock()
        self.direct: Callable[[Feeds], list[Array]] | None = None
        """One call into the session when :meth:`run` has nothing else to do (built, no
        faults, no chunks), else None: the primary's run is paid by every batch. (Not
        ``self.run`` as the fallback: a bound method kept on its own instance is a reference
        cycle, and an unloaded version must go with its last reference, not with a collection.)"""
        self._settle_direct()

    @property
    def faults(self) -> FaultInjector | None:
        return self._faults

    @faults.setter
    def faults(self, faults: FaultInjector | None) -> None:
        self._faults = faults
        self._settle_direct()

    def _settle_direct(self) -> None:
        session = self._session
        if session is None or self._faults is not None or self._chunk_rows:
            self.direct = None
        else:
            self.direct = functools.partial(session.run, self._output_names)

    @property
    def built(self) -> bool:
        return self._session is not None

    def session(self) -> ort.InferenceSession:
        """The session, building it now when it was left for first need.

        Raises:
            InjectedFault: building failed (a persistent failure of this level).
        """
        session = self._session
        if session is not None:
            return session
        with self._lock:
            if self._session is None:
                try:
                    self._session = self._build()
                except Exception as exc:
                    raise InjectedFault(
                        FailureKind.PERSISTENT, f"{self.name} could not be built: {exc}"
                    ) from exc
                self._settle_direct()
            return self._session

    def run(self, feeds: Feeds) -> list[Array]:
        if self.faults is not None:
            self.faults.before_run(self.name)
        session = self._session or self.session()
        if not self._chunk_rows:
            return session.run(self._output_names, feeds)  # type: ignore[no-any-return]
        rows = _rows(feeds)
        if rows <= self._chunk_rows:
            return list(session.run(self._output_names, feeds))
        parts = [
            session.run(
                self._output_names, {k: v[start : start + self._chunk_rows] for k, v in feeds.items()}
            )
            for start in range(0, rows, self._chunk_rows)
        ]
        return [np.concatenate([part[i] for part in parts]) for i in range(len(self._output_names))]

    def probe(self) -> None:
        self.run(self._warmup)


class DefaultLevel:
    """Level 3: static or remembered answers (see :class:`DefaultAnswers`)."""

    index = 3
    name = "L3 default answer"

    def __init__(self, answers: DefaultAnswers, faults: FaultInjector | None = None) -> None:
        self.answers = answers
        self.faults = faults

    def run(self, feeds: Feeds) -> list[Array]:
        if self.faults is not None:
            self.faults.before_run(self.name)
        return self.answers.answer(feeds)

    def probe(self) -> None:
        if self.faults is not None:
            self.faults.before_run(self.name)


def _rows(feeds: Feeds) -> int:
    for array in feeds.values():
        return int(array.shape[0]) if array.ndim else 1
    return 1
