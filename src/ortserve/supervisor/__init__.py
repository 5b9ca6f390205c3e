"""Processes above the server: ``--workers N`` runs N copies of the server on shared ports under
one supervisor that starts and restarts them and aggregates their metrics, statistics and model
control. The server itself never imports this package."""

from __future__ import annotations

from ortserve.supervisor.plan import parse_workers
from ortserve.supervisor.supervisor import exec_supervisor

__all__ = ["exec_supervisor", "parse_workers"]
