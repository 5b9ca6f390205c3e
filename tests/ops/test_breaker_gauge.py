"""ortserve_breaker_open: one series per level of a version behind a fallback chain, 1 while
the level's breaker is open or half-open, none for a version without a chain."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from ortserve.metrics import ServerMetrics, VersionState


def breaker_series(text: str) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["model"], s.labels["version"], s.labels["level"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "ortserve_breaker_open"
    }


def test_each_level_of_a_chain_has_a_breaker_series_that_is_one_while_open() -> None:
    chained = VersionState(
        "m", "1", "ready", "CPUExecutionProvider", 0, 0, 0.1, 1, breakers_open=((0, True), (1, False))
    )
    plain = VersionState("p", "1", "ready", "CPUExecutionProvider", 0, 0, 0.1)
    metrics = ServerMetrics(lambda: [chained, plain], lambda: {"http": 0, "grpc": 0})
    assert breaker_series(metrics.exposition().decode()) == {("m", "1", "0"): 1.0, ("m", "1", "1"): 0.0}
