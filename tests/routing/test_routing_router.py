"""A model router over small fake versions: shadow copies, rollout rollback and advance,
auto-retirement with a fake clock, overrides, atomic replacement."""

from __future__ import annotations

import asyncio
import functools
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ortserve.capture_records import CapturedRequest, read_capture
from ortserve.config.model import ModelConfig
from ortserve.config.routing import RoutingConfig
from ortserve.core.model import ModelState, VersionInfo
from ortserve.core.types import InferInput, InferOutput, InferRequest, InferResponse, TensorSpec
from ortserve.errors import InferenceError, InvalidInput, OrtServeError
from ortserve.repository.registry import ModelRegistry
from ortserve.routing.policy import Policy, RequestView, choose
from ortserve.routing.roles import Role
from ortserve.routing.rollout import Phase
from ortserve.routing.table import RoutingTable
from ortserve.testing import FakeClock
from waiting import until

SPEC = (TensorSpec("x", "FP32", (-1, 4)),)
OUT = (TensorSpec("y", "FP32", (-1, 4)),)


class FakeVersion:
    """Answers ``x * scale`` on the next loop turn, fails every request, or holds them."""

    def __init__(self, version: str, scale: float = 1.0, fail: bool = False, hold: bool = False) -> None:
        self.info = VersionInfo("m", version, SPEC, OUT, 8, ("cpu",))
        self.state = ModelState.READY
        self.scale, self.fail, self.hold = scale, fail, hold
        self.held: list[asyncio.Future[InferResponse]] = []
        self.seen: list[InferRequest] = []

    @property
    def ready(self) -> bool:
        return True

    def refusal(self, priority: int = 0) -> OrtServeError | None:
        return None

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        self.seen.append(request)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[InferResponse] = loop.create_future()
        if self.hold:
            self.held.append(future)
        elif self.fail:
            loop.call_soon(future.set_exception, InferenceError("the runner failed"))
        else:
            x = request.inputs[0].data
            y = np.asarray(x, dtype=np.float32) * self.scale
            loop.call_soon(
                future.set_result,
                InferResponse("m", self.info.version, [InferOutput("y", "FP32", y.shape, y)]),
            )
        return future

    async def infer(self, request: InferRequest) -> InferResponse:
        return await self.submit(request)

    async def unload(self, grace_s: float) -> None:
        self.state = ModelState.UNLOADED


def table_with(
    versions: list[FakeVersion], routing: dict[str, Any], clock: FakeClock | None = None
) -> RoutingTable:
    registry = ModelRegistry()
    for version in versions:
        registry.publish("m", int(version.info.version), version, 0.0)
    registry.entry("m").config = ModelConfig(routing=RoutingConfig.model_validate(routing))
    table = RoutingTable(registry, (clock or FakeClock()).now, random.Random(3).random)
    table.sync()
    return table


def request(key: str | None = None, **parameters: Any) -> InferRequest:
    headers = {"x-user-id": key} if key is not None else {}
    x = np.arange(4, dtype=np.float32).reshape(1, 4) + 1
    return InferRequest("m", [InferInput("x", "FP32", (1, 4), x)], parameters=parameters, headers=headers.get)


async def send(table: RoutingTable, count: int, **parameters: Any) -> list[InferResponse | BaseException]:
    router = table.routers["m"]
    futures = [router.submit(request(f"user-{i}", **parameters)) for i in range(count)]
    return list(await asyncio.gather(*futures, return_exceptions=True))


async def test_the_shadow_never_changes_the_primary_answer_and_its_divergence_is_recorded() -> None:
    shadow = FakeVersion("2", scale=2.0)
    table = table_with([FakeVersion("1"), shadow], {"shadow": {"version": "2", "fraction": 1.0, "batch": 4}})
    answers = await send(table, 20)
    await asyncio.sleep(0)  # comparisons run after the answers
    expected = np.arange(1, 5, dtype=np.float32).reshape(1, 4)
    for answer in answers:
        assert isinstance(answer, InferResponse) and answer.model_version == "1"
        assert np.array_equal(answer.outputs[0].data, expected)
    router = table.routers["m"]
    assert router.shadow.compared["2"] == 20
    assert [r.inputs[0].shape for r in shadow.seen] == [(4, 4)] * 5  # copies gathered 4 rows at a time
    [summary] = router.book.summary()
    assert (summary["primary"], summary["shadow"], summary["output"]) == ("1", "2", "y")
    assert summary["max_abs_diff"] == 4.0
    assert table.roles("m") == {"1": Role.ACTIVE, "2": Role.SHADOW}


