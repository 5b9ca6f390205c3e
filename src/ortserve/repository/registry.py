"""The set of served models and versions: what serves a name now, swapped atomically.

The registry holds no loading logic (that is :mod:`ortserve.repository.manager`). It answers
"which version object serves this name now" and changes that answer by replacing a model's
``versions`` mapping with a new one in a single assignment on the event loop thread, so a
request resolves either the old set or the new one and never a half-updated one. A request
keeps the version object it resolved: once submitted it finishes there even if the name moves
on a moment later.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ortserve.config.model import ModelConfig
from ortserve.core.model import ModelState, Servable, ServedVersion
from ortserve.core.observer import SchedulerObserver
from ortserve.errors import ModelNotFound, ModelNotReady

__all__ = ["IndexState", "ModelEntry", "ModelRegistry", "VersionRecord"]

logger = logging.getLogger(__name__)

_SEE_LOG = " (the server log says why)"


def _unready(versions: dict[int, Servable]) -> str:
    """Why each loaded version is not ready (a fallback level's reason, or its state)."""
    reasons = []
    for number, served in sorted(versions.items()):
        found = served.fallback_parameters() if isinstance(served, ServedVersion) else {}
        level = found.get("fallback_level")
        why = f"fallback level {level}: {found.get('fallback_reason', '')}" if level else served.state.value
        reasons.append(f"version {number}: {why}")
    return "; ".join(reasons)


class IndexState(enum.Enum):
    """A version's state as Triton's repository index reports it."""

    READY = "READY"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(frozen=True, slots=True)
class VersionRecord:
    """What the repository index says about one version, and why."""

    state: IndexState
    reason: str = ""


@dataclass(slots=True)
class ModelEntry:
    """A model and its served versions; ``error`` says why it failed to load.

    ``versions`` is replaced, never mutated in place, once the entry is registered (see
    :meth:`ModelRegistry.publish`); ``records`` also keeps versions that failed, are loading
    or draining, for the repository index.
    """

    name: str
    versions: dict[int, Servable] = field(default_factory=dict)
    state: ModelState = ModelState.LOADING
    error: str | None = None
    load_seconds: dict[int, float] = field(default_factory=dict)
    """Load and warm-up time of each version."""
    records: dict[int, VersionRecord] = field(default_factory=dict)
    config: ModelConfig | None = None
    """The configuration the newest load used (the model configuration API reports it)."""

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

    def find(self, name: str) -> ModelEntry | None:
        return self._models.get(name)

    def add(self, entry: ModelEntry) -> None:
        """Register an entry built outside the repository (pipelines, tests)."""
        self._models[entry.name] = entry

    def ensure(self, name: str) -> ModelEntry:
        """The entry of ``name``, created (state LOADING) when there is none."""
        return self._models.setdefault(name, ModelEntry(name))

    def publish(self, name: str, number: int, served: Servable, load_seconds: float) -> Servable | None:
        """Serve ``served`` as version ``number`` from now on; returns the object it replaced.

        One assignment of a new mapping: requests resolving now see either the old set or the
        new one. The replaced version (if any) is the caller's to drain.
        """
        entry = self.ensure(name)
        replaced = entry.versions.get(number)
        entry.versions = {**entry.versions, number: served}
        entry.load_seconds[number] = load_seconds
        entry.records[number] = VersionRecord(IndexState.READY)
        entry.state = ModelState.READY
        entry.error = None
        return replaced

    def withdraw(self, name: str, number: int) -> Servable | None:
        """Stop resolving version ``number``; returns it (the caller drains it) or None."""
        entry = self._models.get(name)
        if entry is None or number not in entry.versions:
            return None
        served = entry.versions[number]
        entry.versions = {n: v for n, v in entry.versions.items() if n != number}
        entry.load_seconds.pop(number, None)
        return served

    def record(self, name: str, number: int, record: VersionRecord | None) -> None:
        """Set (or with None, forget) what the index says about a version not serving."""
        entry = self.ensure(name)
        if record is None:
            entry.records.pop(number, None)
        else:
            entry.records[number] = record

    def resolve(self, name: str, version: str | None) -> Servable:
        """The served version a request names (latest ready when it names none).

        Raises:
            ModelNotFound: no such model or version.
            ModelNotReady: the model exists but no version can take requests.
        """
        entry = self.entry(name)
        versions = entry.versions
        if version is None or version == "":
            served = entry.latest_ready()
            if served is None:
                if versions and entry.state is ModelState.READY:  # loaded, but none ready now
                    raise ModelNotReady(f"model {name!r} has no ready version: {_unready(versions)}")
                # The load error names files and ONNX Runtime internals: it went to the server
                # log at load time, and the client learns only the model's state.
                raise ModelNotReady(f"model {name!r} is {entry.state.value}{_SEE_LOG if entry.error else ''}")
            return served
        # A version is an int64: longer digit strings name none (and int() refuses > 4,300 digits).
        numeric = version.isascii() and version.isdigit() and len(version) <= 19
        found = versions.get(int(version)) if numeric else None
        if found is None:
            raise ModelNotFound(f"model {name!r} has no served version {version!r}")
        return found

    def served_versions(self, name: str) -> tuple[str, ...]:
        """Version numbers of a model, highest first (ModelNotFound if unknown)."""
        return tuple(str(v) for v in sorted(self.entry(name).versions, reverse=True))

    @property
    def all_ready(self) -> bool:
        """Loading finished and, with strict readiness, every model not unloaded on purpose is ready."""
        if not self.loading_done:
            return False
        return not self.strict or all(
            e.state in (ModelState.READY, ModelState.UNLOADED) for e in self._models.values()
        )

    async def unload_all(self, grace_s: float) -> None:
        """Drain and close every served version."""
        versions = [v for e in self._models.values() for v in e.versions.values()]
        for entry in self._models.values():
            entry.state = ModelState.UNLOADING
        await asyncio.gather(*(v.unload(grace_s) for v in versions))
