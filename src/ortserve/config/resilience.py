"""The resilience sections of a model's config: fallback levels, breaker, faults, input sandbox."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "LEVEL_NAMES",
    "BreakerConfig",
    "DefaultAnswerConfig",
    "FallbackConfig",
    "FaultConfig",
    "InputConstraint",
    "StaticOutput",
]

LEVEL_NAMES = ("L0", "L1", "L2", "L3")
"""Level keys of ``faults:``: L0 the primary session, L1 the other instances/devices, L2 the
fallback session, L3 the default answer."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BreakerConfig(_Strict):
    """When a level's circuit opens, and how it is probed closed again."""

    consecutive_failures: Annotated[int, Field(ge=1)] = 3
    """Persistent failures in a row that open the circuit."""
    failure_rate: Annotated[float, Field(gt=0, le=1)] = 0.5
    """Share of failed runs (any kind) over ``window_s`` that opens the circuit ..."""
    window_s: Annotated[float, Field(gt=0)] = 10.0
    min_runs: Annotated[int, Field(ge=1)] = 20
    """... once the window holds at least this many runs."""
    open_s: Annotated[float, Field(gt=0)] = 2.0
    """First wait before a half-open probe (warm-up inputs); doubled after each failed probe."""
    max_open_s: Annotated[float, Field(gt=0)] = 60.0


class StaticOutput(_Strict):
    """One output's default answer for one row (broadcast over the batch)."""

    data: list[float | int | bool | str]
    shape: list[Annotated[int, Field(ge=0)]] | None = None
    """The row's shape; default: the graph's output shape without the batch dimension."""


class DefaultAnswerConfig(_Strict):
    """Level 3: what a version answers when no session can."""

    outputs: dict[str, StaticOutput] | None = None
    """Static answers per output; every output must be given."""
    last_good: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    """Rows remembered (LRU) to answer an identical input with its last good answer; 0: off."""


class FallbackConfig(_Strict):
    """The ordered levels a version falls back through (docs/resilience.md)."""

    device_ids: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    """Level 0 runs on the first device, level 1 on the others (one session each)."""
    session: Literal["none", "cpu"] = "cpu"
    """Level 2: the same model on the CPU provider, unless ``model`` names a lighter one."""
    model: str | None = None
    """Level 2 from another model of the repository (a lighter one), on its own config."""
    version: Annotated[int, Field(ge=1)] | None = None
    """That model's version; default its highest."""
    build: Literal["lazy", "load"] = "lazy"
    """Build the level 2 session at first need (no memory until then) or at load."""
    default: DefaultAnswerConfig | None = None
    """Level 3 (none by default: a version without it fails once every session has)."""
    degraded_status: Literal[200, 206] = 200
    """HTTP status of an answer from a level other than 0."""
    ready_when_degraded: bool = True
    """A version answering from a fallback level reports ready (false: not ready, 503)."""
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)


class FaultConfig(_Strict):
    """Injected failures for one level (honoured only under ``--enable-fault-injection``)."""

    error_rate: Annotated[float, Field(ge=0, le=1)] = 0.0
    error_after: Annotated[int, Field(ge=0)] | None = None
    """Every run after this many succeeded fails."""
    latency_ms: Annotated[float, Field(ge=0)] = 0.0
    """Added to every run."""
    hang_ms: Annotated[float, Field(ge=0)] = 0.0
    """Each failing run first stalls this long (a hung device caught by a watchdog)."""
    kind: Literal["persistent", "transient", "input"] = "persistent"
    """How the injected failure classifies."""
    cycle_s: Annotated[float, Field(gt=0)] | None = None
    active_s: Annotated[float, Field(ge=0)] | None = None
    """With ``cycle_s``: the faults apply only during the first ``active_s`` of every cycle
    (counted from load), so drills and soaks switch levels back and forth."""
    offset_s: Annotated[float, Field(ge=0)] = 0.0
    """No faults for this long after load; the cycles start then (levels can fail in turn)."""
    seed: int = 0

    @model_validator(mode="after")
    def _window(self) -> FaultConfig:
        if (self.cycle_s is None) != (self.active_s is None):
            raise ValueError("cycle_s and active_s go together")
        return self


class InputConstraint(_Strict):
    """The sandbox of one input: checked before a request is queued (400 naming the element)."""

    min: float | None = None
    max: float | None = None
    allow_nan: bool = True
    allow_inf: bool = True
    max_shape: list[Annotated[int, Field(ge=0)]] | None = None
    """Largest size per dimension (batch included)."""
