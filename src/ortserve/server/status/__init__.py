"""The status page ortserve serves itself: what is happening and why, at a glance."""

from __future__ import annotations

from ortserve.server.status.board import StatusBoard
from ortserve.server.status.routes import STATUS_PATHS, add_status_routes

__all__ = ["STATUS_PATHS", "StatusBoard", "add_status_routes"]
