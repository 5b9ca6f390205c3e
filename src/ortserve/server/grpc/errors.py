"""Turning the error tree into gRPC statuses: the only place gRPC reads ``grpc_code``."""

from __future__ import annotations

import logging
import math
from typing import NoReturn

import grpc

from ortserve.errors import OrtServeError, Overloaded

__all__ = ["abort_internal", "abort_with", "status_code"]

logger = logging.getLogger(__name__)

INTERNAL_MESSAGE = "internal server error"


def status_code(error: OrtServeError) -> grpc.StatusCode:
    """The gRPC status the error class owns."""
    return grpc.StatusCode[error.grpc_code]


def _trailers(error: OrtServeError) -> tuple[tuple[str, str], ...]:
    if isinstance(error, Overloaded):
        return (("retry-after", str(max(1, math.ceil(error.retry_after_s)))),)
    return ()


async def abort_with(context: grpc.aio.ServicerContext, error: OrtServeError) -> NoReturn:
    """End the call with the error's status and message (and retry-after when overloaded)."""
    await context.abort(status_code(error), error.message, _trailers(error))
    raise AssertionError("context.abort returned")  # abort always raises


def log_internal(exc: BaseException) -> None:
    """Log an unexpected failure once, with its traceback (the client sees no details)."""
    logger.error("internal error while handling a gRPC call", exc_info=exc)


async def abort_internal(context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
    """INTERNAL with no details for the client; the traceback goes to the log."""
    log_internal(exc)
    await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
    raise AssertionError("context.abort returned")
