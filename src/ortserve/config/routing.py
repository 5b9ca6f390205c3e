"""The ``routing:`` section of a model's ``config.yaml`` (and the control endpoint's body).

Pydantic stays here, at the edge: :func:`policy_from_config` turns a validated section into the
frozen :class:`~ortserve.routing.policy.Policy` the request path reads.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

__all__ = [
    "GuardsConfig",
    "OverrideConfig",
    "RetireConfig",
    "RolloutConfig",
    "RoutingConfig",
    "ShadowConfig",
    "StickyConfig",
    "parse_duration",
]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_VERSION = r"^[1-9][0-9]{0,9}$"


def parse_duration(value: object) -> float:
    """Seconds from a number or a string such as ``"500ms"``, ``"10s"``, ``"10m"``, ``"3d"``.

    Raises:
        ValueError: anything else, or a value that is not positive.
    """
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '10m'")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    else:
        raise ValueError(f"{value!r} is not a duration (a number of seconds, or e.g. '500ms', '10m', '3d')")
    if not seconds > 0:
        raise ValueError("a duration must be positive")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]
Version = Annotated[
    str, BeforeValidator(lambda v: str(v) if isinstance(v, int) else v), Field(pattern=_VERSION)
]
HeaderName = Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,64}$")]
ParameterName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OverrideConfig(_Strict):
    """Where a client may force a version: a header or a request parameter (``ab_tag``)."""

    header: HeaderName | None = "X-Model-Version"
    parameter: ParameterName | None = "ab_tag"
    variants: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")], Version] = Field(
        default_factory=dict
    )
    """Named variants (``{"fast": "2"}``); a value naming no variant must be a served version."""


class StickyConfig(_Strict):
    """Where the sticky key comes from, tried in this order: header, parameter, body field."""

    header: HeaderName | None = "X-User-ID"
    parameter: ParameterName | None = "user_id"
    field: ParameterName | None = "user_id"
    """A top-level field of a pipeline route's JSON body."""


class ShadowConfig(_Strict):
    """A sampled copy of requests also runs on ``version``; its outputs are compared."""

    version: Version
    fraction: Annotated[float, Field(gt=0, le=1)] = 0.1
    max_inflight: Annotated[int, Field(ge=1, le=4096)] = 128
    """Shadow requests running at once; beyond it a copy is dropped (counted)."""
    timeout: Duration = 1.0
    """A shadow request still queued after this is dropped by its scheduler (504, counted)."""
    batch: Annotated[int, Field(ge=1, le=1024)] = 32
    """Rows of copies gathered into one shadow request (1: each copy runs alone)."""
    max_delay: Duration = 0.1
    """Longest a copy waits for company before its shadow request is sent."""
    capture_dir: Annotated[str, Field(min_length=1)] | None = None
    """Write the most divergent requests here in the capture format (``ortserve replay``)."""
    capture_top: Annotated[int, Field(ge=1, le=10_000)] = 20
    """How many of the most divergent requests are kept (written as they enter the top)."""


class GuardsConfig(_Strict):
    """Limits a rollout candidate must stay within over each step's window."""

    max_error_rate: Annotated[float, Field(ge=0, le=1)] | None = 0.01
    max_p99_ratio: Annotated[float, Field(gt=0)] | None = 1.5
    """The candidate's p99 latency over the baseline's, same window."""
    max_divergence: Annotated[float, Field(ge=0)] | None = None
    """The 99th percentile of the largest absolute output difference of compared pairs."""
    compare_fraction: Annotated[float, Field(gt=0, le=1)] = 0.1
    """With ``max_divergence``: the share of baseline requests also run on the candidate."""


class RolloutConfig(_Strict):
    """Gray release: the candidate's share advances one step per interval while guards hold."""

    candidate: Version
    baseline: Version
    steps: Annotated[list[Annotated[float, Field(gt=0, le=100)]], Field(min_length=1, max_length=100)] = (
        Field(default_factory=lambda: [5.0, 25.0, 50.0, 100.0])
    )
    interval: Duration = 600.0
    min_requests: Annotated[int, Field(ge=1)] = 500
    guards: GuardsConfig = Field(default_factory=GuardsConfig)

    @model_validator(mode="after")
    def _check(self) -> RolloutConfig:
        if self.candidate == self.baseline:
            raise ValueError("rollout candidate and baseline must differ")
        if any(b <= a for a, b in zip(self.steps, self.steps[1:])):
            raise ValueError("rollout steps must increase")
        return self


class RetireConfig(_Strict):
    """Automatic retirement: idle or failing versions become deprecated and are unloaded."""

    idle: Duration | None = None
    """No request for this long (the hotword seed: 3d)."""
    max_error_rate: Annotated[float, Field(gt=0, le=1)] | None = None
    window: Duration = 3600.0
    min_requests: Annotated[int, Field(ge=1)] = 100


class RoutingConfig(_Strict):
    """Per-model traffic policy. Explicit versions always win; then override, rollout or split,
    then the newest version serving traffic."""

    override: OverrideConfig | None = Field(default_factory=OverrideConfig)
    split: dict[Version, Annotated[float, Field(ge=0)]] | None = None
    sticky: StickyConfig | None = Field(default_factory=StickyConfig)
    shadow: ShadowConfig | None = None
    rollout: RolloutConfig | None = None
    deprecated: list[Version] = Field(default_factory=list)
    """Versions that get no default traffic (still reachable by explicit version)."""
    retire: RetireConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> RoutingConfig:
        if self.split is not None and not sum(self.split.values()) > 0:
            raise ValueError("split weights must not all be zero")
        if self.rollout is not None and self.split is not None:
            raise ValueError("give either split or rollout: a rollout sets the split itself")
        return self
