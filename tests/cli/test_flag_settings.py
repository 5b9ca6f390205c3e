"""Every ``serve`` flag lands in a settings field (or steers the command), and every settings
field without a default has a flag: a setting is declared as a field and a flag, once each."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
import pytest

from ortserve.cli.flag_settings import COMMAND_ONLY, RENAMED, settings_from_flags
from ortserve.cli.serve import serve
from ortserve.settings import ServerSettings


def _flags() -> dict[str, click.Parameter]:
    return {param.name: param for param in serve.params if param.name is not None}


def test_every_flag_lands_in_a_field_or_steers_the_command() -> None:
    fields = {field.name for field in dataclasses.fields(ServerSettings)}
    homeless = [f for f in _flags() if f not in COMMAND_ONLY and RENAMED.get(f, f) not in fields]
    assert homeless == []


def test_every_field_without_a_default_has_a_flag() -> None:
    landed = {RENAMED.get(f, f) for f in _flags()}
    required = [
        field.name
        for field in dataclasses.fields(ServerSettings)
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
    ]
    assert [name for name in required if name not in landed] == []


def test_the_flags_build_the_settings_and_a_stray_flag_is_refused() -> None:
    # The flags as click hands them to serve() (defaults unconverted: the settings take them as given).
    flags = {name: param.default for name, param in _flags().items()}
    flags |= {"model_repository": Path("models"), "header_timeout": 7.0, "api_key": ("k",)}
    settings = settings_from_flags(flags)
    assert (settings.model_repository, settings.header_timeout_s) == (Path("models"), 7.0)
    assert settings.api_keys == ("k",)
    with pytest.raises(TypeError, match="--no-such-flag"):
        settings_from_flags({**flags, "no_such_flag": 1})
