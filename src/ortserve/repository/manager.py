"""The lifecycle manager: loads, verifies, warms, swaps in, drains and releases model versions.

Every change of what the server serves goes through :meth:`LifecycleManager.sync`: a model
folder as observed (plus which of its versions are complete), brought to what the version
policy wants. A new or changed version is built and warmed up completely before the registry
publishes it; only then is the version it replaces (or the one the policy drops) withdrawn and
drained in a task the manager owns, so requests already queued there finish there and new ones
see the new version at once. A failed load leaves whatever served untouched, and the same files
are not retried until they change (or an explicit load asks). Changes to one model are
serialised by a per-model lock; different models load concurrently.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from ortserve.core.model import ModelState, Servable
from ortserve.errors import ModelLoadFailed, ModelNotFound, OrtServeError
from ortserve.repository.config_source import ModelSource, check_declared, read_model_source
from ortserve.repository.kinds import ModelKinds, standard_kinds
from ortserve.repository.layout import is_model_name, select_versions
from ortserve.repository.registry import IndexState, ModelRegistry, VersionRecord
from ortserve.repository.signature import TrustedKeys
from ortserve.repository.snapshot import Fingerprint, ModelSnapshot, snapshot_model, snapshot_repository
from ortserve.repository.version_build import build_version
from ortserve.settings import ServerSettings

__all__ = ["LifecycleEvents", "LifecycleManager", "LoadedModel"]

logger = logging.getLogger(__name__)


class LifecycleEvents(Protocol):
    """Where the manager reports transitions (metrics); every call is on the event loop."""

    def loaded(self, model: str, version: str, seconds: float) -> None: ...

    def load_failed(self, model: str, version: str) -> None: ...

    def unloaded(self, model: str, version: str) -> None: ...


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """What a model's served versions were built from, to tell when the files change."""

    config: Fingerprint
    override: ModelSource | None
    versions: dict[int, Fingerprint]
    source: ModelSource | None = None
    """The configuration read from ``config`` (kept so an unchanged file is not re-read, or
    warned about, at every poll)."""


