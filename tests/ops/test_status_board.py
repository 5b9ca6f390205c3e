"""The status board turns successive expositions into rates, quantiles, shares and recent errors,
computes at most once per interval however many pages poll, and drops unloaded models."""

from __future__ import annotations

import logging

import orjson
import pytest

from ortserve.server.status.board import StatusBoard, quantile
from ortserve.server.status.events import EventLog
from ortserve.server.status.totals import read_totals
from ortserve.testing import FakeClock


def exposition(
    success: int, overloaded: int = 0, slow: int = 0, state: str = "ready", routed: tuple[int, int] = (0, 0)
) -> str:
    labels = 'model="m",version="1"'
    lines = [
        f'ortserve_model_state{{{labels},state="{state}"}} 1.0',
        'ortserve_model_state{model="gone",version="1",state="unloaded"} 1.0',
        f'ortserve_model_execution_provider{{{labels},provider="CPUExecutionProvider"}} 1.0',
        f'ortserve_requests_total{{{labels},transport="http",outcome="success"}} {success}.0',
        f'ortserve_requests_total{{{labels},transport="grpc",outcome="overloaded"}} {overloaded}.0',
        f'ortserve_request_duration_seconds_bucket{{{labels},transport="http",le="0.001"}} {success - slow}.0',
        f'ortserve_request_duration_seconds_bucket{{{labels},transport="http",le="0.1"}} {success}.0',
        f'ortserve_request_duration_seconds_bucket{{{labels},transport="http",le="+Inf"}} {success}.0',
        f'ortserve_scheduler_rejections_total{{{labels},reason="queue_full"}} {overloaded}.0',
        f"ortserve_queue_depth{{{labels}}} 3.0",
        f"ortserve_fallback_level{{{labels}}} 1.0",
        f'ortserve_breaker_open{{{labels},level="0"}} 1.0',
        f'ortserve_routing_requests_total{{model="m",version="1",reason="split"}} {routed[0]}.0',
        f'ortserve_routing_requests_total{{model="m",version="2",reason="split"}} {routed[1]}.0',
        'ortserve_model_state{model="m",version="2",state="ready"} 1.0',
        "# HELP ignored a comment",
        "process_cpu_seconds_total 1.0",
    ]
    return "\n".join(lines) + "\n"


class Feed:
    def __init__(self) -> None:
        self.text = exposition(0)
        self.reads = 0

    async def __call__(self) -> str | None:
        self.reads += 1
        return self.text


def test_quantile_interpolates_inside_the_bucket_like_prometheus() -> None:
    before = {0.1: 0.0, 1.0: 0.0, float("inf"): 0.0}
    after = {0.1: 50.0, 1.0: 100.0, float("inf"): 100.0}
    assert quantile(0.5, before, after) == pytest.approx(0.1)
    assert quantile(0.99, before, after) == pytest.approx(0.1 + 0.9 * 49 / 50)
    assert quantile(0.5, after, after) is None


def test_totals_read_versions_state_fallback_breakers_and_skip_unloaded_models() -> None:
    totals = read_totals(exposition(10, 2))
    m = totals.models["m"]
    assert m.versions["1"].state == "ready" and m.versions["1"].fallback_level == 1
    assert m.versions["1"].breakers_open == [0] and m.versions["1"].provider == "CPUExecutionProvider"
    assert m.outcomes == {"success": 10.0, "overloaded": 2.0} and m.refusals == {"queue_full": 2.0}
    assert not totals.models["gone"].shown()


async def test_rates_quantiles_shares_and_errors_come_from_the_change_between_polls() -> None:
    clock, feed = FakeClock(), Feed()
    board = StatusBoard(feed, clock.now, clock.now, EventLog())
    await board.document()
    clock.advance(2.0)
    feed.text = exposition(200, overloaded=4, slow=100, routed=(30, 10))
    document = orjson.loads(await board.document())
    (m,) = document["models"]
    assert m["name"] == "m" and m["qps"] == pytest.approx(102.0)
    assert m["p50_ms"] == pytest.approx(1.0) and m["p99_ms"] == pytest.approx(1 + 99 * 98 / 100)
    assert [v["share"] for v in m["versions"]] == [0.75, 0.25]
    assert m["versions"][0]["breakers_open"] == [0] and m["queue_depth"] == 3.0
    assert len(m["history"]) == 1 and m["history"][0][1] == pytest.approx(102.0)
    kinds = {(e["kind"], e["count"]) for e in document["errors"]}
    assert kinds == {("overloaded", 4), ("refused: queue_full", 4)}


async def test_polls_within_the_interval_share_one_computation() -> None:
    clock, feed = FakeClock(), Feed()
    board = StatusBoard(feed, clock.now, clock.now, EventLog())
    first = await board.document()
    for _ in range(10):
        clock.advance(0.05)
        assert await board.document() is first
    clock.advance(1.0)
    await board.document()
    assert (feed.reads, board.computations) == (2, 2)


async def test_a_model_whose_versions_are_all_unloaded_leaves_the_document() -> None:
    clock, feed = FakeClock(), Feed()
    board = StatusBoard(feed, clock.now, clock.now, EventLog())
    assert [m["name"] for m in orjson.loads(await board.document())["models"]] == ["m"]
    clock.advance(1.0)
    feed.text = exposition(0, state="unloaded").replace(
        'model="m",version="2",state="ready"', 'model="m",version="2",state="unloaded"'
    )
    assert orjson.loads(await board.document())["models"] == []


def test_the_event_log_keeps_recent_warnings_newest_first() -> None:
    events = EventLog(kept=2)
    logger = logging.getLogger("ortserve.test_status")
    logger.addHandler(events)
    try:
        for n in range(3):
            logger.warning("load of %s failed", n)
        logger.info("not kept")
    finally:
        logger.removeHandler(events)
    assert [e["message"] for e in events.recent()] == ["load of 2 failed", "load of 1 failed"]
