"""Triton's log settings: severities on and off, verbosity, format; refusals change nothing."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from ortserve.errors import InvalidInput
from ortserve.log_settings import LogControl
from ortserve.logs import make_formatter
from ortserve.testing import run_server


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger of its own with one text handler, as configure_logging makes the root's.

    pytest adds its capture handlers to a logger that does not propagate: the test keeps only
    its own (``only_ours``), or the settings would filter and format pytest's for later tests.
    """
    logger = logging.getLogger(f"log-settings-test-{id(object())}")
    logger.propagate = False
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(make_formatter("text"))
    logger.setLevel(logging.INFO)
    logger.handlers[:] = [handler]
    yield logger, stream
    logger.handlers[:] = []


def only_ours(logger: logging.Logger) -> None:
    logger.handlers[:] = [h for h in logger.handlers if type(h) is logging.StreamHandler]


def emit_all(logger: logging.Logger) -> None:
    for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR):
        logger.log(level, "at %s", logging.getLevelName(level))


def test_each_severity_is_switched_on_and_off(logged: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = logged
    only_ours(logger)
    control = LogControl("text", "INFO", logger)
    control.update({"log_warning": False, "log_verbose_level": 1})
    emit_all(logger)
    lines = stream.getvalue()
    assert "at DEBUG" in lines and "at INFO" in lines and "at ERROR" in lines
    assert "at WARNING" not in lines


def test_the_format_changes_to_json_lines(logged: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = logged
    only_ours(logger)
    assert LogControl("text", "INFO", logger).update({"log_format": "json"})["log_format"] == "json"
    logger.info("hello")
    assert json.loads(stream.getvalue().splitlines()[-1])["message"] == "hello"


def test_a_start_up_level_shows_as_the_severities_it_lets_through() -> None:
    view = LogControl("json", "WARNING").view()
    assert (view["log_info"], view["log_warning"], view["log_verbose_level"]) == (False, True, 0)
    assert view["log_format"] == "json"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"log_file": "/var/log/x"}, "log_file cannot be set"),
        ({"log_info": "yes"}, "true or false"),
        ({"log_verbose_level": -1}, "log_verbose_level"),
        ({"log_format": "xml"}, "log_format"),
        ({"log_level": 3}, "unknown log setting"),
    ],
)
def test_bad_settings_are_refused_and_change_nothing(changes: dict[str, object], reason: str) -> None:
    control = LogControl("text", "INFO", logging.getLogger("log-settings-untouched"))
    before = control.view()
    with pytest.raises(InvalidInput, match=reason):
        control.update({"log_info": False, **changes})
    assert control.view() == before


@pytest.mark.e2e
def test_tritonclient_turns_the_servers_log_to_json_over_grpc_and_reads_it_over_http(
    demo_repository: Path, tmp_path: Path
) -> None:
    with run_server(demo_repository, tmp_path / "server.log", ["--metrics-port", "-1"]) as server:
        http = httpclient.InferenceServerClient(server.http_address)
        grpc = grpcclient.InferenceServerClient(server.grpc_address)
        try:
            assert http.get_log_settings()["log_format"] == "text"
            grpc.update_log_settings({"log_format": "json", "log_verbose_level": 0})
            assert http.get_log_settings()["log_format"] == "json"
            with pytest.raises(InferenceServerException, match="log_file cannot be set"):
                http.update_log_settings({"log_file": "/tmp/elsewhere.log"})
        finally:
            http.close()
            grpc.close()
        assert server.stop() == 0
    last = server.log().strip().splitlines()[-1]
    assert json.loads(last)["level"] == "INFO"  # the shutdown lines came out as JSON
