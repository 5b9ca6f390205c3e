"""Triton's trace settings (level, rate, count, file), global and per model, deciding spans."""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from ortserve.errors import InvalidInput
from ortserve.testing import run_server
from ortserve.trace_settings import TraceControl, rate_of_ratio

SAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def admitted(control: TraceControl, model: str, requests: int) -> list[int]:
    return [i for i in range(requests) if control.admit(model)]


def test_a_rate_of_n_traces_one_request_in_n_starting_with_the_first() -> None:
    control = TraceControl(True, 3, "otlp")
    assert admitted(control, "m", 7) == [0, 3, 6]


def test_a_count_stops_tracing_once_spent_and_shows_what_is_left() -> None:
    control = TraceControl(True, 1, "otlp")
    control.update({"trace_count": "2"})
    assert admitted(control, "m", 5) == [0, 1]
    assert control.view()["trace_count"] == "0"


def test_a_models_own_settings_override_the_global_ones_and_null_clears_them() -> None:
    control = TraceControl(True, 1, "otlp")
    assert control.update({"trace_level": ["OFF"]}, "quiet")["trace_level"] == ["OFF"]
    control.update({"trace_rate": "2"}, "sparse")
    assert admitted(control, "quiet", 3) == []
    assert admitted(control, "sparse", 4) == [0, 2]
    assert admitted(control, "other", 2) == [0, 1]
    assert control.update({"trace_level": None}, "quiet")["trace_level"] == ["TIMESTAMPS"]
    assert admitted(control, "quiet", 2) == [0, 1]


def test_a_callers_sampled_flag_skips_the_rate_but_not_the_level() -> None:
    control = TraceControl(True, 100, "otlp")
    assert [control.admit("m", caller_sampled=True) for _ in range(3)] == [True, True, True]
    control.update({"trace_level": "OFF"})
    assert not control.admit("m", caller_sampled=True)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"trace_level": ["TENSORS"]}, "TENSORS is not supported"),
        ({"trace_level": ["LOUD"]}, "OFF or TIMESTAMPS"),
        ({"trace_rate": "0"}, "trace_rate"),
        ({"trace_count": "-2"}, "trace_count"),
        ({"trace_file": "/etc/cron.d/x"}, "cannot be set over the API"),
        ({"log_frequency": "10"}, "log_frequency"),
        ({"trace_rate": "9" * 40}, "trace_rate"),
        ({"verbose": True}, "unknown trace setting"),
    ],
)
def test_bad_settings_are_refused_and_change_nothing(changes: dict[str, object], reason: str) -> None:
    control = TraceControl(True, 5, "otlp")
    before = control.view()
    with pytest.raises(InvalidInput, match=reason):
        control.update({"trace_count": "3", **changes})
    assert control.view() == before


def test_without_tracing_at_start_the_level_is_off_and_cannot_be_turned_on() -> None:
    control = TraceControl(False)
    assert control.view()["trace_level"] == ["OFF"]
    with pytest.raises(InvalidInput, match="--trace-sampling-ratio"):
        control.update({"trace_level": ["TIMESTAMPS"]})
    assert not control.admit("m")


@pytest.mark.parametrize(("ratio", "rate"), [(1.0, 1), (0.5, 2), (0.01, 100), (0.3, 3), (0.0, 1)])
def test_the_start_up_sampling_ratio_becomes_a_rate(ratio: float, rate: int) -> None:
    assert rate_of_ratio(ratio) == rate


@pytest.mark.e2e
def test_tritonclient_reads_and_changes_the_trace_settings_of_a_traced_server(
    demo_repository: Path, tmp_path: Path
) -> None:
    """Over both transports, against a server started with tracing (console exporter)."""
    args = ["--trace-sampling-ratio", "0.25", "--trace-exporter", "console", "--metrics-port", "-1"]
    with run_server(demo_repository, tmp_path / "server.log", args) as server:
        http = httpclient.InferenceServerClient(server.http_address)
        grpc = grpcclient.InferenceServerClient(server.grpc_address)
        try:
            assert http.get_trace_settings()["trace_rate"] == "4"
            assert http.get_trace_settings()["trace_level"] == ["TIMESTAMPS"]
            assert http.get_trace_settings()["trace_file"] == "console"
            changed = grpc.update_trace_settings(
                "small_mlp", {"trace_rate": "10", "trace_count": "3"}, as_json=True
            )
            assert changed["settings"]["trace_rate"]["value"] == ["10"]
            assert http.get_trace_settings("small_mlp")["trace_count"] == "3"
            assert http.get_trace_settings()["trace_count"] == "-1"  # the global ones are untouched
            assert http.update_trace_settings(settings={"trace_level": ["OFF"]})["trace_level"] == ["OFF"]
            with pytest.raises(InferenceServerException, match="TENSORS is not supported"):
                http.update_trace_settings(settings={"trace_level": ["TENSORS"]})
        finally:
            http.close()
            grpc.close()
    assert "tracing on: 1 request in 4 traced" in server.log()
    assert "spans exported to the console (stdout)" in server.log()
