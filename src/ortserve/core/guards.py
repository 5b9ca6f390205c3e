"""What the core calls on the features it runs, declared here so that the core imports none of
them (tests/test_import_direction.py): a served version's guard (input sandbox, readiness while
degraded, fallback levels: ``resilience.ResilienceGuard``) and a session made of fallback levels
(``resilience.FallbackChain``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["Breaker", "ChainedSession", "FallbackLevels", "Guard", "LevelBreaker", "ShapeCheck"]

Array = npt.NDArray[np.generic]


class Breaker(Protocol):
    """Level 0's breaker as the served version reads it, once per request."""

    @property
    def allows(self) -> bool: ...


class ShapeCheck(Protocol):
    """Refuses a request whose input shapes pass the configured limits (before queueing)."""

    def check_shapes(self, feeds: Mapping[str, Array]) -> None: ...


class LevelBreaker(Protocol):
    """A fallback level's breaker as status pages and metrics read it."""

    @property
    def state(self) -> object: ...


class FallbackLevels(Protocol):
    """A chain of fallback levels as status pages and metrics read it."""

    @property
    def levels(self) -> Sequence[object]: ...

    @property
    def breakers(self) -> Sequence[LevelBreaker]: ...

    @property
    def transitions(self) -> Mapping[tuple[int, int], int]: ...

    @property
    def failures(self) -> Mapping[tuple[int, str], int]: ...

    def current_level(self) -> int | None: ...


class Guard(Protocol):
    """A served version's resilience: asked only when level 0's breaker is down."""

    @property
    def primary(self) -> Breaker | None: ...

    @property
    def chain(self) -> FallbackLevels | None: ...

    @property
    def shapes(self) -> ShapeCheck | None: ...

    @property
    def ready(self) -> bool: ...

    def check_usable(self) -> None: ...

    def parameters(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class ChainedSession(Protocol):
    """A session whose ``run`` answers from the first fallback level that can; the runner's
    fast paths (OrtValues, IOBinding) apply only to a plain ``InferenceSession``."""

    def get_inputs(self) -> Sequence[Any]: ...

    def get_outputs(self) -> Sequence[Any]: ...

    def get_providers(self) -> Sequence[str]: ...

    def run(self, output_names: list[str], feeds: dict[str, Array]) -> list[Array]: ...
