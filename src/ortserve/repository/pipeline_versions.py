"""The pipeline that wraps a model follows the model's newest version (see ``pipeline:``).

Split from the lifecycle manager, which calls :func:`follow_model` under the model's lock
after each sync; draining and retiring stay the manager's, passed in.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from ortserve.core.model import ModelState, Servable
from ortserve.errors import OrtServeError
from ortserve.pipeline.contract import PipelineContext
from ortserve.pipeline.runtime import load_pipeline, pipeline_model_name
from ortserve.repository.registry import ModelRegistry

__all__ = ["follow_model"]

logger = logging.getLogger(__name__)

Drain = Callable[[str, int, Servable, str], None]
Retire = Callable[[str, int, str], None]


async def follow_model(
    registry: ModelRegistry,
    name: str,
    number: int,
    folder: Path,
    spec: str,
    drain: Drain,
    retire: Retire,
) -> None:
    """Serve the pipeline ``spec`` wrapping model ``name`` on its version ``number`` (found in
    ``folder``); the versions it served before drain. It fails alone: the model serves on."""
    pipeline_name = pipeline_model_name(name)
    entry = registry.ensure(pipeline_name)
    context = PipelineContext(name, str(number), folder)
    started = time.perf_counter()
    try:
        version = await load_pipeline(spec, context, registry)
    except OrtServeError as exc:
        _failed(registry, pipeline_name, exc.message)
        return
    except Exception as exc:  # a plug-in's own errors: logged, the pipeline fails alone
        logger.debug("load of pipeline %s failed", pipeline_name, exc_info=exc)
        _failed(registry, pipeline_name, f"{type(exc).__name__}: {exc}")
        return
    replaced = registry.publish(pipeline_name, number, version, time.perf_counter() - started)
    if replaced is not None:
        drain(pipeline_name, number, replaced, "its model was reloaded")
    for old in sorted(set(entry.versions) - {number}):
        retire(pipeline_name, old, "its model moved to a newer version")


def _failed(registry: ModelRegistry, name: str, reason: str) -> None:
    entry = registry.ensure(name)
    logger.error("pipeline %s failed to load: %s", name, reason)
    if not entry.versions:
        entry.state = ModelState.FAILED
        entry.error = reason
