"""The child process that parses load requests' configurations: answers, refusals and log
lines cross over as they would from a thread; a child that hangs or dies is replaced; with no
child at all the parse falls back to a thread."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator

import pytest

from ortserve.errors import ConfigError
from ortserve.repository.override_parser import OverrideParser, ParserFailed, parse_override

_CONFIG = json.dumps(
    {"max_batch_size": 4, "parameters": {"ortserve.inputs": {"string_value": "x: {min: 0, max: 1}"}}}
)


@pytest.fixture
def parser() -> Iterator[OverrideParser]:
    parsing = OverrideParser(timeout_s=60.0)
    yield parsing
    parsing.close()


async def test_the_child_answers_what_a_thread_would(parser: OverrideParser) -> None:
    source = await parser.parse(_CONFIG, "m")
    assert source == parse_override(_CONFIG, "m")
    assert source.config.batching.max_batch_size == 4 and parser.started == 1


async def test_refusals_cross_as_config_errors_and_recursion_is_a_400(parser: OverrideParser) -> None:
    deep = json.dumps({"parameters": {"ortserve.inputs": {"string_value": "[" * 5000 + "]" * 5000}}})
    with pytest.raises(ConfigError, match="nested deeper than 32|maximum nesting depth") as caught:
        await parser.parse(deep, "m")
    assert caught.value.http_status == 400 and len(caught.value.message) < 300
    with pytest.raises(ConfigError, match="provider .* names a file"):
        await parser.parse(
            json.dumps(
                {
                    "optimization": {
                        "execution_accelerators": {
                            "gpu_execution_accelerator": [
                                {"name": "tensorrt", "parameters": {"trt_engine_cache_path": "/tmp/x"}}
                            ]
                        }
                    }
                }
            ),
            "m",
        )
    assert parser.started == 1


async def test_the_childs_log_lines_are_logged_here_bounded(
    parser: OverrideParser, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    parameters = {f"unknown_{i:05d}": {"string_value": "1"} for i in range(1000)}
    await parser.parse(json.dumps({"parameters": parameters}), "m")
    lines = [r for r in caplog.records if "not supported" in r.getMessage()]
    assert len(lines) == 1 and lines[0].name == "ortserve.repository.triton_config"
    assert len(lines[0].getMessage()) < 1000


async def test_a_child_that_hangs_is_killed_and_replaced() -> None:
    hangs = [sys.executable, "-c", "import signal; signal.pause()"]  # no answer until killed
    parser = OverrideParser(timeout_s=0.5, command=hangs)
    try:
        with pytest.raises(ParserFailed, match="no answer in time"):
            await parser.parse(_CONFIG, "m")
        assert parser.pid is None
        parser.command = [sys.executable, "-m", "ortserve.repository.override_parser"]
        parser.timeout_s = 60.0
        assert (await parser.parse(_CONFIG, "m")).config.batching.max_batch_size == 4
        assert parser.started == 2
    finally:
        parser.close()


async def test_a_child_that_dies_is_a_failure_then_replaced() -> None:
    parser = OverrideParser(command=[sys.executable, "-c", "import sys; sys.stdin.read(1)"])
    try:
        with pytest.raises(ParserFailed, match="exited"):
            await parser.parse(_CONFIG, "m")
        with pytest.raises(ParserFailed):
            await parser.parse(_CONFIG, "m")
        assert parser.started == 2
    finally:
        parser.close()


async def test_no_child_at_all_parses_in_a_thread(caplog: pytest.LogCaptureFixture) -> None:
    parser = OverrideParser(command=["/nonexistent/python"])
    try:
        source = await parser.parse(_CONFIG, "m")
        assert source == parse_override(_CONFIG, "m") and parser.started == 0
        with pytest.raises(ConfigError, match="nested deeper"):
            await parser.parse(
                json.dumps({"parameters": {"ortserve.inputs": {"string_value": "[" * 99 + "]" * 99}}}), "m"
            )
        assert sum("parsing in a thread" in r.getMessage() for r in caplog.records) == 1
    finally:
        parser.close()
