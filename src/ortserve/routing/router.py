"""One model's router: applies the policy to each request, submits it, keeps the outcomes.

Everything a request reads lives in one immutable :class:`_Live` (policy, bucket ranges in
force, rollout state), replaced by a single assignment on the event loop: a policy change or a
rollout step is atomic, and a request already submitted finishes on the version it got.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ortserve.config.routing import ShadowConfig
from ortserve.core.dataplane import ModelResolver
from ortserve.core.model import Servable
from ortserve.core.types import InferRequest, InferResponse
from ortserve.errors import InvalidInput, ModelNotFound, ModelNotReady
from ortserve.routing.buckets import BUCKETS, BucketRange, bucket_ranges, bucketer
from ortserve.routing.divergence import DivergenceBook
from ortserve.routing.outcomes import VersionOutcomes
from ortserve.routing.policy import Choice, Policy, RequestView, choose, split_weights, static_ranges
from ortserve.routing.roles import Role, version_roles
from ortserve.routing.rollout import Phase, RolloutState, evaluate, start
from ortserve.routing.shadow import ShadowLane, ShadowTarget

__all__ = ["ModelRouter", "RouterEnvironment"]

logger = logging.getLogger(__name__)

_CHECK_EVERY_S = 1.0


@dataclass(frozen=True, slots=True)
class RouterEnvironment:
    """What a router reads from the server: the registry, the time, randomness, and the lowest
    priority lane of a model (where shadow copies queue)."""

    resolver: ModelResolver
    clock: Callable[[], float]
    draw: Callable[[], float] = random.random
    lowest_priority: Callable[[str], int] = lambda _: 0


@dataclass(frozen=True, slots=True)
class _Live:
    """What a request reads, built once per policy, rollout step or rejection (:func:`_live`)."""

    policy: Policy
    ranges: tuple[BucketRange, ...]
    rollout: RolloutState | None
    ends: tuple[int, ...]
    """Each range's end, in order: ``bisect`` finds a bucket's range in one C call."""
    versions: tuple[str, ...]
    """Each range's version, beside ``ends``."""
    admission: str | None
    """The widest range's version (the transports' early admission check); None: no split,
    the default version (it depends on what is served now, so it is looked up per request)."""
    reads: bool
    """The policy reads an override or a sticky key from the request."""
    tracks: bool
    """Errors and latencies are followed (see :attr:`ModelRouter.tracks_outcomes`)."""
    mirrors: bool
    """A shadow, or a rollout's comparison, may copy requests."""


def _live(policy: Policy, ranges: tuple[BucketRange, ...], rollout: RolloutState | None) -> _Live:
    config = policy.config
    return _Live(
        policy,
        ranges,
        rollout,
        tuple(r.end for r in ranges),
        tuple(r.version for r in ranges),
        max(ranges, key=lambda r: r.end - r.start).version if ranges else None,
        any(
            part is not None
            for part in (
                policy.override_header,
                policy.override_parameter,
                policy.sticky_header,
                policy.sticky_parameter,
            )
        ),
        config.rollout is not None
        or (config.retire is not None and config.retire.max_error_rate is not None),
        config.shadow is not None
        or (config.rollout is not None and config.rollout.guards.max_divergence is not None),
    )


