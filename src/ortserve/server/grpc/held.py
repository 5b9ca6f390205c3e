"""The request bytes one gRPC connection holds for its calls, against two bounds.

HTTP/2 flow control lets a client send a stream's window ahead of the handler on every stream
it opens, so without a bound of its own one connection could make the server hold its whole
window times its streams. A connection holding more than ``limit`` bytes no handler has taken
fails its newest growing call, and every byte held also counts against the server-wide
:class:`~ortserve.server.connections.ByteBudget` shared with HTTP.
"""

from __future__ import annotations

from ortserve.server.connections import ByteBudget

__all__ = ["HeldBytes"]

OVER_BUDGET = "the server holds too many request bytes"
OVER_LIMIT = "too much request data held on this connection"


class HeldBytes:
    """Bytes held per stream and in all, for one connection.

    Args:
        budget: the server-wide bound, shared by every connection.
        limit: the most this connection may hold.
    """

    def __init__(self, budget: ByteBudget, limit: int) -> None:
        self._budget = budget
        self._limit = limit
        self._by_stream: dict[int, int] = {}
        self._total = 0

    def update(self, stream_id: int, held: int) -> str | None:
        """A call now holds ``held`` bytes: None, or why the call must fail (what it held is
        given back when its stream is :meth:`released`)."""
        grown = held - self._by_stream.get(stream_id, 0)
        if not grown:
            return None
        if grown > 0 and not self._budget.take(grown):
            return OVER_BUDGET
        if grown < 0:
            self._budget.give(-grown)
        self._total += grown
        self._by_stream[stream_id] = held
        if self._total > self._limit and held:
            return OVER_LIMIT
        return None

    def released(self, stream_id: int) -> None:
        """The stream's call ended or no longer holds its request: its bytes go back."""
        held = self._by_stream.pop(stream_id, 0)
        if held:
            self._total -= held
            self._budget.give(held)

    def take(self, size: int) -> bool:
        """Hold a message no call owns yet (admitted, waiting for its turn), if the budget
        allows."""
        if not self._budget.take(size):
            return False
        self._total += size
        return True

    def give(self, size: int) -> None:
        """A message taken with :meth:`take` is handed on or dropped."""
        self._total -= size
        self._budget.give(size)

    def clear(self) -> None:
        """The connection is gone: everything held goes back (messages taken included)."""
        self._by_stream.clear()
        if self._total:
            self._budget.give(self._total)
        self._total = 0
