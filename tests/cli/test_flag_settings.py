"""A setting is declared once (a field of ServerSettings made by ``setting()``): its flag, its
environment variable, its ``--help`` line and the README's row all come from that declaration,
and the flags build the settings with nothing mapped by hand."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from ortserve.cli.flag_settings import command_and_settings, settings_from_flags
from ortserve.cli.serve import serve
from ortserve.cli.serve_options import ServeCommand, flag_of, markdown_table, settings_fields
from ortserve.settings import ServerSettings

README = Path(__file__).resolve().parents[2] / "README.md"


def _options() -> dict[str, click.Option]:
    return {p.name: p for p in serve.params if isinstance(p, click.Option) and p.name is not None}


def test_every_flagged_field_is_one_flag_with_its_environment_variable_and_help() -> None:
    options = _options()
    declared = list(settings_fields())
    assert sorted(options) == sorted(field.name for field, _, _ in declared)
    for field, flag, _ in declared:
        option = options[field.name]
        assert flag_of(field, flag) in option.opts
        assert option.envvar == "ORTSERVE_" + flag_of(field, flag)[2:].replace("-", "_").upper()
        assert option.help == flag.help and flag.help
    unflagged = {f.name for f in dataclasses.fields(ServerSettings)} - set(options)
    assert unflagged == {"max_json_depth", "max_tensor_elements", "max_bytes_element", "reuse_port"}


def test_the_flags_build_the_settings_and_the_command_and_a_stray_flag_is_refused(tmp_path: Path) -> None:
    seen: list[tuple[ServeCommand, ServerSettings]] = []

    def record(**flags: object) -> None:
        seen.append(command_and_settings(flags))

    probe = click.Command("probe", params=serve.params, callback=record)  # serve's flags, not its run
    env = {"ORTSERVE_HEADER_TIMEOUT": "7", "ORTSERVE_TENANT_QUOTA": "requests=5,tokens=100"}
    args = ["--model-repository", str(tmp_path), "--api-key", "k1", "--api-key", "k2", "--workers", "3"]
    args += ["--metrics-buckets", "0.1,1", "--no-metrics", "--log-level", "debug"]
    result = CliRunner().invoke(probe, args, env=env)
    assert result.exit_code == 0, result.output
    command, settings = seen[0]
    assert (command.workers, command.demo) == (3, False)
    assert settings.model_repository == tmp_path and settings.header_timeout_s == 7.0
    assert settings.api_keys == ("k1", "k2") and settings.metrics_buckets == (0.1, 1.0)
    assert settings.tenant_quota == "requests=5,tokens=100" and settings.metrics is False
    assert settings.log_level == "DEBUG"
    bad = CliRunner().invoke(probe, [*args, "--tenant-quota", "speed=3"])
    assert bad.exit_code == 2 and "--tenant-quota" in bad.output
    with pytest.raises(TypeError, match="--no-such-flag"):
        settings_from_flags({"model_repository": tmp_path, "no_such_flag": 1})


def test_the_readme_table_is_the_generated_one() -> None:
    text = README.read_text(encoding="utf-8")
    found = re.search(r"<!-- serve-flags:[^>]*-->\n(.*?)<!-- /serve-flags -->", text, re.S)
    assert found is not None, "README.md lost its generated table of serve flags"
    assert found.group(1) == markdown_table(), "regenerate: python -m ortserve.cli.serve_options"
