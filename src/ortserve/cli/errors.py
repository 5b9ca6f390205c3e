"""How the command line fails: one line (JSON with ``--log-format json``) and an exit code.

Neither a mistyped flag nor a port in use is a bug, so neither prints a traceback; operators
and log collectors get one line saying what to fix.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from ortserve.logs import make_formatter

__all__ = ["CleanErrorsGroup", "StartupFailure", "show_envvars"]

logger = logging.getLogger("ortserve.cli")
# click 8.2+ raises this for a group called without arguments; older clicks print help themselves.
_NO_ARGS_IS_HELP: tuple[type[click.ClickException], ...] = tuple(
    getattr(click.exceptions, name) for name in ("NoArgsIsHelpError",) if hasattr(click.exceptions, name)
)


class StartupFailure(click.ClickException):
    """The server could not start (a port in use, no repository): exit code 1."""

    exit_code = 1


class CleanErrorsGroup(click.Group):
    """A group whose usage and startup errors end in one log line instead of click's block."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        arguments = list(sys.argv[1:] if args is None else args)
        try:
            return super().main(arguments, prog_name, complete_var, standalone_mode=False, **extra)
        except _NO_ARGS_IS_HELP as exc:  # a bare `ortserve`: the help, as click shows it
            exc.show()
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            _fail(_message(exc), exc.exit_code, _wants_json(arguments))
        except click.Abort:
            _fail("aborted", 1, _wants_json(arguments))


def _message(exc: click.ClickException) -> str:
    message = exc.format_message()
    if isinstance(exc, click.UsageError) and exc.ctx is not None:
        return f"{message} (see '{exc.ctx.command_path} --help')"
    return message


def _wants_json(arguments: list[str]) -> bool:
    for index, argument in enumerate(arguments):
        if argument == "--log-format=json" or (
            argument == "--log-format" and arguments[index + 1 : index + 2] == ["json"]
        ):
            return True
    return os.environ.get("ORTSERVE_LOG_FORMAT") == "json"


def _fail(message: str, code: int, json_lines: bool) -> None:
    """Write the one line straight to stderr: logging may not be set up yet (a flag error)."""
    record = logger.makeRecord(logger.name, logging.ERROR, __file__, 0, "%s", (message,), None)
    click.echo(make_formatter("json" if json_lines else "text").format(record), err=True)
    sys.exit(code)


def show_envvars(group: click.Group) -> None:
    """Make ``--help`` name each option's ``ORTSERVE_*`` environment variable."""
    for command in group.commands.values():
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                param.show_envvar = True
