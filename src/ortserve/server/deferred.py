"""The two things every transport shares about an answer: the one deferred type, and the one
way an exception becomes the error a client is told.

``Deferred[T]`` is a future plus the function that turns it, once done, into the transport's
answer ``T`` (an ``HttpResponse``, a protobuf message): the connection adds one done callback,
so a request holds no task. ``settle`` is where an unexpected exception is logged (with the
request's id, model and version bound) and becomes ``InternalError``; every transport then maps
the settled ``OrtServeError`` to its wire in one function of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from ortserve.errors import InternalError, OrtServeError

__all__ = ["INTERNAL_MESSAGE", "Deferred", "attempt", "settle"]

logger = logging.getLogger("ortserve.server")

INTERNAL_MESSAGE = "internal server error"
"""All a client learns of an unexpected failure; the traceback goes to the log."""

_T = TypeVar("_T")
_R = TypeVar("_R")
_P = ParamSpec("_P")


@dataclass(frozen=True, slots=True)
class Deferred(Generic[_T]):
    """An answer still being computed: ``finish`` turns the settled ``future`` into it.

    The transport cancels ``future`` when the client goes away first; ``finish`` is then not
    called (an OIP request's scope is dropped from the in-flight count instead).
    """

    future: asyncio.Future[Any]
    finish: Callable[[asyncio.Future[Any]], _T]
    failed: Callable[[BaseException], _T] | None = None
    """The answer when ``finish`` raised (the request failed, or encoding its answer did),
    called by the transport's one guard around ``finish``; None: that guard answers 500."""


class _Bindable(Protocol):
    def bound(self) -> contextlib.AbstractContextManager[None]: ...


def settle(exc: BaseException, scope: _Bindable | None = None) -> OrtServeError:
    """What the client is told about ``exc``: itself when it is one of ours, else
    ``InternalError`` after logging the traceback (inside ``scope.bound()`` when given, so
    the line carries the request's id, model and version)."""
    if isinstance(exc, OrtServeError):
        return exc
    with scope.bound() if scope is not None else contextlib.nullcontext():
        logger.error("internal error while handling a request", exc_info=exc)
    return InternalError(INTERNAL_MESSAGE)


def attempt(call: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R | Exception:
    """``call(*args)``'s result, or the exception it raised, as a value to :func:`settle`:
    for code that answers an error as a value (a stream's per-request error message, a
    refusal counted) without a ``try`` of its own."""
    try:
        return call(*args, **kwargs)
    except Exception as exc:
        return exc
