"""The control plane cannot stall or crash the data plane: configurations are measured before
they are parsed, parsed in a child process, and errors name no absolute path."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from model_builders import write_scaled_version
from ortserve.config.bounded import DEFAULT_LIMITS, check_json, check_yaml, load_yaml
from ortserve.errors import ConfigError, ModelLoadFailed
from ortserve.repository.config_source import read_model_source
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.override_parser import OverrideParser
from ortserve.repository.registry import ModelRegistry
from ortserve.server.model_control import ModelControl
from ortserve.settings import ServerSettings


@pytest.fixture
async def control(tmp_path: Path) -> AsyncIterator[ModelControl]:
    root = tmp_path / "models"
    write_scaled_version(root, "m", 1, 1.0)
    manager = LifecycleManager(ModelRegistry(), ServerSettings(root, intra_op_threads=1))
    await manager.start()
    try:
        yield ModelControl(manager, "explicit")
    finally:
        await manager.close(5.0)


def _with_inputs(yaml_text: str) -> str:
    return json.dumps({"parameters": {"ortserve.inputs": {"string_value": yaml_text}}})


async def test_yaml_nested_5000_deep_is_a_400_not_a_traceback(
    control: ModelControl, caplog: pytest.LogCaptureFixture
) -> None:
    """10 KB of ``[`` overflowed the recursive composer: a 500 and a 3,000-line traceback."""
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ConfigError, match="nested deeper than 32|maximum nesting depth") as caught:
        await control.load("m", _with_inputs("[" * 5000 + "]" * 5000))
    assert caught.value.http_status == 400
    assert "Traceback" not in caplog.text and len(caught.value.message) < 300
    with pytest.raises(ConfigError, match="nested deeper than 32"):
        check_yaml("a:\n" + "".join(f"{' ' * (i + 1)}b{i}:\n" for i in range(40)), "config.yaml")


async def test_huge_yaml_or_json_is_refused_before_it_is_parsed(control: ModelControl) -> None:
    """0.8 MB of YAML in ortserve.inputs held every client 16 s; a 36 MB config 10-15 s."""
    many = "\n".join(f"x{i}: {{max: 1}}" for i in range(DEFAULT_LIMITS.max_nodes))
    with pytest.raises(ConfigError, match=f"more than {DEFAULT_LIMITS.max_nodes} values"):
        await control.load("m", _with_inputs(many))
    with pytest.raises(ConfigError, match=f"larger than {DEFAULT_LIMITS.max_bytes} bytes"):
        await control.load("m", json.dumps({"name": "m", "x": "y" * (2 << 20)}))
    with pytest.raises(ConfigError, match="nested deeper"):
        check_json("[" * 100 + "]" * 100, "parameters.config")
    with pytest.raises(ConfigError, match="anchors and aliases"):
        load_yaml("a: &x [1]\nb: *x\n", "parameters.x")
    assert load_yaml("x: {max: 1.5}\n", "parameters.x") == {"x": {"max": 1.5}}


async def test_the_configuration_is_parsed_in_another_process(tmp_path: Path) -> None:
    """A thread still held the GIL while it parsed: the largest accepted configuration stalled
    the loop 9-28 ms. The parse runs in the parser's child; the server only unpickles."""
    root = tmp_path / "models"
    write_scaled_version(root, "m", 1, 1.0)
    manager = LifecycleManager(ModelRegistry(), ServerSettings(root, intra_op_threads=1))
    await manager.start()
    parser = OverrideParser()
    try:
        control = ModelControl(manager, "explicit", parser)
        await control.load("m", json.dumps({"max_batch_size": 4}))
        assert control.config("m", None).max_batch_size == 4
        assert parser.pid not in (None, os.getpid()) and parser.started == 1
        with pytest.raises(ConfigError, match="nested deeper than 32"):
            await control.load("m", _with_inputs("[" * 100 + "]" * 100))
        assert parser.started == 1  # one child, kept: a refusal is an answer, not a failure
    finally:
        parser.close()
        await manager.close(5.0)


async def test_the_unsupported_field_warning_is_one_bounded_line(
    control: ModelControl, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning joined every key: 20 MB log lines."""
    parameters = {f"unknown_{i:05d}": {"string_value": "1"} for i in range(1000)}
    await control.load("m", json.dumps({"parameters": parameters}))
    warnings = [r.getMessage() for r in caplog.records if "not supported" in r.getMessage()]
    assert warnings and all(len(w) < 1000 for w in warnings)


async def test_a_load_that_would_load_nothing_is_a_400_naming_why(control: ModelControl) -> None:
    """A ``default_model_filename`` no version has answered 200 and changed nothing."""
    with pytest.raises(ModelLoadFailed, match="no version folder holds 'absent.onnx'"):
        await control.load("m", json.dumps({"default_model_filename": "absent.onnx"}))
    registry = control._manager.registry  # what serves after the refusal
    assert registry.served_versions("m") == ("1",)
    await control.load("m", None)  # the folder's own configuration, not the refused one
    with pytest.raises(ModelLoadFailed, match="no"):
        await control.load("m", json.dumps({"version_policy": {"specific": {"versions": [9]}}}))


async def test_errors_and_the_index_name_no_absolute_path(control: ModelControl, tmp_path: Path) -> None:
    root = tmp_path / "models"
    folder = root / "m" / "2"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"not a model")
    with pytest.raises(ModelLoadFailed) as caught:
        await control.load("m", None)
    assert str(tmp_path) not in caught.value.message and "m/2/model.onnx" in caught.value.message
    reasons = [row.reason for row in control.index(False)]
    assert any("m/2" in reason for reason in reasons)
    assert not any(str(tmp_path) in reason or reason.count("/") > 8 for reason in reasons)


def test_a_deep_config_yaml_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("inputs: " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(ConfigError, match="nested deeper than 32|maximum nesting depth"):
        read_model_source(tmp_path)
    (tmp_path / "config.yaml").write_text("inputs: " + "[" * 40 + "]" * 40 + "\n")
    with pytest.raises(ConfigError, match="nested deeper than 32"):
        read_model_source(tmp_path)
