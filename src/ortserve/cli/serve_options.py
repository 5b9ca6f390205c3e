"""The ``serve`` command's flags, made from the settings' one declaration.

Every field of :class:`~ortserve.settings.ServerSettings` declared with a
:class:`~ortserve.settings.Flag` becomes a flag named after it (or its ``Flag.name``), with the
``ORTSERVE_*`` environment variable of that name, its default, its bounds or choices and its
help; the few flags the command acts on itself before a server exists are declared the same
way in :class:`ServeCommand`. The README's table of server flags is :func:`markdown_table`
(``python -m ortserve.cli.serve_options`` prints it; ``tests/cli/test_flag_settings.py``
fails when the README differs).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from ortserve.settings import Flag, ServerSettings, setting

__all__ = ["ServeCommand", "flag_of", "markdown_table", "serve_options", "settings_fields"]

_FC = TypeVar("_FC", bound=Callable[..., object])


@dataclass(frozen=True, slots=True)
class ServeCommand:
    """The flags the ``serve`` command reads itself, before the server exists."""

    model_name: str | None = setting(
        None,
        "Serve the repository's one model (or the model folder it is) under this name "
        "(KServe: the InferenceService's name, {{.Name}}).",
    )
    workers: int = setting(
        1,
        "Server processes sharing the ports (SO_REUSEPORT) under one supervisor that restarts "
        "them and serves one aggregated /metrics, statistics and repository API; 'auto': one per "
        "usable CPU (see docs/deploy.md).",
        parse="ortserve.supervisor.plan:parse_workers",
    )
    demo: bool = setting(False, "Write the demo models into the repository first if it is empty.")
    ort_telemetry: bool = setting(
        False, "Let ONNX Runtime collect its telemetry (off: ORT_DISABLE_TELEMETRY=1, no device-id store)."
    )


def settings_fields() -> Iterator[tuple[dataclasses.Field[Any], Flag, Any]]:
    """Every flagged field of the settings, then of the command: (field, its flag, its type)."""
    for table in (ServerSettings, ServeCommand):
        hints = typing.get_type_hints(table)
        for field in dataclasses.fields(table):
            flag = field.metadata.get("flag")
            if flag is not None:
                yield field, flag, hints[field.name]


def flag_of(field: dataclasses.Field[Any], flag: Flag) -> str:
    """``--header-timeout``: the flag's name on the command line."""
    return "--" + (flag.name or field.name.replace("_", "-"))


def _parser(flag: Flag) -> Callable[[click.Context, click.Parameter, Any], Any]:
    module, _, name = flag.parse.partition(":")

    def parse(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            return None
        read = getattr(importlib.import_module(module), name)  # imported when a value is given
        try:
            parsed = read(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
        return value if flag.check_only else parsed

    return parse


def _plain(kind: Any) -> tuple[Any, bool]:
    """(the type without ``| None``, whether None is allowed)."""
    if isinstance(kind, types.UnionType):
        rest = [k for k in typing.get_args(kind) if k is not type(None)]
        return rest[0], len(rest) < len(typing.get_args(kind))
    return kind, False


def _click_type(flag: Flag, kind: Any) -> Any:
    if flag.choices:
        return click.Choice(flag.choices, case_sensitive=False)
    if kind is Path:
        return click.Path(
            exists=flag.exists,
            file_okay=flag.path != "dir",
            dir_okay=flag.path != "file",
            path_type=Path,
        )
    if kind is int:
        low, high = flag.low, flag.high
        if low is None and high is None:
            return int
        return click.IntRange(None if low is None else int(low), None if high is None else int(high))
    if kind is float:
        if flag.low is None and flag.high is None:
            return float
        return click.FloatRange(flag.low, flag.high)
    return str


def _option(field: dataclasses.Field[Any], flag: Flag, kind: Any) -> Callable[[_FC], _FC]:
    name = flag_of(field, flag)
    envvar = "ORTSERVE_" + name[2:].replace("-", "_").upper()
    plain, _ = _plain(kind)
    required = field.default is dataclasses.MISSING
    options: dict[str, Any] = {"envvar": envvar, "help": flag.help}
    if not required:
        options["default"] = field.default
    if plain is bool:
        return click.option(f"{name}/--no-{name[2:]}", field.name, **options)
    if typing.get_origin(plain) is tuple and not flag.parse:
        return click.option(name, field.name, multiple=True, **options)
    if flag.parse:
        options["callback"] = _parser(flag)
        if field.default is not None and not required:
            options["default"] = str(field.default)
    else:
        options["type"] = _click_type(flag, plain)
    return click.option(name, field.name, required=required, **options)


def serve_options(command: _FC) -> _FC:
    """Add every setting's flag to ``command`` (in the table's order in ``--help``)."""
    for field, flag, kind in reversed(list(settings_fields())):
        command = _option(field, flag, kind)(command)
    return command


def _default_text(field: dataclasses.Field[Any], flag: Flag) -> str:
    if flag.shown_default:
        return flag.shown_default
    default = field.default
    if default is dataclasses.MISSING:
        return "required"
    if default is None or default == ():
        return "off"
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, int) and default >= 10_000:
        return f"{default:,}"
    return str(default)


def markdown_table() -> str:
    """The README's table of ``serve`` flags: flag, environment variable, default, help."""
    lines = ["| flag | environment | default | |", "|---|---|---|---|"]
    for field, flag, kind in settings_fields():
        name = flag_of(field, flag)
        shown = f"{name}/--no-{name[2:]}" if _plain(kind)[0] is bool else name
        envvar = "ORTSERVE_" + name[2:].replace("-", "_").upper()
        text = flag.help.replace("|", "\\|")
        lines.append(f"| `{shown}` | `{envvar}` | {_default_text(field, flag)} | {text} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
