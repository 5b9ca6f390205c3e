"""A command group whose subcommands are imported when they are run, not when ``ortserve`` starts.

``ortserve serve`` paid for importing the load generator, the quantizer, signing and the
hotword trainer (about a second of a 3.7 s start, benchmarks/RESULTS.md) though it runs none
of them. Each lazy command is named ``"module:attribute"`` and imported on first use; listing
them (``--help``) imports them all, as it must to show their help.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import click

from ortserve.cli.errors import CleanErrorsGroup

__all__ = ["LazyGroup"]


class LazyGroup(CleanErrorsGroup):
    """A ``CleanErrorsGroup`` with subcommands imported on demand.

    Args:
        lazy: command name -> ``"module:attribute"`` of the click command.
    """

    def __init__(self, *args: Any, lazy: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self._lazy.pop(cmd_name, None)
        if target is not None:
            module, _, attribute = target.partition(":")
            command = getattr(importlib.import_module(module), attribute)
            for param in command.params:  # as show_envvars does for the others
                if isinstance(param, click.Option) and not param.hidden:
                    param.show_envvar = True
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)