class ModelRouter:
    """Routes the requests of one model name through its policy.

    Args:
        name: the model.
        policy: the policy in force at first.
        env: registry, clock and randomness (tests pass fakes).
    """

    def __init__(self, name: str, policy: Policy, env: RouterEnvironment) -> None:
        self.name = name
        self.env = env
        self.outcomes: dict[str, VersionOutcomes] = {}
        self.book = DivergenceBook()
        self.shadow = ShadowLane(self.book)
        self.events: Counter[str] = Counter()
        """Rollout events: advanced, completed, rejected."""
        self.retired: dict[str, str] = {}
        """Versions retired automatically, with the reason."""
        self._next_check = 0.0
        self._unjudged = 0
        self._judge_every = 16
        self._bucket = bucketer(name)
        self._live = self._build(policy, None)

    # -- policy ---------------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        return self._live.policy

    @property
    def rollout(self) -> RolloutState | None:
        return self._live.rollout

    @property
    def reasons(self) -> Counter[tuple[str, str]]:
        """Requests by (version, why it was chosen), from each version's outcomes."""
        return Counter(
            {
                (version, reason): n
                for version, seen in self.outcomes.items()
                for reason, n in seen.by_reason.items()
            }
        )

    @property
    def tracks_outcomes(self) -> bool:
        """Errors and latencies are followed (a done callback per request) only when a rollout
        or error-based retirement reads them: a plain split costs one count per request."""
        return self._live.tracks

    def replace(self, policy: Policy) -> None:
        """Put ``policy`` in force now (one assignment: no request sees half of it).

        A rollout keeps its progress when the new policy has the same candidate and baseline.
        """
        self._live = self._build(policy, self._live)

    def _build(self, policy: Policy, before: _Live | None) -> _Live:
        plan = policy.config.rollout
        if plan is None:
            return _live(policy, static_ranges(policy), None)
        old = before.policy.config.rollout if before is not None else None
        kept = old is not None and (old.candidate, old.baseline) == (plan.candidate, plan.baseline)
        state = before.rollout if kept and before is not None and before.rollout is not None else None
        if state is None:
            state = start(plan, self.env.clock())
            self._reset_windows()
        return _live(policy, _rollout_ranges(plan.baseline, plan.candidate, state.share), state)

    # -- the request path -----------------------------------------------------------------

    def view(self, request: InferRequest) -> RequestView:
        """What of ``request`` the policy reads."""
        return self.view_of(request.model_version, request.parameters, request.headers)

    def view_of(
        self,
        explicit: str | None,
        parameters: Mapping[str, object],
        headers: Callable[[str], str | None] | None,
        body: Mapping[str, object] | None = None,
    ) -> RequestView:
        """The view from a request's parts; ``body``: a pipeline route's JSON fields, where
        the override parameter and the sticky ``field`` are also looked for."""
        override, key = _parts(self._live.policy, parameters, headers, body)
        return RequestView(explicit or None, override, key)

    def choose(self, view: RequestView) -> tuple[Servable, Choice]:
        """The version that serves a request with this view.

        Raises:
            InvalidInput: an override names no variant and no served version.
            ModelNotFound: an explicit version is not served. ModelNotReady: nothing serves.
        """
        live = self._live
        choice = choose(live.policy, live.ranges, view, self.name, self.env.draw, self._default_now)
        try:
            return self.env.resolver.resolve(self.name, choice.version), choice
        except ModelNotFound:
            if choice.reason == "explicit":
                raise
            if choice.reason == "override":
                raise InvalidInput(
                    f"override {view.override!r} names no variant and no served version of model "
                    f"{self.name!r} (served: {', '.join(self.env.resolver.served_versions(self.name))})"
                ) from None
        fallback = self._default(live)  # a split naming a version not (yet) loaded
        return self.env.resolver.resolve(self.name, fallback), Choice(fallback, "fallback")

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        """Route, submit, count; maybe mirror to the shadow. Raises what ``submit`` raises.

        The same decision as :meth:`choose` (explicit, override, split, default), with the
        common cases (an explicit version, a sticky or random pick from the split) taken here
        without building a view or a choice: this runs once per request.
        """
        live = self._live
        explicit = request.model_version
        if explicit:
            served = self.env.resolver.resolve(self.name, explicit)
            reason = "explicit"
        else:
            served, reason = self._route(live, request.parameters, request.headers)
        pending = served.submit(request)
        version = served.info.version
        self._account(live, version, reason, pending)
        if live.mirrors:
            self._maybe_shadow(request, version, pending)
        return pending

    def _route(
        self, live: _Live, parameters: Mapping[str, object], headers: Callable[[str], str | None] | None
    ) -> tuple[Servable, str]:
        override = key = None
        if live.reads:
            override, key = _parts(live.policy, parameters, headers, None)
        if override is None and live.ends:
            if key is not None:
                bucket, reason = self._bucket(key), "sticky"
            else:
                bucket, reason = min(int(self.env.draw() * BUCKETS), BUCKETS - 1), "random"
            # The ranges cover every bucket: the index is always a range's.
            version = live.versions[bisect_right(live.ends, bucket)]
            try:
                return self.env.resolver.resolve(self.name, version), reason
            except ModelNotFound:  # a split naming a version not (yet) loaded
                fallback = self._default(live)
                return self.env.resolver.resolve(self.name, fallback), "fallback"
        served, choice = self.choose(RequestView(None, override, key))
        return served, choice.reason

    def admission_version(self) -> str | None:
        """The version most default traffic goes to (the transports' early admission check)."""
        live = self._live
        return live.admission if live.admission is not None else self._default(live)

    def record(self, version: str, reason: str, pending: asyncio.Future[object]) -> None:
        """Count a request routed here but run elsewhere (a pipeline route's request)."""
        self._account(self._live, version, reason, pending)

    def _account(self, live: _Live, version: str, reason: str, pending: asyncio.Future[Any]) -> None:
        now = self.env.clock()
        outcomes = self.outcomes.get(version)
        if outcomes is None:
            outcomes = self.outcomes[version] = VersionOutcomes()
        outcomes.arrived(now, reason)
        if live.tracks:
            pending.add_done_callback(functools.partial(self._settled, outcomes, now))

    def _settled(self, outcomes: VersionOutcomes, started: float, pending: asyncio.Future[Any]) -> None:
        now = self.env.clock()
        outcomes.settled(now - started, pending)
        if self._live.rollout is not None:
            # Judged at most once a second (a tenth of the interval when shorter), and after
            # every quarter of min_requests outcomes, so a failing candidate goes back fast.
            self._unjudged += 1
            if now >= self._next_check or self._unjudged >= self._judge_every:
                self.tick(now)

    def _maybe_shadow(
        self, request: InferRequest, primary: str, pending: asyncio.Future[InferResponse]
    ) -> None:
        live = self._live
        shadow = live.policy.config.shadow
        target, fraction = (shadow.version, shadow.fraction) if shadow is not None else (None, 0.0)
        rollout = live.policy.config.rollout
        if (
            target is None
            and rollout is not None
            and rollout.guards.max_divergence is not None
            and live.rollout is not None
            and live.rollout.phase is Phase.PROGRESSING
            and primary == rollout.baseline
        ):
            target, fraction = rollout.candidate, rollout.guards.compare_fraction
        if target is None or target == primary or self.env.draw() >= fraction:
            return
        try:
            served = self.env.resolver.resolve(self.name, target)
        except (ModelNotFound, ModelNotReady):
            self.shadow.dropped["refused"] += 1
            return
        priority = self.env.lowest_priority(self.name)
        if shadow is None:
            shadow = ShadowConfig(version=target)  # a rollout's comparison: the defaults
        self.shadow.offer(
            request,
            pending,
            ShadowTarget(
                served, priority, shadow.timeout, shadow.max_inflight, shadow.batch, shadow.max_delay
            ),
        )

    def _default_now(self) -> str:
        return self._default(self._live)

    def _default(self, live: _Live) -> str:
        """The newest serving version that is not deprecated, rejected, retired or shadow-only."""
        config = live.policy.config
        excluded = set(config.deprecated) | set(self.retired)
        if config.shadow is not None:
            excluded.add(config.shadow.version)
        if live.rollout is not None and config.rollout is not None and live.rollout.phase is Phase.REJECTED:
            excluded.add(config.rollout.candidate)
        versions = self.env.resolver.served_versions(self.name)
        for version in versions:
            if version not in excluded:
                return version
        if versions:
            return versions[0]
        raise ModelNotReady(f"model {self.name!r} has no version serving")

    # -- rollout ----------------------------------------------------------------------------

    def tick(self, now: float) -> str | None:
        """Judge the rollout's window now; returns the event when something happened."""
        self._next_check = now + min(_CHECK_EVERY_S, self._interval() / 10)
        self._unjudged = 0
        live = self._live
        plan = live.policy.config.rollout
        if plan is None or live.rollout is None:
            return None
        self._judge_every = max(16, plan.min_requests // 4)
        empty = VersionOutcomes()
        candidate = self.outcomes.get(plan.candidate, empty).window()
        baseline = self.outcomes.get(plan.baseline, empty).window()
        divergence = self.book.window(plan.baseline, plan.candidate)
        state, event = evaluate(plan, live.rollout, now, candidate, baseline, divergence)
        if event is None:
            return None
        self._live = _live(live.policy, _rollout_ranges(plan.baseline, plan.candidate, state.share), state)
        self._reset_windows()
        self.events[event] += 1
        if event == "rejected":
            logger.warning("model %s: rollout of version %s %s", self.name, plan.candidate, state.reason)
        else:
            logger.info(
                "model %s: rollout of version %s %s to %g%%", self.name, plan.candidate, event, state.share
            )
        return event

    def _interval(self) -> float:
        plan = self._live.policy.config.rollout
        return plan.interval if plan is not None else _CHECK_EVERY_S * 10

    def _reset_windows(self) -> None:
        for outcomes in self.outcomes.values():
            outcomes.reset_window()
        self.book.reset_window()

    # -- reading ----------------------------------------------------------------------------

    def roles(self) -> dict[str, Role]:
        live = self._live
        config = live.policy.config
        served = self.env.resolver.served_versions(self.name)
        try:
            default: str | None = self._default(live)
        except ModelNotReady:
            default = None
        rollout = None
        if config.rollout is not None and live.rollout is not None:
            rollout = (config.rollout.candidate, config.rollout.baseline, live.rollout)
        shadow = config.shadow.version if config.shadow is not None else None
        return version_roles(served, live.ranges, default, shadow, config.deprecated, rollout, self.retired)

    def version_roles(self) -> dict[str, str]:
        """Each version's role by name (model metadata, the repository index)."""
        return {version: role.value for version, role in self.roles().items()}

    def ranges(self) -> tuple[BucketRange, ...]:
        return self._live.ranges


def _rollout_ranges(baseline: str, candidate: str, share: float) -> tuple[BucketRange, ...]:
    return bucket_ranges(split_weights({baseline: 100.0 - share, candidate: share}))


def _parts(
    policy: Policy,
    parameters: Mapping[str, object],
    headers: Callable[[str], str | None] | None,
    body: Mapping[str, object] | None,
) -> tuple[str | None, str | None]:
    """The override value and the sticky key a request carries, where ``policy`` looks."""
    # A parameter that is absent (the usual case for the override) costs no call to _text.
    override = None
    name = policy.override_parameter
    if name is not None and parameters:
        value = parameters.get(name)
        override = None if value is None else _text(value)
    if override is None and name is not None and body:
        override = _text(body.get(name))
    if override is None and policy.override_header is not None and headers is not None:
        override = headers(policy.override_header)
    key = None
    if policy.sticky_header is not None and headers is not None:
        key = headers(policy.sticky_header)
    if key is None and policy.sticky_parameter is not None and parameters:
        value = parameters.get(policy.sticky_parameter)
        key = None if value is None else _text(value)
    if key is None and policy.sticky_field is not None and body:
        key = _text(body.get(policy.sticky_field))
    return override or None, key


def _text(value: object) -> str | None:
    """A parameter or body field as a key: strings and numbers; anything else is no key."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None
