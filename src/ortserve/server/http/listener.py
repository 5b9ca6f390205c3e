"""The HTTP listener: binds the socket, owns its connections, and drains them on shutdown.

Past the connection cap, when no connection can make room, a new connection still gets one of
a few places kept for health probes (``/v2/health/*``, ``/health``): a probe is answered, any
other request 503, and either way the connection then closes. So a server whose every place
is serving still tells its orchestrator it is alive rather than timing its probes out.
"""

from __future__ import annotations

import asyncio

from ortserve.protocol.http_codec import encode_error
from ortserve.server.connections import ByteBudget, ConnectionLimit, ConnectionSet, Refusal, listen
from ortserve.server.http.admission import EarlyRefusal
from ortserve.server.http.connection import Admission, ConnectionLimits, HttpConnection, TargetScreen
from ortserve.server.http.messages import HttpResponse
from ortserve.server.http.responder import Handler
from ortserve.server.http.run_queue import RunQueue, run_queue_of
from ortserve.server.http.wire import CannedResponse, canned
from ortserve.server.intake import IntakeGovernor

__all__ = ["HttpListener"]

_BUSY_BODY = encode_error("too many connections")
_TOO_MANY_CONNECTIONS = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
    b"retry-after: 1\r\nconnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)
PROBE_PLACES = 32
"""Connections over the cap kept open for their first request, in case it is a health probe;
they make room for one another as connections under the cap do (a silent one first)."""
_NOT_A_PROBE = canned(HttpResponse(503, [_BUSY_BODY], headers=[(b"retry-after", b"1")]))


def _probes_only(method: bytes, url: bytes, headers: dict[bytes, bytes]) -> CannedResponse | None:
    """Over the cap: health probes go on to the handler, anything else is 503."""
    if url.startswith(b"/v2/health/") or url == b"/health" or url.startswith(b"/health?"):
        return None
    return _NOT_A_PROBE


class HttpListener:
    """One listening socket serving :class:`HttpConnection` protocols.

    Args:
        handler: the route handler (an :class:`~ortserve.server.http.app.HttpApp`).
        limits: per-connection bounds.
        connection_limit: the cap on open connections, shared with the other listeners
            (None: no cap). A connection over it is answered 503 and closed.
        budget: the server-wide bound on request body bytes held (None: no bound).
        admission: refuses requests from their headers (see ``http/admission.py``); the
            server's :class:`~ortserve.server.http.admission.EarlyRefusal` also refuses whole
            plain POSTs from their first bytes, unparsed. With an admission hook, admitted
            requests run after each loop iteration's reads, a bounded stretch per iteration
            (``http/run_queue.py``); without one (the metrics and supervisor listeners) at once.
        intake: parks connections while the loop is saturated (shared with gRPC).
    """

    def __init__(
        self,
        handler: Handler,
        limits: ConnectionLimits,
        connection_limit: ConnectionLimit | None = None,
        budget: ByteBudget | None = None,
        admission: Admission | None = None,
        intake: IntakeGovernor | None = None,
    ) -> None:
        self._handler = handler
        self._limits = limits
        self._budget = budget
        self._admission = admission
        self._screen: TargetScreen | None = (
            admission.refuse_target if isinstance(admission, EarlyRefusal) else None
        )
        self._runs: RunQueue | None = None
        self._state: ConnectionSet[HttpConnection] = ConnectionSet(connection_limit, intake)
        self._probes: ConnectionSet[HttpConnection] = ConnectionSet(ConnectionLimit(PROBE_PLACES), intake)
        self._probes.closing = True  # one answer each, then close
        self._server: asyncio.Server | None = None
        self.reuse_port = False
        """Bind with SO_REUSEPORT (the workers of ``--workers N`` share the port)."""

    def _accept(self) -> asyncio.Protocol:
        loop = asyncio.get_running_loop()
        if not self._state.limit.admit():
            if not self._probes.limit.admit():
                return Refusal(_TOO_MANY_CONNECTIONS, self._state.limit)
            return HttpConnection(self._handler, self._limits, self._probes, loop, self._budget, _probes_only)
        runs = self._runs
        if runs is None and self._admission is not None:
            runs = self._runs = run_queue_of(loop)
        if runs is not None:
            runs.accepted()
        return HttpConnection(
            self._handler, self._limits, self._state, loop, self._budget, self._admission, self._screen, runs
        )

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        self._server = await listen(self._accept, host, port, self.reuse_port)
        return int(self._server.sockets[0].getsockname()[1])

    async def start_unix(self, path: str) -> None:
        """Listen on a Unix socket instead (a supervisor's private channel to one worker)."""
        self._server = await asyncio.get_running_loop().create_unix_server(self._accept, path)

    def stop_accepting(self) -> None:
        """Close the listening socket and every idle connection; busy ones close after answering."""
        self._state.closing = True
        if self._server is not None:
            self._server.close()
        for connection in [*self._state.connections, *self._probes.connections]:
            connection.close_if_idle()

    async def wait_closed(self, timeout_s: float) -> None:
        """Wait for busy connections to answer and close, up to ``timeout_s``."""
        for probe in list(self._probes.connections):
            probe.abort()  # a probe's answer is worth nothing once the server is stopping
        if not self._state.connections:
            return
        try:
            await asyncio.wait_for(self._state.all_closed.wait(), timeout_s)
        except TimeoutError:
            for connection in list(self._state.connections):
                connection.abort()
