"""Testing pipelines without a socket: a model repository loaded in-process, pipelines called
directly with the same code paths the server's routes use."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import orjson

from ortserve.errors import ModelNotFound
from ortserve.pipeline.contract import JsonObject
from ortserve.pipeline.runtime import PipelineVersion, pipeline_model_name
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.settings import ServerSettings

__all__ = ["PipelineHarness", "pipeline_harness"]


class PipelineHarness:
    """Calls the pipelines of a loaded registry; errors raise as the ortserve error tree.

    Args:
        registry: a registry whose repository is loaded.
    """

    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry

    def pipeline(self, model: str) -> PipelineVersion:
        """The pipeline wrapping repository model ``model``.

        Raises:
            ModelNotFound, ModelNotReady.
        """
        served = self.registry.resolve(pipeline_model_name(model), None)
        if not isinstance(served, PipelineVersion):
            raise ModelNotFound(f"model {model!r} has no pipeline")
        return served

    async def call(self, model: str, document: object) -> JsonObject:
        """Run one decoded JSON document through the pipeline wrapping ``model``."""
        return await self.pipeline(model).pipeline.run(document)

    async def post(self, route: str, body: bytes) -> JsonObject:
        """What ``POST route`` with ``body`` answers (decoded), without HTTP.

        Raises:
            ModelNotFound: no pipeline declares ``route``; the pipeline's own errors.
        """
        for entry in self.registry.entries():
            for version in entry.versions.values():
                if isinstance(version, PipelineVersion) and version.route == route:
                    answer: JsonObject = orjson.loads(await version.handle_body(body))
                    return answer
        raise ModelNotFound(f"no pipeline serves {route}")


@contextlib.asynccontextmanager
async def pipeline_harness(
    model_repository: Path,
    intra_op_threads: int = 1,
) -> AsyncIterator[PipelineHarness]:
    """Load ``model_repository`` in this process and yield a harness; unload on exit.

    Args:
        model_repository: a Triton-layout repository whose configs name pipelines.
        intra_op_threads: ONNX Runtime threads per session (1 keeps tests light).
    """
    registry = ModelRegistry()
    manager = LifecycleManager(registry, ServerSettings(model_repository, intra_op_threads=intra_op_threads))
    await manager.start()
    try:
        yield PipelineHarness(registry)
    finally:
        await manager.close(5.0)
