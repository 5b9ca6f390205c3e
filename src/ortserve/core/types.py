"""Transport-free request, response and metadata types shared by every layer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = [
    "Degraded",
    "InferInput",
    "InferOutput",
    "InferRequest",
    "InferResponse",
    "ModelMetadata",
    "ParameterValue",
    "Parameters",
    "RequestedOutput",
    "ServerMetadata",
    "TensorSpec",
]

ParameterValue = bool | int | float | str
Parameters = dict[str, ParameterValue]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One model input or output as the graph declares it; -1 marks a dynamic dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(slots=True)  # per request: frozen dataclasses cost ~1 µs more to build
class InferInput:
    """A decoded input tensor: ``data`` already has ``shape`` and the datatype's dtype."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: npt.NDArray[np.generic]
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)  # per request: frozen dataclasses cost ~1 µs more to build
class RequestedOutput:
    """An output the client asked for; ``parameters`` carry transport hints (binary_data)."""

    name: str
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    """One inference request, as both transports hand it to the DataPlane.

    ``timeout_s`` is the time the client allows, counted from admission, set by the transport
    from ``parameters.timeout`` (microseconds, Triton's schedule-policy extension) or a gRPC
    deadline; ``None`` means the model's ``default_timeout_ms`` applies. ``priority`` 0 means
    the model's default lane; lower positive numbers are served first.
    """

    model_name: str
    inputs: list[InferInput]
    model_version: str | None = None
    id: str | None = None
    outputs: list[RequestedOutput] | None = None
    parameters: Parameters = field(default_factory=dict)
    priority: int = 0
    timeout_s: float | None = None
    headers: Callable[[str], str | None] | None = None
    """The transport's header (gRPC metadata) lookup by lowercase name, for routing."""
    tenant: str | None = None
    """Who sent it, when tenancy is on (the request edge's gate names it): the scheduler
    shares a model's queue fairly between tenants. None: tenancy off."""


@dataclass(slots=True)  # per request: frozen dataclasses cost ~1 µs more to build
class InferOutput:
    """An output tensor; ``data`` may be a view into a batch result (never copied to split)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: npt.NDArray[np.generic]
    parameters: Parameters = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Degraded:
    """An answer from a fallback level (docs/resilience.md): the transports mark the response
    (``X-Ortserve-Degraded`` header, gRPC trailing metadata) and HTTP answers ``http_status``."""

    level: int
    reason: str
    http_status: int = 200

    @property
    def header(self) -> str:
        """The mark's text for a header or metadata value (``level=2; reason=...``): printable
        ASCII on one line, at most 256 characters."""
        text = " ".join(f"level={self.level}; reason={self.reason}".split())
        return text.encode("ascii", "replace").decode("ascii")[:256]


@dataclass(slots=True)  # per request: frozen dataclasses cost ~1 µs more to build
class InferResponse:
    """The answer to one request: only that request's rows, in the order asked for."""

    model_name: str
    model_version: str
    outputs: list[InferOutput]
    id: str | None = None
    parameters: Parameters = field(default_factory=dict)
    degraded: Degraded | None = None
    """Set when a fallback level answered; ``parameters`` then carry it too."""


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """What ``GET /v2/models/{m}`` returns: the graph's inputs and outputs."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    roles: tuple[tuple[str, str], ...] = ()
    """(version, traffic role) when the model has a routing policy (HTTP ``parameters.roles``)."""
    parameters: Parameters = field(default_factory=dict)
    """Extra facts (the fallback level and its reason while degraded)."""


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    """What ``GET /v2`` returns."""

    name: str
    version: str
    extensions: tuple[str, ...]
