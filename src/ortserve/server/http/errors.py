"""Turning the error tree into HTTP responses: the only place HTTP reads ``http_status``."""

from __future__ import annotations

import logging
import math

import orjson

from ortserve.errors import InvalidField, OrtServeError, Overloaded, UnsupportedEncoding
from ortserve.protocol import openai_codec
from ortserve.protocol.http_codec import encode_error
from ortserve.server.http.messages import ErrorShape, HttpResponse, json_response

__all__ = ["OIP", "OPENAI", "error_response", "internal_error_response", "openai_error_response"]

logger = logging.getLogger(__name__)


def error_response(error: OrtServeError) -> HttpResponse:
    """The status the error class owns, ``{"error": message}``, Retry-After on 429 and
    Accept-Encoding on 415 (RFC 9110 12.5.3: what the client may send instead)."""
    headers: list[tuple[bytes, bytes]] = []
    if isinstance(error, Overloaded):
        seconds = max(1, math.ceil(error.retry_after_s))
        headers.append((b"retry-after", str(seconds).encode()))
    elif isinstance(error, UnsupportedEncoding):
        headers.append((b"accept-encoding", ", ".join(error.supported).encode()))
    return json_response(error.http_status, encode_error(error.message), headers)


def internal_error_response(exc: BaseException) -> HttpResponse:
    """A 500 that tells the client nothing of the internals; the traceback goes to the log."""
    logger.error("internal error while handling a request", exc_info=exc)
    return json_response(500, encode_error("internal server error"))


_OPENAI_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 413: "invalid_request_error",
                 429: "rate_limit_exceeded", 503: "service_unavailable", 504: "timeout"}  # fmt: skip


def openai_error_response(error: OrtServeError) -> HttpResponse:
    """The same status and Retry-After as ``error_response``, in OpenAI's error shape."""
    response = error_response(error)
    kind = _OPENAI_TYPES.get(error.http_status, "server_error")
    code = "model_not_found" if error.http_status == 404 else None
    param = error.param if isinstance(error, InvalidField) else None
    body = {"error": {"message": error.message, "type": kind, "param": param, "code": code}}
    response.chunks = [orjson.dumps(body)]
    return response


def _oip_event(error: OrtServeError) -> bytes:
    return openai_codec.sse({"error": error.message})


def _openai_event(error: OrtServeError) -> bytes:
    return openai_codec.sse(openai_codec.error_body(error.message, "server_error", None))


OIP = ErrorShape(error_response, _oip_event)
"""OIP's ``{"error": message}`` (infer, pipelines, the generate extension)."""

OPENAI = ErrorShape(openai_error_response, _openai_event)
"""OpenAI's error object (chat, completions, responses, tokenize, embeddings)."""
