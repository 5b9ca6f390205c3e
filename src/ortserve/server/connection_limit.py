"""The server-wide bound on open connections, and which connection makes room at it.

Every connection is in one of three states as far as the bound knows: *idle* (nothing in
progress: between requests, or silent since it connected), *receiving* (a request has begun
and is not whole yet: a head, a body, an HTTP/2 stream whose request has not ended, a
streaming call), or *serving* (a whole request is being answered). A connection arriving at
the cap closes an idle one (the longest idle first); failing that, the receiving one that made
the least progress (fewest bytes per second since its request began). Serving connections are
never closed for a new one: when every place serves, the new connection is refused. So neither
silent sockets nor requests that never finish can lock real clients out, and a request that
was received whole is never thrown away for a newcomer.

Optionally each peer address may hold at most ``per_peer`` connections (off by default:
behind a load balancer or a proxy every client may share one address).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

__all__ = ["ARRIVING", "AT_REST", "SERVING", "ConnectionLimit", "Evictable", "peer_address"]

# What a connection last told the limit (a transport keeps it, so it tells only a change).
AT_REST = 0
ARRIVING = 1
SERVING = 2

_SAMPLE = 8
"""Receiving connections compared for each eviction, oldest first: finding the least progress
among thousands would cost the loop a millisecond per new connection under attack; the ones
compared and spared go to the back, so every receiving connection is compared in turn."""
_SMOOTHING_S = 1.0
"""Added to a request's age in its rate: a request that began a moment ago is not judged on a
few microseconds."""


class Evictable(Protocol):
    """A connection the limit may close to make room."""

    @property
    def received(self) -> int:
        """Bytes received on the connection so far (only ever grows)."""

    def evict(self) -> None:
        """Leave the connection's set at once (giving its place back) and close."""


class ConnectionLimit:
    """At most ``maximum`` connections open across every listener sharing this object.

    A connection counts from the moment its listener admits it (before ``connection_made``:
    an event loop may accept thousands of sockets in one tick) until it leaves its set. Its
    transport reports its state: :meth:`idle`, :meth:`receiving`, :meth:`busy` (serving).

    Args:
        maximum: the bound (>= 1).
        per_peer: the most connections one peer address may hold (0: no such limit).
        clock: monotonic seconds (injected by tests).
    """

    def __init__(self, maximum: int, per_peer: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.maximum = maximum
        self.per_peer = per_peer
        self.open = 0
        self.refused = 0
        self.evicted = 0
        self.refused_peer = 0
        self.lingering = 0  # refused connections still open (see connections.Refusal)
        self._clock = clock
        self._idle: OrderedDict[object, Evictable] = OrderedDict()
        # A receiving connection, with when its request began and its byte count then.
        self._receiving: OrderedDict[object, tuple[Evictable, float, int]] = OrderedDict()
        self._peers: dict[str, int] = {}
        self._peer_of: dict[object, str] = {}

    def admit(self) -> bool:
        """Count a new connection, making room at the cap; False: refuse it."""
        while self.open >= self.maximum:
            if self._idle:
                _, victim = self._idle.popitem(last=False)
            elif self._receiving:
                victim = self._least_progress()
            else:
                self.refused += 1
                return False
            self.evicted += 1
            victim.evict()  # leaves its set at once, which gives its place back
        self.open += 1
        return True

    def _least_progress(self) -> Evictable:
        """Take the receiving connection with the fewest bytes per second since its request
        began, among the oldest few; the others compared go to the back of the line."""
        now = self._clock()
        receiving = self._receiving
        compared: list[object] = []
        worst: object = None
        worst_rate = float("inf")
        for key, (connection, since, base) in receiving.items():
            rate = (connection.received - base) / (now - since + _SMOOTHING_S)
            if rate < worst_rate:
                worst, worst_rate = key, rate
            compared.append(key)
            if len(compared) == _SAMPLE:
                break
        for key in compared:
            if key is not worst:
                receiving.move_to_end(key)
        return receiving.pop(worst)[0]

    def idle(self, connection: Evictable) -> None:
        """``connection`` has nothing in progress: the first to make room (newest last)."""
        self._receiving.pop(connection, None)
        self._idle[connection] = connection

    def touch(self, connection: object) -> None:
        """``connection``, idle, was just active (a request read and answered at once): the
        longest idle is someone else."""
        try:  # noqa: SIM105 (a request's path: suppress() would cost a context manager)
            self._idle.move_to_end(connection)
        except KeyError:
            pass

    def receiving(self, connection: Evictable) -> None:
        """A request began on ``connection`` and is not whole yet: evictable, by progress."""
        self._idle.pop(connection, None)
        self._receiving[connection] = (connection, self._clock(), connection.received)

    def busy(self, connection: object) -> None:
        """``connection`` is serving a whole request: never closed for a new one."""
        if self._idle.pop(connection, None) is None:
            self._receiving.pop(connection, None)

    def tell(self, connection: Evictable, standing: int) -> None:
        """:meth:`idle`, :meth:`receiving` or :meth:`busy` by ``standing`` (``AT_REST``,
        ``ARRIVING`` or ``SERVING``)."""
        if standing == AT_REST:
            self.idle(connection)
        elif standing == SERVING:
            self.busy(connection)
        else:
            self.receiving(connection)

    def join_peer(self, connection: object, peer: str) -> bool:
        """Count ``connection`` against its peer address; False: the peer holds its share
        already (the caller refuses it; it still leaves through :meth:`leave`)."""
        if not self.per_peer or not peer:
            return True
        held = self._peers.get(peer, 0)
        if held >= self.per_peer:
            self.refused_peer += 1
            return False
        self._peers[peer] = held + 1
        self._peer_of[connection] = peer
        return True

    def leave(self, connection: object) -> None:
        """``connection`` closed (or was evicted): its place is free."""
        self._idle.pop(connection, None)
        self._receiving.pop(connection, None)
        self.open -= 1
        if self._peer_of:
            peer = self._peer_of.pop(connection, None)
            if peer is not None:
                left = self._peers[peer] - 1
                if left:
                    self._peers[peer] = left
                else:
                    del self._peers[peer]

    @property
    def evictable(self) -> int:
        """Connections that could make room now (idle or receiving)."""
        return len(self._idle) + len(self._receiving)


def peer_address(transport: object) -> str:
    """The peer's address without its port ("" for a Unix socket or an unknown peer)."""
    get = getattr(transport, "get_extra_info", None)
    name = get("peername") if get is not None else None
    if isinstance(name, tuple) and name:
        return str(name[0])
    return ""
