"""From the ``serve`` command's flags to the one :class:`~ortserve.settings.ServerSettings`.

Each flag's parameter is the name of the field it was made from (``serve_options.py``), so the
flags split, by name, into the command's own (:class:`~ortserve.cli.serve_options.ServeCommand`)
and the server's settings: nothing is mapped by hand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ortserve.cli.serve_options import ServeCommand
from ortserve.settings import ServerSettings

__all__ = ["command_and_settings", "settings_from_flags"]

_COMMAND = frozenset(field.name for field in dataclasses.fields(ServeCommand))
_FIELDS = frozenset(field.name for field in dataclasses.fields(ServerSettings))


def command_and_settings(flags: Mapping[str, object]) -> tuple[ServeCommand, ServerSettings]:
    """The command's flags and the settings the others describe.

    Raises:
        TypeError: a flag names no field of either.
    """
    stray = [name for name in flags if name not in _FIELDS and name not in _COMMAND]
    if stray:
        raise TypeError(f"--{stray[0].replace('_', '-')} names no ServerSettings field")
    command = ServeCommand(**{k: v for k, v in flags.items() if k in _COMMAND})  # type: ignore[arg-type]
    settings = ServerSettings(**{k: v for k, v in flags.items() if k in _FIELDS})  # type: ignore[arg-type]
    return command, settings


def settings_from_flags(flags: Mapping[str, object]) -> ServerSettings:
    """The settings the flags describe (the command's own left out)."""
    return command_and_settings(flags)[1]
