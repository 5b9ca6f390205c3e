"""Every model's router: installed from ``config.yaml``, replaced through the control API,
read by the routing ``GET``, the repository index, metrics, and the retirement sweep."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from ortserve.capture import Capture
from ortserve.config.model import ModelConfig
from ortserve.config.routing import RoutingConfig
from ortserve.core.dataplane import ModelResolver
from ortserve.core.model import Servable
from ortserve.errors import InvalidInput
from ortserve.routing.buckets import BUCKETS
from ortserve.routing.keeper import DivergentPairs
from ortserve.routing.policy import Policy
from ortserve.routing.retirement import ErrorWindow, due_for_retirement
from ortserve.routing.roles import Role
from ortserve.routing.router import ModelRouter, RouterEnvironment
from ortserve.routing.snapshot import router_snapshot

__all__ = ["RoutingTable"]

logger = logging.getLogger(__name__)

Retire = Callable[[str, int, str], Awaitable[None]]


class ModelEntry(Protocol):
    """What the routing table reads of a served model (``repository.registry.ModelEntry``)."""

    @property
    def name(self) -> str: ...

    @property
    def versions(self) -> Mapping[int, Servable]: ...

    @property
    def config(self) -> ModelConfig | None: ...


class Models(ModelResolver, Protocol):
    """The served models as the routing table reads them (the model registry implements it):
    declared here, so routing imports nothing of the repository above it."""

    def entries(self) -> Sequence[ModelEntry]: ...

    def entry(self, name: str) -> ModelEntry: ...

    def find(self, name: str) -> ModelEntry | None: ...


class RoutingTable:
    """The routers of one server, by model name (the DataPlane reads :attr:`routers`).

    Args:
        registry: the served models (versions, their configuration).
        clock: monotonic seconds (tests pass a fake clock's ``now``).
        draw: uniform random numbers in [0, 1).
    """

    def __init__(
        self, registry: Models, clock: Callable[[], float], draw: Callable[[], float] = random.random
    ) -> None:
        self.registry = registry
        self.env = RouterEnvironment(registry, clock, draw, self._lowest_priority)
        self.routers: dict[str, ModelRouter] = {}
        """Mutated in place on the event loop; the DataPlane holds this very dict."""
        self._from_file: dict[str, RoutingConfig | None] = {}
        self._control: set[str] = set()
        self._first_seen: dict[tuple[str, str], float] = {}
        self._windows: dict[str, dict[str, ErrorWindow]] = {}
        self._captures: dict[Path, Capture] = {}
        self._starting: set[asyncio.Task[None]] = set()

    def sync(self) -> None:
        """Follow the models' configuration files after a load or reload.

        A ``routing:`` section that changed in the file replaces the policy in force, even one
        set through the control API since (a reload is the operator's latest word).
        """
        now = self.env.clock()
        for entry in self.registry.entries():
            for number in entry.versions:
                self._first_seen.setdefault((entry.name, str(number)), now)
            config = entry.config.routing if entry.config is not None else None
            if self._from_file.get(entry.name) == config:
                continue
            self._from_file[entry.name] = config
            self._control.discard(entry.name)
            if config is None:
                self.routers.pop(entry.name, None)
            else:
                self._install(entry.name, Policy.of(config))
                logger.info("model %s: routing policy from its configuration file", entry.name)

    def put(self, name: str, document: object) -> dict[str, Any]:
        """Validate and put a policy in force for ``name`` now; returns the routing ``GET``.

        Raises:
            ModelNotFound: unknown model. InvalidInput: invalid policy, or it names versions
            that are not served.
        """
        self.registry.entry(name)
        try:
            config = RoutingConfig.model_validate(document)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in exc.errors()
            )
            raise InvalidInput(f"invalid routing policy: {problems}") from None
        if config.shadow is not None and config.shadow.capture_dir is not None:
            # A path the server writes to is the operator's to choose, in the model's files.
            raise InvalidInput("shadow.capture_dir can only be set in the model's config.yaml")
        missing = sorted(_named_versions(config) - set(self.env.resolver.served_versions(name)), key=int)
        if missing:
            raise InvalidInput(
                f"routing policy names version(s) {', '.join(missing)} that model {name!r} does not serve"
            )
        self._install(name, Policy.of(config))
        self._control.add(name)
        logger.info("model %s: routing policy replaced through the control API", name)
        return self.get(name)

    def delete(self, name: str) -> None:
        """Remove ``name``'s policy: its requests go to the newest ready version again."""
        self.registry.entry(name)
        self.routers.pop(name, None)
        self._control.add(name)

    def get(self, name: str) -> dict[str, Any]:
        """The policy in force, its source, live per-version counts, rollout and shadow state."""
        self.registry.entry(name)
        router = self.routers.get(name)
        if router is None:
            return {"model": name, "policy": None, "source": None}
        if router.rollout is not None:
            router.tick(self.env.clock())
        source = "control" if name in self._control else "config.yaml"
        return {"model": name, "source": source, **router_snapshot(router)}

    def all(self) -> list[dict[str, Any]]:
        return [self.get(name) for name in sorted(self.routers)]

    def roles(self, name: str) -> dict[str, Role]:
        router = self.routers.get(name)
        return {} if router is None else router.roles()

    def role_names(self, name: str) -> dict[str, str]:
        """The repository index's reasons: each role, a canary's share, a rejection's reason."""
        router = self.routers.get(name)
        if router is None:
            return {}
        shares: dict[str, int] = {}
        for found in router.ranges():
            shares[found.version] = shares.get(found.version, 0) + found.end - found.start
        named = {}
        for version, role in router.roles().items():
            text = role.value
            if role is Role.CANARY:
                text += f" ({100 * shares.get(version, 0) / BUCKETS:g}%)"
            elif role is Role.REJECTED and router.rollout is not None:
                text += f": {router.rollout.reason}"
            named[version] = text
        return named

    def _lowest_priority(self, name: str) -> int:
        entry = self.registry.find(name)
        config = entry.config if entry is not None else None
        return config.batching.priority_levels if config is not None else 0

    def _install(self, name: str, policy: Policy) -> None:
        router = self.routers.get(name)
        if router is None:
            router = self.routers[name] = ModelRouter(name, policy, self.env)
        else:
            router.replace(policy)
        shadow = policy.config.shadow
        if shadow is None or shadow.capture_dir is None:
            router.shadow.keeper = None
        else:
            router.shadow.keeper = DivergentPairs(self._capture(Path(shadow.capture_dir)), shadow.capture_top)

    def _capture(self, directory: Path) -> Capture:
        """The capture writing into ``directory``, started in a task this table owns."""
        capture = self._captures.get(directory)
        if capture is None:
            capture = self._captures[directory] = Capture(directory, rate=1.0)
            task = asyncio.get_running_loop().create_task(capture.start())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)
        return capture

    async def close(self) -> None:
        """Write and close the divergent-pair captures (the server calls it at shutdown)."""
        if self._starting:
            await asyncio.gather(*self._starting, return_exceptions=True)
        for capture in self._captures.values():
            await capture.stop()
        self._captures.clear()

    # -- retirement ---------------------------------------------------------------------

    def due(self, now: float) -> list[tuple[str, str, str]]:
        """(model, version, reason) of every version to retire now."""
        due = []
        for name, router in list(self.routers.items()):
            config = router.policy.config.retire
            if config is None:
                continue
            roles = router.roles()
            serving = [
                v
                for v in self.env.resolver.served_versions(name)
                if roles.get(v) in (Role.ACTIVE, Role.CANARY) and v not in router.retired
            ]
            first = {v: self._first_seen.get((name, v), now) for v in serving}
            windows = self._windows.setdefault(name, {})
            for version, reason in due_for_retirement(config, now, serving, first, router.outcomes, windows):
                due.append((name, version, reason))
        return due

    async def retire_due(self, retire: Retire) -> list[tuple[str, str, str]]:
        """Mark every due version deprecated and have ``retire`` unload it; returns them."""
        due = self.due(self.env.clock())
        for name, version, reason in due:
            router = self.routers.get(name)
            if router is None:
                continue
            router.retired[version] = reason
            logger.warning("model %s version %s: deprecated and unloaded: %s", name, version, reason)
            await retire(name, int(version), f"deprecated: {reason}")
        return due

    async def run_retirement(self, retire: Retire, period_s: float = 10.0) -> None:
        """Sweep every ``period_s`` until cancelled (the server owns the task)."""
        while True:
            await asyncio.sleep(period_s)
            try:
                await self.retire_due(retire)
            except Exception:  # a failed sweep is logged; the next one tries again
                logger.exception("retirement sweep failed")


def _named_versions(config: RoutingConfig) -> set[str]:
    named = set(config.split or {})
    if config.rollout is not None:
        named |= {config.rollout.candidate, config.rollout.baseline}
    if config.shadow is not None:
        named.add(config.shadow.version)
    if config.override is not None:
        named |= set(config.override.variants.values())
    return named
