"""The dispatch pipeline's answers mean something: near, on-time couriers win, capacity holds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ortserve.apps.dispatch.constraints import MAX_VERTICES
from ortserve.apps.dispatch.decoding import DEADLINE_PASSED, NO_DEADLINE
from ortserve.apps.dispatch.pipeline import DispatchPipeline
from ortserve.apps.dispatch.training import train_dispatch
from ortserve.apps.seeds import SEED_APPS
from ortserve.errors import InvalidInput
from ortserve.pipeline.contract import Pipeline, PipelineContext
from ortserve.pipeline.runtime import PipelineRunner
from ortserve.testing import PipelineHarness, pipeline_harness

NOW = 1_759_017_600_000
MINUTE = 60_000


@pytest.fixture(scope="module")
def dispatch_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dispatch_repo")
    train_dispatch(root / "dispatch" / "1")
    (root / "dispatch" / "config.yaml").write_text(SEED_APPS["dispatch"][1], encoding="utf-8")
    return root


@pytest.fixture
async def harness(dispatch_repository: Path) -> AsyncIterator[PipelineHarness]:
    async with pipeline_harness(dispatch_repository) as loaded:
        yield loaded


def order(identifier: str, lat: float, lon: float, minutes: int = 45) -> dict[str, object]:
    return {"id": identifier, "lat": lat, "lon": lon, "created_at": NOW, "deadline": NOW + minutes * MINUTE}


async def test_the_nearby_courier_wins_over_a_distant_one(harness: PipelineHarness) -> None:
    answer: Any = await harness.call(
        "dispatch",
        {
            "now": NOW,
            "orders": [order("o1", 39.9219, 116.4436)],
            "couriers": [
                {"id": "far", "lat": 39.99, "lon": 116.30, "capacity": 5},
                {"id": "near", "lat": 39.923, "lon": 116.445, "capacity": 5},
            ],
        },
    )
    [result] = answer["orders"]
    assert result["courier_id"] == "near"
    scores = [c["score"] for c in result["candidates"]]
    assert result["candidates"][0]["courier_id"] == "near" and scores == sorted(scores, reverse=True)
    assert 0.0 <= result["candidates"][0]["on_time"] <= 1.0


async def test_a_tight_deadline_lowers_the_on_time_probability(harness: PipelineHarness) -> None:
    couriers = [{"id": "c1", "lat": 39.96, "lon": 116.40, "capacity": 5}]
    relaxed: Any = await harness.call(
        "dispatch", {"orders": [order("o1", 39.92, 116.44, 90)], "couriers": couriers, "now": NOW}
    )
    tight: Any = await harness.call(
        "dispatch", {"orders": [order("o1", 39.92, 116.44, 12)], "couriers": couriers, "now": NOW}
    )
    relaxed_on_time = relaxed["orders"][0]["candidates"][0]["on_time"]
    assert relaxed_on_time > 0.9
    assert tight["orders"][0]["courier_id"] is None
    assert tight["unassigned"][0]["reason"] == NO_DEADLINE


async def test_capacity_holds_across_orders_and_the_rest_are_unassigned_with_a_reason(
    harness: PipelineHarness,
) -> None:
    orders = [order(f"o{i}", 39.92 + i * 0.001, 116.44) for i in range(5)]
    couriers = [
        {"id": "c1", "lat": 39.921, "lon": 116.441, "capacity": 3, "load": 1},
        {"id": "c2", "lat": 39.925, "lon": 116.442, "capacity": 1},
    ]
    answer: Any = await harness.call(
        "dispatch", {"orders": orders, "couriers": couriers, "top_k": 2, "now": NOW}
    )
    assigned = [o["courier_id"] for o in answer["orders"]]
    assert assigned.count("c1") == 2 and assigned.count("c2") == 1
    assert len(answer["unassigned"]) == 2
    assert {u["order_id"] for u in answer["unassigned"]} == {
        o["order_id"] for o in answer["orders"] if o["courier_id"] is None
    }


async def test_orders_given_by_address_are_placed_and_routed(harness: PipelineHarness) -> None:
    document = {
        "orders": [
            {
                "id": "o1",
                "address": "北京市海淀区中关村大街1号",
                "created_at": NOW,
                "deadline": NOW + 40 * MINUTE,
            }
        ],
        "couriers": [{"id": "c1", "lat": 39.96, "lon": 116.30, "capacity": 2}],
        "now": NOW,
    }
    answer: Any = await harness.post("/v1/route", orjson.dumps(document))
    [result] = answer["orders"]
    assert result["placed_in"] == "海淀区" and result["courier_id"] == "c1"
    assert (result["road"], result["number"], result["precision"]) == ("中关村大街", "1", "road")
    # 中关村大街 is the gazetteer's road point (39.975, 116.316), not 海淀区's centre.
    assert result["candidates"][0]["distance_km"] == pytest.approx(2.3, abs=0.2)


async def test_a_bad_address_among_good_orders_leaves_only_that_order_unassigned(
    harness: PipelineHarness,
) -> None:
    mars = {"id": "mars", "address": "火星基地1号", "created_at": NOW, "deadline": NOW + 40 * MINUTE}
    couriers = [{"id": "c1", "lat": 39.921, "lon": 116.441, "capacity": 3}]
    document = {"orders": [order("o1", 39.92, 116.44), mars], "couriers": couriers, "now": NOW}
    answer: Any = await harness.call("dispatch", document)
    assert [o["courier_id"] for o in answer["orders"]] == ["c1"]
    [failed] = answer["unassigned"]
    assert failed["order_id"] == "mars" and "orders[1].address" in failed["reason"]


async def test_without_now_the_server_clock_decides_what_is_still_deliverable(
    harness: PipelineHarness, dispatch_repository: Path
) -> None:
    clock_ms = NOW + 50 * MINUTE
    context = PipelineContext("dispatch", "1", dispatch_repository / "dispatch" / "1")
    pipeline: Pipeline[Any] = DispatchPipeline(context, clock=lambda: clock_ms / 1000)
    runner = await PipelineRunner.build(pipeline, harness.registry)
    couriers = [{"id": "c1", "lat": 39.96, "lon": 116.40, "capacity": 5}]
    orders = [order("soon", 39.92, 116.44, 60), order("gone", 39.92, 116.44, 40)]
    late: Any = await runner.run({"orders": orders, "couriers": couriers})
    assert late["now"] == clock_ms
    reasons = {u["order_id"]: u["reason"] for u in late["unassigned"]}
    assert reasons == {"soon": NO_DEADLINE, "gone": DEADLINE_PASSED}
    early: Any = await runner.run({"orders": orders, "couriers": couriers, "now": NOW})
    assert [o["courier_id"] for o in early["orders"]] == ["c1", "c1"] and early["unassigned"] == []


async def test_min_on_time_per_request_decides_eligibility(harness: PipelineHarness) -> None:
    couriers = [{"id": "c1", "lat": 39.96, "lon": 116.40, "capacity": 5}]
    document = {"orders": [order("o1", 39.92, 116.44, 25)], "couriers": couriers, "now": NOW}
    probe: Any = await harness.call("dispatch", {**document, "min_on_time": 0.0})
    on_time = probe["orders"][0]["candidates"][0]["on_time"]
    assert 0.05 < on_time < 0.95
    below: Any = await harness.call("dispatch", {**document, "min_on_time": on_time - 0.01})
    above: Any = await harness.call("dispatch", {**document, "min_on_time": min(on_time + 0.01, 1.0)})
    assert below["orders"][0]["courier_id"] == "c1" and above["orders"][0]["courier_id"] is None


async def test_a_large_or_weighted_instance_is_solved_off_the_event_loop(
    harness: PipelineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The assignment of a large instance (or the MIP of unequal weights, up to its 1 s budget)
    # on the loop stalled every client of the server; only a tiny unit-weight one stays there.
    import threading

    from ortserve.apps.dispatch.decoding import decode as real_decode

    threads: list[int] = []

    def recording_decode(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return real_decode(*args, **kwargs)

    monkeypatch.setattr("ortserve.apps.dispatch.pipeline.decode", recording_decode)
    loop_thread = threading.get_ident()
    couriers = [{"id": f"c{i}", "lat": 39.92 + i / 1000, "lon": 116.44, "capacity": 2} for i in range(10)]
    large = {
        "now": NOW,
        "orders": [order(f"o{i}", 39.921 + i / 2000, 116.443) for i in range(12)],
        "couriers": couriers,
    }
    weighted = {
        "now": NOW,
        "orders": [{**order("w1", 39.9219, 116.4436), "weight": 1.5}],
        "couriers": couriers[:2],
    }
    tiny = {"now": NOW, "orders": [order("t1", 39.9219, 116.4436)], "couriers": couriers[:2]}
    for document in (large, weighted, tiny):
        answer: Any = await harness.call("dispatch", document)
        assert len(answer["orders"]) == len(document["orders"])  # type: ignore[arg-type]
    assert threads[0] != loop_thread and threads[1] != loop_thread
    assert threads[2] == loop_thread


async def test_an_address_in_another_city_is_outside_the_service_area_with_its_distance(
    harness: PipelineHarness,
) -> None:
    hangzhou = {
        "id": "hz",
        "address": "浙江省杭州市西湖区文三路1号",
        "created_at": NOW,
        "deadline": NOW + 40 * MINUTE,
    }
    couriers = [{"id": "c1", "lat": 39.921, "lon": 116.441, "capacity": 3}]
    document = {"orders": [order("o1", 39.92, 116.44), hangzhou], "couriers": couriers, "now": NOW}
    answer: Any = await harness.post("/v1/route", orjson.dumps(document))
    assert [o["courier_id"] for o in answer["orders"]] == ["c1", None]
    assert answer["orders"][1]["city"] == "杭州市"
    [far] = answer["unassigned"]
    assert far["order_id"] == "hz" and "outside the service area" in far["reason"]
    km = float(far["reason"].split(" is ")[1].split(" km")[0].replace(",", ""))
    assert 1_000 < km < 1_300  # Beijing to Hangzhou, about 1,100 km


async def test_an_unknown_order_field_keeps_the_order_and_is_named_in_its_answer(
    harness: PipelineHarness,
) -> None:
    mine = order("o1", 39.92, 116.44) | {"priority": "high"}
    couriers = [{"id": "c1", "lat": 39.921, "lon": 116.441, "capacity": 3}]
    answer: Any = await harness.post(
        "/v1/route", orjson.dumps({"orders": [mine], "couriers": couriers, "now": NOW})
    )
    [result] = answer["orders"]
    assert result["courier_id"] == "c1" and result["ignored_fields"] == ["priority"]
    assert answer["unassigned"] == []


async def test_an_orders_value_decides_which_orders_a_full_courier_takes(harness: PipelineHarness) -> None:
    heavy = order("heavy", 39.92, 116.44) | {"weight": 2}
    light = [order(f"light{i}", 39.92, 116.44) for i in range(2)]
    couriers = [{"id": "c1", "lat": 39.921, "lon": 116.441, "capacity": 2}]
    plain: Any = await harness.post(
        "/v1/route", orjson.dumps({"orders": [heavy, *light], "couriers": couriers, "now": NOW})
    )
    assert {o["order_id"] for o in plain["orders"] if o["courier_id"]} == {"light0", "light1"}
    valued = [heavy | {"value": 3}, *light]
    answer: Any = await harness.post(
        "/v1/route", orjson.dumps({"orders": valued, "couriers": couriers, "now": NOW})
    )
    assert [o["order_id"] for o in answer["orders"] if o["courier_id"]] == ["heavy"]


async def test_pareto_filter_leaves_out_dominated_candidates_but_keeps_the_assigned_courier(
    harness: PipelineHarness,
) -> None:
    couriers = [
        {"id": "near", "lat": 39.921, "lon": 116.441, "capacity": 3},
        {"id": "far", "lat": 39.99, "lon": 116.55, "capacity": 3},
    ]
    document: dict[str, Any] = {"orders": [order("o1", 39.92, 116.44, 90)], "couriers": couriers, "now": NOW}
    marked: Any = await harness.post("/v1/route", orjson.dumps(document))
    assert {c["courier_id"]: c["pareto"] for c in marked["orders"][0]["candidates"]} == {
        "near": True,
        "far": False,
    }
    filtered: Any = await harness.post("/v1/route", orjson.dumps(document | {"pareto": "filter"}))
    [result] = filtered["orders"]
    assert result["courier_id"] == "near" and [c["courier_id"] for c in result["candidates"]] == ["near"]


MORNING_PEAK = {"kind": "peak", "name": "morning", "start": "07:30", "end": "09:30", "speed_factor": 0.5}
"""NOW is 08:00 China time: the whole trip falls in this window."""


def without_floor(document: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in document.items() if key != "min_on_time"}


async def test_a_rush_hour_peak_lowers_the_on_time_probability_and_is_named(harness: PipelineHarness) -> None:
    couriers = [{"id": "c1", "lat": 39.96, "lon": 116.40, "capacity": 5}]
    document: dict[str, Any] = {"orders": [order("o1", 39.92, 116.44, 40)], "couriers": couriers, "now": NOW}
    document["min_on_time"] = 0.0
    plain: Any = await harness.post("/v1/route", orjson.dumps(document))
    peak: Any = await harness.post("/v1/route", orjson.dumps(document | {"constraints": [MORNING_PEAK]}))
    evening = MORNING_PEAK | {"start": "17:00", "end": "19:00"}
    later: Any = await harness.post("/v1/route", orjson.dumps(document | {"constraints": [evening]}))
    [before], [during], [outside] = plain["orders"], peak["orders"], later["orders"]
    assert during["candidates"][0]["on_time"] < before["candidates"][0]["on_time"] - 0.1
    assert during["constraints"] == ["morning"] and "constraints" not in before
    assert outside["candidates"] == before["candidates"] and "constraints" not in outside
    # At the default floor (min_on_time 0.5) the slowed courier is no longer eligible.
    strict: Any = await harness.call("dispatch", without_floor(document) | {"constraints": [MORNING_PEAK]})
    assert strict["orders"][0]["courier_id"] is None and strict["unassigned"][0]["reason"] == NO_DEADLINE


async def test_a_forbidden_zone_unassigns_its_orders_with_the_zones_name_and_a_walk_costs_time(
    harness: PipelineHarness,
) -> None:
    square = [[39.915, 116.435], [39.915, 116.445], [39.925, 116.445], [39.925, 116.435]]
    couriers = [{"id": "c1", "lat": 39.921, "lon": 116.441, "capacity": 5}]
    orders = [order("inside", 39.92, 116.44, 20), order("outside", 39.93, 116.44, 20)]
    walk = {"kind": "no_stopping", "name": "mall", "polygon": square, "walk_minutes": 10}
    document: dict[str, Any] = {"orders": orders, "couriers": couriers, "now": NOW}
    plain: Any = await harness.post("/v1/route", orjson.dumps(document))
    walked: Any = await harness.post("/v1/route", orjson.dumps(document | {"constraints": [walk]}))
    assert walked["orders"][0]["constraints"] == ["mall"] and "constraints" not in walked["orders"][1]
    assert walked["orders"][0]["candidates"][0]["on_time"] < plain["orders"][0]["candidates"][0]["on_time"]
    assert walked["orders"][1]["candidates"] == plain["orders"][1]["candidates"]
    barred = walk | {"forbidden": True}
    answer: Any = await harness.post("/v1/route", orjson.dumps(document | {"constraints": [barred]}))
    assert [o["courier_id"] for o in answer["orders"]] == [None, "c1"]
    assert answer["orders"][0]["candidates"] == []
    [unassigned] = answer["unassigned"]
    assert unassigned["order_id"] == "inside" and "no-stopping zone 'mall'" in unassigned["reason"]


async def test_a_bad_constraint_fails_the_request_naming_its_field(harness: PipelineHarness) -> None:
    couriers = [{"id": "c1", "lat": 39.921, "lon": 116.441, "capacity": 5}]
    bad = {"kind": "no_stopping", "polygon": [[39.9, 116.4]] * (MAX_VERTICES + 1)}
    document = {"orders": [order("o1", 39.92, 116.44)], "couriers": couriers, "constraints": [bad]}
    with pytest.raises(InvalidInput, match=r"constraints\[0\]\.polygon") as raised:
        await harness.post("/v1/route", orjson.dumps(document))
    assert raised.value.http_status == 400
