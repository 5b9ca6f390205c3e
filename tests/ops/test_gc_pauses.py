"""ortserve_gc_pause_seconds: each collection's start-to-stop time lands in its generation's
histogram, and a real collection is seen once installed."""

from __future__ import annotations

import gc

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ortserve.gc_pauses import GcPauses


def samples(pauses: GcPauses) -> dict[tuple[str, str, str], float]:
    registry = CollectorRegistry()
    registry.register(pauses)
    found = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            found[(s.name, s.labels.get("generation", ""), s.labels.get("le", ""))] = s.value
    return found


def test_a_pause_is_the_time_between_start_and_stop_in_its_generation() -> None:
    now = [10.0]
    pauses = GcPauses(lambda: now[0])
    pauses.callback("start", {"generation": 2})
    now[0] += 0.003
    pauses.callback("stop", {"generation": 2, "collected": 5})
    found = samples(pauses)
    assert found[("ortserve_gc_pause_seconds_count", "2", "")] == 1
    assert found[("ortserve_gc_pause_seconds_sum", "2", "")] == pytest.approx(0.003)
    assert found[("ortserve_gc_pause_seconds_bucket", "2", "0.0025")] == 0
    assert found[("ortserve_gc_pause_seconds_bucket", "2", "0.005")] == 1
    assert found[("ortserve_gc_pause_seconds_count", "0", "")] == 0


def test_installed_it_times_real_collections_and_uninstalled_it_stops() -> None:
    pauses = GcPauses()
    pauses.install()
    try:
        gc.collect(1)
    finally:
        pauses.uninstall()
    assert pauses.pauses[1].count == 1
    gc.collect(1)
    assert pauses.pauses[1].count == 1
