"""A request that outlived its client's deadline is a ``deadline`` outcome, whether it was
missed in the queue (DeadlineExceeded) or foreseen at admission (DeadlineUnmeetable, which is
also an Overloaded with a retry hint): it is a 504, not a 429. The outcome values the alerts and
dashboards under deploy/ select are ones the server produces."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ortserve import errors
from ortserve.dashboards import boards
from ortserve.errors import DeadlineExceeded, DeadlineUnmeetable, OrtServeError, Overloaded
from ortserve.metrics import ServerMetrics, outcome_of
from ortserve.statistics import ServerStatistics
from ortserve.telemetry import Telemetry

ROOT = Path(__file__).resolve().parents[2]


def test_a_deadline_missed_or_foreseen_is_a_deadline_outcome_and_a_full_queue_is_overloaded() -> None:
    assert outcome_of(DeadlineUnmeetable("cannot meet 5 ms", retry_after_s=1.0)) == "deadline"
    assert outcome_of(DeadlineExceeded("passed while queued")) == "deadline"
    assert outcome_of(Overloaded("queue full")) == "overloaded"


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_an_edge_refusal_for_an_unmeetable_deadline_is_counted_as_deadline(transport: str) -> None:
    metrics = ServerMetrics(lambda: [], lambda: {})
    telemetry = Telemetry(ServerStatistics(), metrics)
    telemetry.refused(transport, "m", "1", DeadlineUnmeetable("cannot meet 5 ms", retry_after_s=1.0), 1e-5)
    counts = {
        (_label(line, "outcome"), _label(line, "transport")): float(line.rsplit(" ", 1)[1])
        for line in metrics.exposition().decode().splitlines()
        if line.startswith("ortserve_requests_total{")
    }
    assert counts[("deadline", transport)] == 1.0
    assert counts[("overloaded", transport)] == 0.0


def _label(line: str, name: str) -> str:
    found = re.search(rf'{name}="([^"]*)"', line)
    assert found is not None
    return found.group(1)


def _outcomes_produced() -> set[str]:
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, OrtServeError)]
    produced = {"success"}
    for cls in classes:
        error = cls.__new__(cls)  # the class decides the outcome, not its arguments
        produced.add(outcome_of(error))
    return produced


def _outcomes_selected(text: str) -> set[str]:
    found: set[str] = set()
    for match in re.finditer(r'outcome\s*=~?\s*\\?"([a-z|]+)\\?"', text):
        found.update(match.group(1).split("|"))
    return found


def test_every_outcome_the_alerts_and_dashboards_select_is_one_the_server_produces() -> None:
    files = [
        *ROOT.joinpath("deploy").rglob("*.yaml"),
        *ROOT.joinpath("deploy").rglob("*.json"),
        Path(boards.__file__),
    ]
    selected = set().union(*(_outcomes_selected(f.read_text(encoding="utf-8")) for f in files))
    tenant_outcomes = {"admitted", "refused"}  # ortserve_tenant_requests_total's own
    assert {"deadline", "overloaded"} <= selected
    assert selected - tenant_outcomes <= _outcomes_produced()