async def captured(directory: Path, expected: int, timeout_s: float = 10.0) -> list[CapturedRequest]:
    """The records once ``expected`` are on disk (a write cancelled at close ends in its thread)."""

    def records() -> list[CapturedRequest] | None:
        try:
            found = list(read_capture([directory]))
        except ValueError:  # a file still being written
            return None
        return found if len(found) >= expected else None

    return await until(records, timeout_s, f"{expected} captured records")


async def test_the_most_divergent_requests_are_captured_for_replay(tmp_path: Path) -> None:
    shadow = {"version": "2", "fraction": 1.0, "batch": 1, "capture_dir": str(tmp_path), "capture_top": 3}
    table = table_with([FakeVersion("1"), FakeVersion("2", scale=2.0)], {"shadow": shadow})
    router = table.routers["m"]
    for factor in (1, 2, 3, 4, 5, 6, 1, 2):  # the last two stay out of the top 3
        scaled = request()
        scaled.inputs[0].data = scaled.inputs[0].data * factor
        await router.submit(scaled)
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert router.shadow.compared["2"] == 8
    await table.close()
    records = await captured(tmp_path, 6)
    assert len(records) == 6  # each of the first six entered the top 3 when it came
    assert all(r.path == "/v2/models/m/infer" for r in records)
    with pytest.raises(InvalidInput, match="config.yaml"):
        table.put("m", {"shadow": shadow})


async def test_a_saturated_shadow_drops_copies_and_counts_them() -> None:
    shadow = FakeVersion("2", hold=True)
    table = table_with(
        [FakeVersion("1"), shadow],
        {"shadow": {"version": "2", "fraction": 1.0, "max_inflight": 2, "batch": 1}},
    )
    answers = await send(table, 5)
    assert all(isinstance(a, InferResponse) for a in answers)
    router = table.routers["m"]
    assert router.shadow.dropped["full"] == 3
    assert router.shadow.inflight == 2
    assert all(r.priority == 2 for r in shadow.seen)  # the lowest of the default two lanes


async def test_an_erroring_candidate_is_rolled_back_and_rejected() -> None:
    clock = FakeClock()
    rollout = {"candidate": "2", "baseline": "1", "steps": [50, 100], "interval": 1, "min_requests": 10}
    table = table_with([FakeVersion("1"), FakeVersion("2", fail=True)], {"rollout": rollout}, clock)
    await send(table, 60)
    router = table.routers["m"]
    assert router.rollout is not None and router.rollout.phase is Phase.REJECTED
    assert "max_error_rate" in router.rollout.reason
    assert router.events["rejected"] == 1
    assert table.roles("m")["2"] is Role.REJECTED
    answers = await send(table, 50)
    assert all(isinstance(a, InferResponse) and a.model_version == "1" for a in answers)
    assert table.get("m")["rollout"]["state"] == "rejected"


async def test_a_healthy_candidate_advances_with_the_clock_and_completes() -> None:
    clock = FakeClock()
    rollout = {
        "candidate": "2",
        "baseline": "1",
        "steps": [20, 100],
        "interval": "10s",
        "min_requests": 10,
        "guards": {"max_p99_ratio": None},
    }
    table = table_with([FakeVersion("1"), FakeVersion("2")], {"rollout": rollout}, clock)
    router = table.routers["m"]
    await send(table, 100)
    assert router.rollout is not None and router.rollout.share == 20
    clock.advance(10)
    await send(table, 100)
    assert router.rollout.share == 100
    clock.advance(10)
    await send(table, 20)
    assert router.rollout.phase is Phase.COMPLETED
    assert table.roles("m") == {"1": Role.DEPRECATED, "2": Role.ACTIVE}


async def test_a_diverging_candidate_is_rolled_back() -> None:
    rollout = {
        "candidate": "2",
        "baseline": "1",
        "steps": [10, 100],
        "interval": 1,
        "min_requests": 20,
        "guards": {"max_divergence": 0.001, "compare_fraction": 1.0},
    }
    table = table_with([FakeVersion("1"), FakeVersion("2", scale=1.5)], {"rollout": rollout})
    for _ in range(4):
        await send(table, 20)
        await asyncio.sleep(0)
    router = table.routers["m"]
    assert router.rollout is not None and router.rollout.phase is Phase.REJECTED
    assert "max_divergence" in router.rollout.reason


