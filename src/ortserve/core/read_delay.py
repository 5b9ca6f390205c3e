"""How long requests sit unread before the server reads them, per event loop.

Under load from many clients, requests wait in the kernel's socket buffers before the loop
gets to their connection: at 1,600 connections offering 4x capacity that wait was over a
second (issue 30), and neither admission nor CoDel could see it, since a request's clock
started when it was read. The transports estimate the wait as they read each request head
(``ortserve.server.read_lag``) and leave the latest estimate here; the schedulers of the
same loop add it to the queueing wait they admit against and date each request's arrival
back by it, so the CoDel sojourn counts it too.

One holder per loop (held weakly): schedulers in tests, each on its own loop, never see
another's figure.
"""

from __future__ import annotations

import asyncio
import weakref

__all__ = ["ReadDelay", "read_delay_of"]


class ReadDelay:
    """The latest estimate of the time a request sat unread, in seconds (0 until one is read)."""

    __slots__ = ("__weakref__", "unread_s")

    def __init__(self) -> None:
        self.unread_s = 0.0


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReadDelay] = weakref.WeakKeyDictionary()


def read_delay_of(loop: asyncio.AbstractEventLoop) -> ReadDelay:
    """The holder shared by ``loop``'s transports and schedulers."""
    delay = _BY_LOOP.get(loop)
    if delay is None:
        delay = _BY_LOOP[loop] = ReadDelay()
    return delay
