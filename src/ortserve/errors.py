"""The one error tree: every failure a client can see, with its HTTP status and gRPC code.

The two transports read ``http_status`` and ``grpc_code`` here and nowhere else, so HTTP and
gRPC can never disagree about what a failure means. ``grpc_code`` is the name of a member of
``grpc.StatusCode`` (kept as a string so this module imports no gRPC).
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DeadlineExceeded",
    "DeadlineUnmeetable",
    "InferenceError",
    "InternalError",
    "InvalidField",
    "InvalidInput",
    "ModelControlDisabled",
    "ModelLoadFailed",
    "ModelNotFound",
    "ModelNotReady",
    "NotImplementedByServer",
    "OrtServeError",
    "Overloaded",
    "PayloadTooLarge",
    "PermissionDenied",
    "RepositoryError",
    "Unauthenticated",
    "UnsupportedEncoding",
    "clip_text",
]


#: The longest message an error carries. Messages quote what a client sent (names, shapes,
#: fields) and what a model declares (its inputs): clipping them here bounds every error answer,
#: log line and trace attribute at once, whatever a message was built from.
MAX_MESSAGE_CHARS = 2_048


def clip_text(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out (messages, log lines)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


class OrtServeError(Exception):
    """Base of every error ortserve reports to a client or an operator.

    Args:
        message: a sentence for the client; it must never contain a traceback. Past
            ``MAX_MESSAGE_CHARS`` it is clipped.
    """

    http_status: int = 500
    grpc_code: str = "INTERNAL"

    def __init__(self, message: str) -> None:
        message = clip_text(message, MAX_MESSAGE_CHARS)
        super().__init__(message)
        self.message = message


class InvalidInput(OrtServeError):
    """The request is malformed or does not fit the model (names, types, shapes, limits)."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"


class InvalidField(InvalidInput):
    """A request field that is wrong or not supported; ``param`` names it (OpenAI's ``param``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class PayloadTooLarge(InvalidInput):
    """The body or message exceeds the configured size limit."""

    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"


class UnsupportedEncoding(OrtServeError):
    """The request body uses a content coding the server cannot undo (HTTP 415, RFC 9110 15.5.16).

    Args:
        message: which coding was refused.
        supported: the codings the server accepts, sent back as ``Accept-Encoding`` so a
            client can retry with one of them.
    """

    http_status = 415
    grpc_code = "UNIMPLEMENTED"

    def __init__(self, message: str, supported: tuple[str, ...]) -> None:
        super().__init__(message)
        self.supported = supported


class ModelNotFound(OrtServeError):
    """No model, or no such version of it, is served."""

    http_status = 404
    grpc_code = "NOT_FOUND"


class ModelNotReady(OrtServeError):
    """The model exists but cannot take requests now (loading, failed, or draining)."""

    http_status = 503
    grpc_code = "UNAVAILABLE"


class Overloaded(OrtServeError):
    """Admission refused: the queue is full or the request could not meet its deadline.

    Args:
        message: what was refused and why.
        retry_after_s: how long the client should wait before retrying, in seconds.
    """

    http_status = 429
    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineUnmeetable(Overloaded):
    """Admission refused because the client's own deadline cannot be met.

    A client deadline is the client's limit, not the server's: gRPC clients and Triton's
    expect DEADLINE_EXCEEDED (504), never RESOURCE_EXHAUSTED, whether it is missed in the
    queue or foreseen at admission. Still an ``Overloaded`` (a refusal with a retry hint).
    """

    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"


class DeadlineExceeded(OrtServeError):
    """The request's deadline passed before it could be answered."""

    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"


class ModelControlDisabled(OrtServeError):
    """Load or unload asked while the model control mode is not ``explicit`` (as Triton: UNAVAILABLE)."""

    http_status = 503
    grpc_code = "UNAVAILABLE"


class ModelLoadFailed(OrtServeError):
    """A load request failed; whatever served before keeps serving (as Triton: 400)."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"


class PermissionDenied(OrtServeError):
    """A restricted endpoint was called without the configured header or metadata."""

    http_status = 403
    grpc_code = "PERMISSION_DENIED"


class Unauthenticated(OrtServeError):
    """The data plane requires an API key (``--api-key``) and the request carries no valid one."""

    http_status = 401
    grpc_code = "UNAUTHENTICATED"


class NotImplementedByServer(OrtServeError):
    """The protocol defines the call but this server does not offer it."""

    http_status = 501
    grpc_code = "UNIMPLEMENTED"


class InternalError(OrtServeError):
    """Something went wrong inside the server; details go to the log, not the client."""

    http_status = 500
    grpc_code = "INTERNAL"


class InferenceError(InternalError):
    """ONNX Runtime failed to run a batch (the server logs the cause)."""


class RepositoryError(OrtServeError):
    """The model repository could not be read or a model could not be loaded."""

    http_status = 500
    grpc_code = "INTERNAL"


class ConfigError(RepositoryError):
    """A ``config.yaml`` is invalid; the message names the file and the field."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"
