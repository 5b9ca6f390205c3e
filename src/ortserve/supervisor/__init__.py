"""Processes above the server: ``--workers N`` runs N copies of the server on shared ports under
one supervisor that starts and restarts them and aggregates their metrics, statistics and model
control. The server itself never imports this package."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ortserve.supervisor.plan import parse_workers

if TYPE_CHECKING:
    from ortserve.supervisor.supervisor import exec_supervisor

__all__ = ["exec_supervisor", "parse_workers"]


def __getattr__(name: str) -> object:
    # ``serve`` reads the --workers flag through ``plan`` (importing this package); the
    # supervisor itself (its gateway, aggregation, zygote) is imported only by --workers N.
    if name == "exec_supervisor":
        from ortserve.supervisor.supervisor import exec_supervisor

        return exec_supervisor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
