"""The one API both transports call: health, metadata and inference."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol

from ortserve.core.cuda_windows import link_outputs
from ortserve.core.model import Servable, ServedVersion
from ortserve.core.shared_memory import SharedMemoryRegistry, deliver_to_shared_memory
from ortserve.core.types import InferRequest, InferResponse, ModelMetadata, ServerMetadata
from ortserve.errors import ModelNotReady, OrtServeError

__all__ = ["DataPlane", "ModelResolver", "Router"]


class ModelResolver(Protocol):
    """Finds the served version a request names (the model registry implements it)."""

    def resolve(self, name: str, version: str | None) -> Servable: ...

    def served_versions(self, name: str) -> tuple[str, ...]: ...

    @property
    def all_ready(self) -> bool: ...


class Router(Protocol):
    """A model's traffic policy (ortserve.routing implements it): picks the version, submits."""

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]: ...

    def admission_version(self) -> str | None: ...

    def version_roles(self) -> dict[str, str]: ...


class DataPlane:
    """Transport-free server behaviour; HTTP and gRPC handlers only decode, call, encode.

    Args:
        resolver: where models are looked up.
        metadata: what ``GET /v2`` reports.
        shared_memory: the system shared-memory regions both transports resolve tensors in.
    """

    def __init__(
        self,
        resolver: ModelResolver,
        metadata: ServerMetadata,
        shared_memory: SharedMemoryRegistry | None = None,
    ) -> None:
        self._resolver = resolver
        self._metadata = metadata
        self._draining = False
        self.shared_memory = shared_memory or SharedMemoryRegistry()
        self.routers: Mapping[str, Router] = {}
        """Models with a routing policy; every other model serves its newest ready version."""

    def live(self) -> bool:
        """The process is up and serving its transports."""
        return True

    def ready(self) -> bool:
        """Every model is loaded and ready, and the server is not draining."""
        return not self._draining and self._resolver.all_ready

    def start_draining(self) -> None:
        """Readiness goes false so load balancers stop sending, while in-flight work ends."""
        self._draining = True

    def server_metadata(self) -> ServerMetadata:
        return self._metadata

    def model_metadata(self, name: str, version: str | None = None) -> ModelMetadata:
        """Raises: ModelNotFound, ModelNotReady."""
        served = self._resolver.resolve(name, version)
        info = served.info
        versions = (info.version,) if version else self._resolver.served_versions(name)
        router = self.routers.get(name)
        roles = tuple(sorted(router.version_roles().items())) if router is not None else ()
        extra = served.fallback_parameters() if isinstance(served, ServedVersion) else {}
        return ModelMetadata(info.name, versions, info.platform, info.inputs, info.outputs, roles, extra)

    def resolve(self, name: str, version: str | None = None) -> Servable:
        """The servable answering ``name`` (its newest ready version, or ``version``) now.

        Raises: ModelNotFound, ModelNotReady.
        """
        return self._resolver.resolve(name, version)

    def model_ready(self, name: str, version: str | None = None) -> bool:
        """Raises: ModelNotFound for an unknown model or version."""
        try:
            return self._resolver.resolve(name, version).ready
        except ModelNotReady:
            return False

    def refusal(
        self,
        name: str,
        version: str | None,
        priority: int = 0,
        tenant_of: Callable[[], str | None] | None = None,
    ) -> OrtServeError | None:
        """The error an infer request for this model would get now from its name alone, before
        it is decoded, or None: ModelNotFound, ModelNotReady, Overloaded, InvalidInput (a
        priority out of range).

        The transports call it with the path (HTTP) or the message's first fields (gRPC), so
        a refusal under overload costs a small fraction of a served request; the edges answer
        only the load refusals (Overloaded, ModelNotReady) themselves. The error may be shared
        by many requests: answer with it, never raise it (raise a copy).
        """
        if not version and (router := self.routers.get(name)) is not None:
            version = router.admission_version()
        try:
            served = self._resolver.resolve(name, version)
        except OrtServeError as unresolved:
            return unresolved
        if tenant_of is not None and isinstance(served, ServedVersion):  # its share of the queue
            return served.refusal(priority, tenant_of)
        return served.refusal(priority)

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        """Queue one request; errors found before queueing are raised at once.

        Raises:
            ModelNotFound, ModelNotReady, InvalidInput, Overloaded; the future may fail with
            DeadlineExceeded, ModelNotReady or InferenceError.
        """
        router = self.routers.get(request.model_name)
        served = self._resolver.resolve(request.model_name, request.model_version) if router is None else None
        outputs = request.outputs
        targets = self.shared_memory.output_targets(outputs) if outputs else None
        if targets is not None and router is None:  # CUDA windows a lone run can bind (core/binding.py)
            link_outputs(request.inputs, targets)
        pending = router.submit(request) if router is not None else _submit(served, request)
        return pending if targets is None else deliver_to_shared_memory(pending, targets)

    async def infer(self, request: InferRequest) -> InferResponse:
        """Run one request through its model's scheduler and wait for the answer.

        Raises:
            ModelNotFound, ModelNotReady, InvalidInput, Overloaded, DeadlineExceeded,
            InferenceError.
        """
        return await self.submit(request)


def _submit(served: Servable | None, request: InferRequest) -> asyncio.Future[InferResponse]:
    assert served is not None  # resolved whenever no router took the request
    return served.submit(request)
