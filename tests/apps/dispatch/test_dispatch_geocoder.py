"""The geocoder hook: answers within the timeout replace the gazetteer's placement, slow or
failing services fall back to the rules, answers are cached (LRU, time to live)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ortserve.apps.dispatch.geocoder import GeocoderHook
from ortserve.apps.dispatch.pipeline import GeocodingDispatchPipeline
from ortserve.apps.dispatch.training import train_dispatch
from ortserve.apps.seeds import SEED_APPS
from ortserve.pipeline.contract import Pipeline, PipelineContext
from ortserve.pipeline.runtime import PipelineRunner
from ortserve.testing import PipelineHarness, pipeline_harness

NOW = 1_759_017_600_000
ADDRESS = "北京市海淀区中关村大街1号"
SPOT = (39.9830, 116.3160)


class Service:
    """A fake geocoding service: counts calls, can block or fail."""

    def __init__(self, answer: tuple[float, float] | None = SPOT, fail: bool = False) -> None:
        self.answer = answer
        self.fail = fail
        self.calls = 0
        self.addresses: list[str] = []
        self.release = threading.Event()
        self.block = False

    def __call__(self, address: str) -> tuple[float, float] | None:
        self.calls += 1
        self.addresses.append(address)
        if self.block:
            self.release.wait(5.0)
        if self.fail:
            raise ConnectionError("service down")
        return self.answer


async def test_answers_are_cached_until_their_time_to_live_runs_out() -> None:
    now = [0.0]
    service = Service()
    hook = GeocoderHook(service, ttl_s=60.0, clock=lambda: now[0])
    assert await hook.locate(ADDRESS) == SPOT
    assert await hook.locate(ADDRESS) == SPOT and service.calls == 1
    now[0] = 61.0
    assert await hook.locate(ADDRESS) == SPOT and service.calls == 2


async def test_the_least_recently_used_answer_is_evicted_first() -> None:
    service = Service()
    hook = GeocoderHook(service, cache_size=2)
    for address in ("a", "b", "a", "c"):
        await hook.locate(address)
    assert hook.cached("a") == SPOT and hook.cached("c") == SPOT and hook.cached("b") is None


@pytest.mark.parametrize("case", ["slow", "failing", "unknown", "off_earth"])
async def test_a_slow_failing_or_useless_service_gives_no_answer(case: str) -> None:
    service = Service(answer=None if case == "unknown" else (95.0, 0.0) if case == "off_earth" else SPOT)
    service.fail = case == "failing"
    service.block = case == "slow"
    hook = GeocoderHook(service, timeout_s=0.05)
    try:
        assert await hook.locate(ADDRESS) is None
    finally:
        service.release.set()
    assert hook.cached(ADDRESS) is None


@pytest.fixture(scope="module")
def dispatch_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dispatch_geo_repo")
    train_dispatch(root / "dispatch" / "1")
    (root / "dispatch" / "config.yaml").write_text(SEED_APPS["dispatch"][1], encoding="utf-8")
    return root


@pytest.fixture
async def harness(dispatch_repository: Path) -> AsyncIterator[PipelineHarness]:
    async with pipeline_harness(dispatch_repository) as loaded:
        yield loaded


async def route(
    harness: PipelineHarness, repository: Path, service: Service, timeout_s: float, address: str = ADDRESS
) -> Any:
    context = PipelineContext("dispatch", "1", repository / "dispatch" / "1")
    pipeline: Pipeline[Any] = GeocodingDispatchPipeline(context, GeocoderHook(service, timeout_s=timeout_s))
    runner = await PipelineRunner.build(pipeline, harness.registry)
    document = {
        "now": NOW,
        "orders": [{"id": "o1", "address": address, "created_at": NOW, "deadline": NOW + 3_600_000}],
        "couriers": [{"id": "c1", "lat": SPOT[0], "lon": SPOT[1], "capacity": 2}],
    }
    return await runner.run(document)


async def test_the_service_position_replaces_the_gazetteer_centroid(
    harness: PipelineHarness, dispatch_repository: Path
) -> None:
    answer = await route(harness, dispatch_repository, Service(), 1.0)
    [order] = answer["orders"]
    assert order["placed_by"] == "geocoder" and order["candidates"][0]["distance_km"] == 0.0


async def test_a_service_past_its_timeout_leaves_the_gazetteer_placement(
    harness: PipelineHarness, dispatch_repository: Path
) -> None:
    service = Service()
    service.block = True
    try:
        answer = await route(harness, dispatch_repository, service, 0.05)
    finally:
        service.release.set()
    [order] = answer["orders"]
    assert order["placed_by"] == "gazetteer" and order["placed_in"] == "海淀区"
    # The gazetteer's point for 中关村大街, 0.9 km from the service's.
    assert order["precision"] == "road" and order["candidates"][0]["distance_km"] > 0.5


async def test_an_address_the_gazetteer_cannot_place_is_asked_of_the_service(
    harness: PipelineHarness, dispatch_repository: Path
) -> None:
    service = Service()
    answer = await route(harness, dispatch_repository, service, 1.0, "望京SOHO塔1")
    [order] = answer["orders"]
    assert "望京SOHO塔1" in service.addresses and answer["unassigned"] == []
    assert order["placed_by"] == "geocoder" and "placed_in" not in order and "precision" not in order
    assert order["courier_id"] == "c1" and order["candidates"][0]["distance_km"] == 0.0
    unknown = await route(harness, dispatch_repository, Service(answer=None), 1.0, "望京SOHO塔1")
    assert unknown["orders"] == []
    [failed] = unknown["unassigned"]
    assert failed["order_id"] == "o1" and "no known city" in failed["reason"]
