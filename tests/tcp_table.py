"""What the kernel holds for a server's TCP connections (Linux's /proc/net/tcp), and its CPU time.

A test of a server in another process cannot see into it, but the kernel shows what it did
with each connection: bytes it has not read yet (the receive queue) and bytes it wrote that
the client has not taken (the send queue). Waiting for those to change is waiting for the
server itself, not for a guessed delay.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

__all__ = ["ServerSide", "cpu_ticks", "server_side", "server_side_of"]

# /proc/net/tcp states: a connection, or its unsent data after a close.
ESTABLISHED, FIN_WAIT1, CLOSING = "01", "04", "0B"


@dataclass(frozen=True)
class ServerSide:
    """One server-side socket: its state, what it still has to send, and what it has not read."""

    state: str
    remote_port: int
    unsent: int
    unread: int


def server_side(port: int) -> list[ServerSide]:
    """The sockets whose local port is ``port`` that hold a connection or its unsent data
    (ESTABLISHED, FIN-WAIT-1, CLOSING)."""
    found: list[ServerSide] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                local, remote, state, queues = fields[1], fields[2], fields[3], fields[4]
                if int(local.rsplit(":", 1)[1], 16) != port or state not in (ESTABLISHED, FIN_WAIT1, CLOSING):
                    continue
                unsent, unread = (int(q, 16) for q in queues.split(":"))
                found.append(ServerSide(state, int(remote.rsplit(":", 1)[1], 16), unsent, unread))
    return found


def server_side_of(client: socket.socket, port: int) -> ServerSide | None:
    """The server's end of ``client``'s connection to ``port`` (None once it is gone)."""
    mine = client.getsockname()[1]
    return next((s for s in server_side(port) if s.remote_port == mine), None)


def cpu_ticks(pid: int) -> int:
    """User plus system CPU time of process ``pid`` so far, in clock ticks."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime and stime, fields 14 and 15 of stat