class LifecycleManager:
    """Owns every load, swap and drain of one registry.

    Args:
        registry: where versions are published and withdrawn.
        settings: repository path, thread defaults, drain grace (``shutdown_grace_s``).
        events: transition counters (None: not reported).
        trusted: the keys versions must be signed with (None: signatures are not checked).
    """

    def __init__(
        self,
        registry: ModelRegistry,
        settings: ServerSettings,
        events: LifecycleEvents | None = None,
        trusted: TrustedKeys | None = None,
        kinds: ModelKinds | None = None,
    ) -> None:
        self.registry = registry
        self.kinds = standard_kinds() if kinds is None else kinds
        """The loader of each model kind beyond ONNX, and the pipelines' follower (the server's)."""
        self.trusted = trusted
        self.settings = settings
        self.events = events
        self.changed: list[Callable[[], None]] = []
        """Called after any change of what is served (pipeline routes follow it)."""
        self.released: list[Callable[[], None]] = []
        """Called after a drained version's session and threads are released (heap trimming)."""
        self.forgotten: list[Callable[[str, str], None]] = []
        """Called with (model, version) once a drained version is served no more, so what is
        kept per version (metric series, statistics) goes with it; an in-place reload of the
        same number keeps them."""
        self._locks: dict[str, asyncio.Lock] = {}
        self._loaded: dict[str, LoadedModel] = {}
        self._failed: dict[tuple[str, int], Fingerprint] = {}
        self._failed_config: dict[str, Fingerprint] = {}
        self._drains: set[asyncio.Task[None]] = set()
        self._retired: dict[tuple[str, int], str] = {}
        """Versions retired by the routing policy: not reloaded until an explicit load."""

    async def start(self, names: Collection[str] | None = None) -> list[ModelSnapshot]:
        """Load every model of the repository (or only ``names``; ``"*"`` means all).

        Returns the snapshots loaded from, the first observation of a watcher.
        """
        snapshots = await asyncio.to_thread(snapshot_repository, self.settings.model_repository)
        wanted = snapshots
        if names is not None and "*" not in names:
            wanted = [s for s in snapshots if s.name in names]
            for missing in sorted(set(names) - {s.name for s in snapshots}):
                logger.error("--load-model %s: no such model folder in the repository", missing)
        for snapshot in wanted:
            self.registry.ensure(snapshot.name)
        await asyncio.gather(*(self.sync(s) for s in wanted))
        self.registry.loading_done = True
        return snapshots

    async def load(self, name: str, override: ModelSource | None = None) -> None:
        """Load or reload one model from its folder now (model control ``load``).

        Every version the policy wants is rebuilt, even with unchanged files, as Triton does.

        Raises:
            ModelNotFound: no such model folder.
            ModelLoadFailed: a version the policy wants failed to load (whatever served before
                keeps serving; the reason is also in the index).
        """
        folder = self.settings.model_repository / name
        if not is_model_name(name) or not folder.is_dir():
            raise ModelNotFound(f"no model folder {name!r} in the repository")
        snapshot = await asyncio.to_thread(snapshot_model, folder)
        failures = await self.sync(snapshot, override=override, force=True)
        if not failures and not self.registry.entry(name).versions:  # a load that loads nothing
            failures = [self.registry.entry(name).error or "no version folder matches the version policy"]
        if failures:
            serving = self.registry.entry(name).versions
            kept = f"; still serving version(s) {sorted(serving)}" if serving else ""
            raise ModelLoadFailed(f"failed to load model {name!r}: {'; '.join(failures)}{kept}")

    async def unload(self, name: str, dependents: bool = False) -> None:
        """Stop serving every version of ``name``; they drain in the background.

        Args:
            dependents: also unload the pipeline that wraps the model.

        Raises:
            ModelNotFound: the model is not known to the server.
        """
        self.registry.entry(name)
        async with self._lock(name):
            self._withdraw_all(name, "unloaded by request")
            self._loaded.pop(name, None)
        pipelines = self.kinds.pipelines
        if dependents and pipelines is not None and self.registry.find(pipelines.name_of(name)) is not None:
            await self.unload(pipelines.name_of(name))
        self._notify()

    async def sync(
        self,
        snapshot: ModelSnapshot,
        complete: Collection[int] | None = None,
        override: ModelSource | None = None,
        force: bool = False,
    ) -> list[str]:
        """Bring one model to what its folder and version policy say now.

        Args:
            snapshot: the model folder as observed.
            complete: the versions whose files are complete (None: all of them).
            override: a configuration given with a load request, used instead of the files.
            force: rebuild every wanted version and retry failed ones.

        Returns:
            Why each load that failed failed (empty when all went well).
        """
        async with self._lock(snapshot.name):
            failures = await self._sync(snapshot, complete, override, force)
        self._notify()
        return failures

    async def retire(self, name: str, number: int, reason: str) -> None:
        """Stop serving one version for good (automatic retirement); it drains in the background
        and the index keeps it as UNAVAILABLE with ``reason``. An explicit load brings it back."""
        async with self._lock(name):
            self._retired[(name, number)] = reason
            self._retire(name, number, reason)
        self._notify()

    async def remove(self, name: str) -> None:
        """The model folder is gone: stop serving it."""
        async with self._lock(name):
            self._withdraw_all(name, "its folder was removed from the repository")
            self._loaded.pop(name, None)
        self._notify()

    async def close(self, grace_s: float) -> None:
        """Drain everything still served and wait for drains already under way."""
        await self.registry.unload_all(grace_s)
        if self._drains:
            await asyncio.gather(*self._drains, return_exceptions=True)

    async def _sync(
        self,
        snapshot: ModelSnapshot,
        complete: Collection[int] | None,
        override: ModelSource | None,
        force: bool,
    ) -> list[str]:
        """Returns the reasons of the loads that failed."""
        name = snapshot.name
        before = self._loaded.get(name)
        if override is None and before is not None:
            override = before.override
        if force:
            self._forget_failures(name)
        try:
            if override is not None:
                source = override
            elif before is not None and before.source is not None and before.config == snapshot.config:
                source = before.source
            else:
                source = await asyncio.to_thread(read_model_source, snapshot.folder)
        except OrtServeError as exc:
            self._model_failed(name, snapshot, exc.message)
            return [exc.message]
        config = source.config
        rebuild_all = before is None or before.config != snapshot.config or force
        filename = config.default_model_filename
        candidates = {
            n: v.folder
            for n, v in snapshot.versions.items()
            if (complete is None or n in complete) and v.holds(filename)
        }
        entry = self.registry.ensure(name)
        built = dict(before.versions) if before else {}
        attempted: set[int] = set()
        failures: list[str] = []
        failed_serving: set[int] = set()
        if not candidates and snapshot.versions and complete is None:
            # A load naming a model file no version has would load nothing: say so, and keep
            # what serves with the configuration it was built from.
            failures.append(f"no version folder holds {filename!r}")
            failed_serving.update(entry.versions)
        while True:
            usable = {
                n: p
                for n, p in candidates.items()
                if self._failed.get((name, n)) != snapshot.versions[n].files
                and (name, n) not in self._retired
            }
            wanted = select_versions(usable, config.version_policy)
            stale = [
                n
                for n in wanted
                if n not in attempted
                and (rebuild_all or built.get(n) != snapshot.versions[n].files or n not in entry.versions)
            ]
            if not stale:
                break
            for number in stale:
                attempted.add(number)
                reason = await self._load_version(snapshot, number, source)
                if reason is None:
                    built[number] = snapshot.versions[number].files
                else:
                    failures.append(f"version {number}: {reason}")
                    if number in entry.versions:
                        # Its files serve: what failed is this load's rebuild (a bad config in
                        # the request, say), so the version keeps serving and is not marked
                        # broken, or the next pass would withdraw it.
                        failed_serving.add(number)
                        self._failed.pop((name, number), None)
        # A serving version whose folder is being re-copied keeps serving until it settles.
        keep = set(wanted) | {n for n in entry.versions if n in snapshot.versions and n not in candidates}
        for number in sorted(set(entry.versions) - keep):
            self._retire(name, number, "the version policy no longer selects it")
        config_seen, kept_override, kept_source = (
            snapshot.config,
            override,
            None if override is not None else source,
        )
        if failed_serving and before is not None:  # what serves was built by the load before
            config_seen, kept_override, kept_source = before.config, before.override, before.source
        self._loaded[name] = LoadedModel(
            config_seen, kept_override, {n: built[n] for n in entry.versions if n in built}, kept_source
        )
        if not entry.versions:
            reason = "; ".join(failures) or "no complete version folder matches the version policy"
            self._model_failed(name, snapshot, reason)
        elif config.pipeline is not None and (pipelines := self.kinds.pipelines) is not None:
            newest = max(entry.versions)
            pipeline = self.registry.find(pipelines.name_of(name))
            if newest in attempted or pipeline is None or newest not in pipeline.versions:
                folder = snapshot.versions[newest].folder
                await pipelines.follow(
                    self.registry, name, newest, folder, config.pipeline, self._drain, self._retire
                )
        return failures

    async def _load_version(self, snapshot: ModelSnapshot, number: int, source: ModelSource) -> str | None:
        """Build, warm up and publish one version; returns why it failed, None on success."""
        name, files, config = snapshot.name, snapshot.versions[number].files, source.config
        if number not in self.registry.ensure(name).versions:
            self.registry.record(name, number, VersionRecord(IndexState.LOADING))
        logger.info("model %s version %d: loading", name, number)
        started = time.perf_counter()
        observer = None if self.registry.observers is None else self.registry.observers(name, str(number))
        try:
            served = await build_version(
                snapshot, number, source, self.kinds, self.settings, self.trusted, observer
            )
        except OrtServeError as exc:
            return self._version_failed(name, number, files, exc.message)
        except Exception as exc:  # ONNX Runtime's own load errors: logged, this version fails alone
            logger.debug("load of %s version %d failed", name, number, exc_info=exc)
            return self._version_failed(name, number, files, f"{type(exc).__name__}: {exc}")
        try:
            check_declared(source, served.info)
        except OrtServeError as exc:
            await served.unload(0.0)
            return self._version_failed(name, number, files, exc.message)
        seconds = time.perf_counter() - started
        replaced = self.registry.publish(name, number, served, seconds)
        self.registry.ensure(name).config = config
        self._failed.pop((name, number), None)
        logger.info("model %s version %d: ready (loaded and warmed up in %.3f s)", name, number, seconds)
        if self.events is not None:
            self.events.loaded(name, str(number), seconds)
        if replaced is not None:
            self._drain(name, number, replaced, "replaced by a reload of the same version")
        return None

    def _version_failed(self, name: str, number: int, files: Fingerprint, reason: str) -> str:
        self._failed[(name, number)] = files
        entry = self.registry.ensure(name)
        if number not in entry.versions:
            self.registry.record(name, number, VersionRecord(IndexState.UNAVAILABLE, reason))
        serving = "; the version already serving keeps serving" if number in entry.versions else ""
        logger.error("model %s version %d failed to load: %s%s", name, number, reason, serving)
        if self.events is not None:
            self.events.load_failed(name, str(number))
        return reason

    def _model_failed(self, name: str, snapshot: ModelSnapshot, reason: str) -> None:
        entry = self.registry.ensure(name)
        if entry.versions:
            if self._failed_config.get(name) != snapshot.config:
                logger.error("model %s: %s; the versions serving keep serving", name, reason)
                if self.events is not None:
                    self.events.load_failed(name, "")
            self._failed_config[name] = snapshot.config
            return
        entry.state = ModelState.FAILED
        if entry.error != reason:
            logger.error("model %s failed to load: %s", name, reason)
        entry.error = reason

    def _forget_failures(self, name: str) -> None:
        self._failed = {key: files for key, files in self._failed.items() if key[0] != name}
        self._retired = {key: why for key, why in self._retired.items() if key[0] != name}
        self._failed_config.pop(name, None)

    def _withdraw_all(self, name: str, reason: str) -> None:
        entry = self.registry.entry(name)
        for number in sorted(entry.versions):
            self._retire(name, number, reason)
        entry.records = {}
        entry.state = ModelState.UNLOADED
        entry.error = reason

    def _retire(self, name: str, number: int, reason: str) -> None:
        served = self.registry.withdraw(name, number)
        if served is not None:
            self._drain(name, number, served, reason)

    def _drain(self, name: str, number: int, served: Servable, reason: str) -> None:
        """Drain and release ``served`` in a task this manager owns (awaited by ``close``)."""
        entry = self.registry.ensure(name)
        if number not in entry.versions:
            self.registry.record(name, number, VersionRecord(IndexState.UNLOADING, reason))
        logger.info("model %s version %d: draining (%s)", name, number, reason)
        task = asyncio.get_running_loop().create_task(self._release(name, number, served))
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def _release(self, name: str, number: int, served: Servable) -> None:
        await served.unload(self.settings.shutdown_grace_s)
        entry = self.registry.ensure(name)
        retired = self._retired.get((name, number))
        if number not in entry.versions and retired is not None:
            self.registry.record(name, number, VersionRecord(IndexState.UNAVAILABLE, retired))
        elif number not in entry.versions and entry.records.get(
            number, VersionRecord(IndexState.READY)
        ).state is (IndexState.UNLOADING):
            self.registry.record(name, number, None)
        logger.info("model %s version %d: unloaded", name, number)
        for callback in self.released:
            callback()
        if number not in entry.versions:
            for forget in self.forgotten:
                forget(name, str(number))
        if self.events is not None:
            self.events.unloaded(name, str(number))

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def _notify(self) -> None:
        for callback in self.changed:
            callback()
