"""Refusing an infer request from its path and headers alone, before its body is read.

Under overload most requests are refused; decoding a JSON body only to answer 429 spends
the CPU the model needs (issue 10: refusals starved execution). The connection asks this
module once the headers are in and, on a refusal, drops the body as it arrives.
"""

from __future__ import annotations

from urllib.parse import unquote

from ortserve.core.dataplane import DataPlane
from ortserve.errors import ModelNotReady, OrtServeError, Overloaded
from ortserve.server.http.errors import error_response
from ortserve.server.http.messages import HttpResponse
from ortserve.telemetry import Telemetry

__all__ = ["EarlyRefusal", "infer_target"]

_PREFIX = b"/v2/models/"
_SUFFIX = b"/infer"


def infer_target(url: bytes) -> tuple[str, str | None] | None:
    """``(model, version)`` when ``url`` is an OIP infer path, else None."""
    path = url.split(b"?", 1)[0]
    if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)):
        return None
    parts = path[len(_PREFIX) : -len(_SUFFIX)].split(b"/")
    if len(parts) == 1:
        name, version = parts[0], None
    elif len(parts) == 3 and parts[1] == b"versions":
        name, version = parts[0], parts[2]
    else:
        return None
    if not name:
        return None
    decoded = unquote(name.decode("latin-1"))
    return decoded, None if version is None else unquote(version.decode("latin-1"))


class EarlyRefusal:
    """The HTTP connection's admission hook: a 429 (or 503) response, or None to go on.

    Only load refusals are answered here (Overloaded, ModelNotReady); anything else, such as
    an unknown model, takes the full path and its usual answer.

    Args:
        dataplane: answers whether a model would admit a request now.
        telemetry: counts the refusal like any other answered request.
    """

    def __init__(self, dataplane: DataPlane, telemetry: Telemetry) -> None:
        self._dataplane = dataplane
        self._telemetry = telemetry

    def __call__(self, method: bytes, url: bytes, headers: dict[bytes, bytes]) -> HttpResponse | None:
        if method != b"POST" or b"expect" in headers:
            return None  # a client waiting for 100 Continue would not send the body we skip
        target = infer_target(url)
        if target is None:
            return None
        name, version = target
        try:
            # The most urgent lane: the body may ask for it, and it is refused last.
            self._dataplane.check_admission(name, version, priority=1)
        except (Overloaded, ModelNotReady) as error:
            return self._refuse(name, version, headers, error)
        except OrtServeError:
            return None
        return None

    def _refuse(
        self, name: str, version: str | None, headers: dict[bytes, bytes], error: OrtServeError
    ) -> HttpResponse:
        raw_id = headers.get(b"x-request-id")
        request_id = None if raw_id is None else raw_id.decode("latin-1")
        scope = self._telemetry.begin("http", name, version, request_id, None)
        response = error_response(error)
        scope.finish(error, response.status)
        echoed = scope.echoed_id()
        if echoed is not None:
            response.headers.append((b"x-request-id", echoed))
        return response
