"""One soak client's keep-alive HTTP connection: a request that fails on the way is recorded as
lost (and the connection made again), one answered other than 200 as refused or lost, so each
client's loop only reads the answers it got."""

from __future__ import annotations

import http.client
from collections.abc import Callable

from ortserve.testing import ServerProcess

__all__ = ["CheckedConnection", "Record", "RefusedOrLost"]

Record = Callable[..., None]
"""``Clients._record(client, outcome, started, level=0, detail="")``."""
RefusedOrLost = Callable[[str, float, int, str], None]
"""``(client, started, status, text)``: how a non-200 status is recorded (429/503 refused, else lost)."""


class CheckedConnection:
    """A client's connection to the server's HTTP port, recording the requests that got no answer.

    Args:
        server: the server under soak.
        name: the client, as its records name it.
        record: the soak's bookkeeping.
        refused_or_lost: how a non-200 status is recorded.
    """

    def __init__(
        self, server: ServerProcess, name: str, record: Record, refused_or_lost: RefusedOrLost
    ) -> None:
        self._server = server
        self._name = name
        self._record = record
        self._refused_or_lost = refused_or_lost
        self._connection = self._connect()

    def post(self, path: str, body: bytes | str, started: float) -> bytes | None:
        """POST a JSON body; the payload of a 200 answer, None once anything else was recorded."""
        try:
            self._connection.request("POST", path, body, {"content-type": "application/json"})
            reply = self._connection.getresponse()
            payload = reply.read()
        except (OSError, http.client.HTTPException) as exc:
            self._record(self._name, "lost", started, detail=repr(exc))
            self._connection.close()
            self._connection = self._connect()
            return None
        if reply.status != 200:
            self._refused_or_lost(self._name, started, reply.status, payload.decode(errors="replace"))
            return None
        return payload

    def close(self) -> None:
        self._connection.close()

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self._server.host, self._server.http_port, timeout=30)
