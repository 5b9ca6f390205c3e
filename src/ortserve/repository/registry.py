"""The set of served models and versions: loading, lookup by name and version, unloading."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ortserve.core.model import ModelState, Servable
from ortserve.core.observer import SchedulerObserver
from ortserve.errors import ModelNotFound, ModelNotReady, OrtServeError
from ortserve.pipeline.contract import PipelineContext
from ortserve.pipeline.runtime import load_pipeline, pipeline_model_name
from ortserve.repository.config import load_model_config
from ortserve.repository.layout import ModelDir, scan_repository, select_versions
from ortserve.repository.loader import load_version
from ortserve.settings import ServerSettings

__all__ = ["ModelEntry", "ModelRegistry"]

logger = logging.getLogger(__name__)

_SEE_LOG = " (the server log says why)"


@dataclass(slots=True)
class ModelEntry:
    """A model and its served versions; ``error`` says why it failed to load."""

    name: str
    versions: dict[int, Servable] = field(default_factory=dict)
    state: ModelState = ModelState.LOADING
    error: str | None = None
    load_seconds: dict[int, float] = field(default_factory=dict)
    """Load and warm-up time of each version."""

    def latest_ready(self) -> Servable | None:
        for number in sorted(self.versions, reverse=True):
            if self.versions[number].ready:
                return self.versions[number]
        return None


class ModelRegistry:
    """Holds every model entry; the DataPlane resolves requests through it."""

    def __init__(
        self, strict: bool = True, observers: Callable[[str, str], SchedulerObserver] | None = None
    ) -> None:
        self._models: dict[str, ModelEntry] = {}
        self.loading_done = False
        self.strict = strict
        self.observers = observers
        """Gives each version loaded its scheduler observer (metrics, statistics, tracing)."""

    def names(self) -> list[str]:
        return sorted(self._models)

    def entries(self) -> list[ModelEntry]:
        return [self._models[name] for name in sorted(self._models)]

    def entry(self, name: str) -> ModelEntry:
        """Raises: ModelNotFound."""
        found = self._models.get(name)
        if found is None:
            raise ModelNotFound(f"unknown model {name!r}")
        return found

    def add(self, entry: ModelEntry) -> None:
        """Register an entry built outside the repository (pipelines, tests)."""
        self._models[entry.name] = entry

    def resolve(self, name: str, version: str | None) -> Servable:
        """The served version a request names (latest ready when it names none).

        Raises:
            ModelNotFound: no such model or version.
            ModelNotReady: the model exists but no version can take requests.
        """
        entry = self.entry(name)
        if version is None or version == "":
            served = entry.latest_ready()
            if served is None:
                # The load error names files and ONNX Runtime internals: it went to the server
                # log at load time, and the client learns only the model's state.
                raise ModelNotReady(f"model {name!r} is {entry.state.value}{_SEE_LOG if entry.error else ''}")
            return served
        if not version.isdigit() or int(version) not in entry.versions:
            raise ModelNotFound(f"model {name!r} has no served version {version!r}")
        return entry.versions[int(version)]

    def served_versions(self, name: str) -> tuple[str, ...]:
        """Version numbers of a model, highest first (ModelNotFound if unknown)."""
        return tuple(str(v) for v in sorted(self.entry(name).versions, reverse=True))

    @property
    def all_ready(self) -> bool:
        """Loading finished and, with strict readiness, every model is ready."""
        if not self.loading_done:
            return False
        return not self.strict or all(e.state is ModelState.READY for e in self._models.values())

    async def load_repository(self, settings: ServerSettings) -> None:
        """Load every model in the repository; one model's failure never stops the others."""
        dirs = scan_repository(settings.model_repository)
        for model_dir in dirs:
            self._models.setdefault(model_dir.name, ModelEntry(model_dir.name))
        await asyncio.gather(*(self._load_model(d, settings) for d in dirs))
        self.loading_done = True

    async def _load_model(self, model_dir: ModelDir, settings: ServerSettings) -> None:
        entry = self._models[model_dir.name]
        try:
            config = load_model_config(model_dir.path)
            wanted = select_versions(model_dir.versions, config.version_policy)
            if not wanted:
                raise ModelNotFound("no version folder with a model.onnx matches the version policy")
            for number in wanted:
                started = time.perf_counter()
                observer = None if self.observers is None else self.observers(model_dir.name, str(number))
                entry.versions[number] = await load_version(
                    model_dir.name, number, model_dir.versions[number], config, settings, observer
                )
                entry.load_seconds[number] = time.perf_counter() - started
        except OrtServeError as exc:
            self._fail(entry, exc.message)
        except Exception as exc:  # ONNX Runtime's own load errors: logged, the model fails alone
            logger.debug("load of %s failed", model_dir.name, exc_info=exc)
            self._fail(entry, f"{type(exc).__name__}: {exc}")
        else:
            entry.state = ModelState.READY
            if config.pipeline is not None:
                await self._load_pipeline(model_dir, max(entry.versions), config.pipeline)

    async def _load_pipeline(self, model_dir: ModelDir, number: int, spec: str) -> None:
        """Serve the pipeline that wraps a loaded model as its own entry; it fails alone."""
        entry = ModelEntry(pipeline_model_name(model_dir.name))
        self.add(entry)
        context = PipelineContext(model_dir.name, str(number), model_dir.versions[number].parent)
        try:
            entry.versions[number] = await load_pipeline(spec, context, self)
        except OrtServeError as exc:
            self._fail(entry, exc.message)
        except Exception as exc:  # a plug-in's own errors: logged, the pipeline fails alone
            logger.debug("load of pipeline %s failed", entry.name, exc_info=exc)
            self._fail(entry, f"{type(exc).__name__}: {exc}")
        else:
            entry.state = ModelState.READY

    @staticmethod
    def _fail(entry: ModelEntry, reason: str) -> None:
        entry.state = ModelState.FAILED
        entry.error = reason
        logger.error("model %s failed to load: %s", entry.name, reason)

    async def unload_all(self, grace_s: float) -> None:
        """Drain and close every served version."""
        versions = [v for e in self._models.values() for v in e.versions.values()]
        await asyncio.gather(*(v.unload(grace_s) for v in versions))
        for entry in self._models.values():
            entry.state = ModelState.UNLOADING
