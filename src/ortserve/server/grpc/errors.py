"""gRPC status codes, and turning the error tree into them: the only place gRPC reads ``grpc_code``."""

from __future__ import annotations

import logging
import math
from enum import IntEnum

from ortserve.errors import OrtServeError, Overloaded

__all__ = ["INTERNAL_MESSAGE", "GrpcAbort", "StatusCode", "abort_for", "abort_from", "log_internal"]

logger = logging.getLogger(__name__)

INTERNAL_MESSAGE = "internal server error"


class StatusCode(IntEnum):
    """gRPC status codes (grpc/doc/statuscodes.md); names match ``grpc.StatusCode``."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class GrpcAbort(Exception):
    """Ends a call with a status other than OK; raised by handlers, answered by the call.

    Args:
        code: the status.
        message: ``grpc-message`` for the client.
        trailers: extra trailing metadata (lowercase ASCII names).
    """

    def __init__(self, code: StatusCode, message: str, trailers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailers = trailers


def abort_for(error: OrtServeError) -> GrpcAbort:
    """The status the error class owns, its message, and retry-after when overloaded."""
    trailers: tuple[tuple[str, str], ...] = ()
    if isinstance(error, Overloaded):
        trailers = (("retry-after", str(max(1, math.ceil(error.retry_after_s)))),)
    return GrpcAbort(StatusCode[error.grpc_code], error.message, trailers)


def log_internal(exc: BaseException) -> None:
    """Log an unexpected failure once, with its traceback (the client sees no details)."""
    logger.error("internal error while handling a gRPC call", exc_info=exc)


def abort_from(exc: BaseException) -> GrpcAbort:
    """The status a handler's exception ends its call with; anything unexpected is INTERNAL."""
    if isinstance(exc, GrpcAbort):
        return exc
    if isinstance(exc, OrtServeError):
        return abort_for(exc)
    log_internal(exc)
    return GrpcAbort(StatusCode.INTERNAL, INTERNAL_MESSAGE)