async def test_override_by_header_or_ab_tag_and_an_unknown_tag_is_a_client_error() -> None:
    table = table_with(
        [FakeVersion("1"), FakeVersion("2")], {"split": {"1": 100}, "override": {"variants": {"fast": "2"}}}
    )
    router = table.routers["m"]
    assert (await router.submit(request(ab_tag="fast"))).model_version == "2"
    by_header = request()
    by_header.headers = {"x-model-version": "2"}.get
    assert (await router.submit(by_header)).model_version == "2"
    explicit = request(ab_tag="fast")
    explicit.model_version = "1"
    assert (await router.submit(explicit)).model_version == "1"
    with pytest.raises(InvalidInput, match="names no variant"):
        router.submit(request(ab_tag="slow"))


async def test_submit_decides_as_the_policy_does_for_keyed_unkeyed_and_forced_requests() -> None:
    table = table_with([FakeVersion("1"), FakeVersion("2")], {"split": {"1": 70, "2": 30}})
    router = table.routers["m"]
    policy, ranges = router.policy, router.ranges()
    for i in range(300):
        view = RequestView(key=f"user-{i}") if i % 3 else RequestView()
        if i % 10 == 0:
            view = view._replace(override="2")
        forced = request(view.key, **({"ab_tag": view.override} if view.override else {}))
        draw = (i % 97) / 97  # the same draw for the router and the policy
        router.env = replace(router.env, draw=functools.partial(float, draw))
        expected = choose(policy, ranges, view, "m", router.env.draw, lambda: "2")
        assert (await router.submit(forced)).model_version == expected.version
    by_reason = {version: seen.by_reason for version, seen in router.outcomes.items()}
    assert sum(by_reason["1"].values()) + sum(by_reason["2"].values()) == 300
    assert {reason for seen in by_reason.values() for reason in seen} == {"sticky", "random", "override"}
    assert sum(n for (_, reason), n in router.reasons.items() if reason == "override") == 30


async def test_a_replaced_policy_applies_to_the_next_request_and_keeps_counts() -> None:
    table = table_with([FakeVersion("1"), FakeVersion("2")], {"split": {"1": 100}})
    await send(table, 10)
    table.put("m", {"split": {"2": 100}})
    answers = await send(table, 10)
    assert {a.model_version for a in answers if isinstance(a, InferResponse)} == {"2"}
    counts = table.get("m")["versions"]
    assert (counts["1"]["requests"], counts["2"]["requests"]) == (10, 10)
    with pytest.raises(InvalidInput, match="does not serve"):
        table.put("m", {"split": {"7": 100}})


async def test_idle_and_failing_versions_are_retired_but_never_the_last() -> None:
    clock = FakeClock()
    retire = {"idle": "3d", "max_error_rate": 0.05, "window": "1h", "min_requests": 10}
    versions = [FakeVersion("1"), FakeVersion("2"), FakeVersion("3")]
    table = table_with(versions, {"split": {"1": 50, "2": 50}, "retire": retire}, clock)
    retired: list[tuple[str, int, str]] = []

    async def unload(name: str, number: int, reason: str) -> None:
        retired.append((name, number, reason))
        registry = table.registry
        assert isinstance(registry, ModelRegistry)
        registry.withdraw(name, number)

    assert await table.retire_due(unload) == []  # opens the error windows
    versions[1].fail = True
    await send(table, 40)
    clock.advance(3600)
    due = await table.retire_due(unload)
    assert [(m, v) for m, v, _ in due] == [("m", "2")]
    assert "error rate" in due[0][2]
    clock.advance(3 * 86400)
    due = await table.retire_due(unload)
    assert [(m, v) for m, v, _ in due] == [("m", "3")]  # version 1 is now the last one serving
    assert "no request for 3.04d (idle limit 3d)" in due[0][2]
    assert {n for _, n, _ in retired} == {2, 3}
    assert table.roles("m")["2"] is Role.DEPRECATED
    assert Counter(a.model_version for a in await send(table, 20) if isinstance(a, InferResponse)) == {
        "1": 20
    }


def test_a_policy_is_a_pure_value() -> None:
    policy = Policy.of(RoutingConfig.model_validate({"split": {"1": 1}}))
    assert policy == Policy.of(RoutingConfig.model_validate({"split": {"1": 1}}))
