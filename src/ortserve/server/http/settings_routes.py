"""Triton's trace and logging extensions over HTTP.

``GET``/``POST /v2/trace/setting``, ``GET``/``POST /v2/models/<m>/trace/setting`` and
``GET``/``POST /v2/logging``: the settings in force, or changed (only those given; JSON
``null`` clears a model's trace setting back to the global one). What each setting means is
trace_settings.py and log_settings.py.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from ortserve.errors import InvalidInput, ModelNotFound
from ortserve.log_settings import LogControl
from ortserve.protocol.http_codec import parse_json_body
from ortserve.server.http.app import HttpApp, Operation
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response
from ortserve.server.http.methods import method_not_allowed
from ortserve.server.restriction import Restriction
from ortserve.trace_settings import TraceControl

__all__ = ["SETTINGS_ROUTES", "add_settings_routes"]

SETTINGS_ROUTES = (
    ("GET", "/v2/trace/setting"),
    ("POST", "/v2/trace/setting"),
    ("GET", "/v2/logging"),
    ("POST", "/v2/logging"),
)
_MODEL_TRACE = "trace/setting"
_MAX_BODY = 64 * 1024
"""A settings body is a handful of keys."""


def add_settings_routes(
    app: HttpApp,
    trace: TraceControl,
    log: LogControl,
    model_exists: Callable[[str], bool],
    restrictions: dict[str, Restriction] | None = None,
) -> None:
    """Serve the trace and logging settings.

    Args:
        model_exists: whether a model name is the repository's (a model's trace settings).
        restrictions: by API group (``trace``, ``logging``): the header a call must carry.
    """
    routes = _SettingsRoutes(trace, log, model_exists, restrictions or {})
    app.add_section("trace", routes.trace, SETTINGS_ROUTES[:2])
    app.add_section("logging", routes.logging, SETTINGS_ROUTES[2:])
    for method in ("GET", "POST"):
        app.add_model_route(method, _MODEL_TRACE, routes.model_trace, _model_operation(method))


class _SettingsRoutes:
    def __init__(
        self,
        trace: TraceControl,
        log: LogControl,
        model_exists: Callable[[str], bool],
        restrictions: dict[str, Restriction],
    ) -> None:
        self._trace = trace
        self._log = log
        self._model_exists = model_exists
        self._restrictions = restrictions

    def trace(self, request: HttpRequest, parts: list[str]) -> HttpResponse:
        if parts != ["setting"]:
            return _not_found(request)
        return self._trace_setting(request, None)

    def model_trace(self, request: HttpRequest, model: str, version: str | None) -> HttpResponse:
        if not self._model_exists(model):
            raise ModelNotFound(f"unknown model {model!r}")
        return self._trace_setting(request, model)

    def logging(self, request: HttpRequest, parts: list[str]) -> HttpResponse:
        if parts:
            return _not_found(request)
        self._check("logging", request)
        if request.method == "GET":
            return _json(self._log.view())
        if request.method != "POST":
            return method_not_allowed("GET", "POST")
        return _json(self._log.update(_settings_body(request)))

    def _trace_setting(self, request: HttpRequest, model: str | None) -> HttpResponse:
        self._check("trace", request)
        if request.method == "GET":
            return _json(self._trace.view(model))
        if request.method != "POST":
            return method_not_allowed("GET", "POST")
        return _json(self._trace.update(_settings_body(request), model))

    def _check(self, group: str, request: HttpRequest) -> None:
        restriction = self._restrictions.get(group)
        if restriction is not None:
            restriction.check(request.header(restriction.key.encode()))


def _settings_body(request: HttpRequest) -> dict[str, object]:
    if len(request.body) > _MAX_BODY:
        raise InvalidInput(f"a settings body is at most {_MAX_BODY} bytes")
    document = parse_json_body(request.body) if request.body else {}
    if not isinstance(document, dict):
        raise InvalidInput("the settings must be a JSON object")
    return document


def _json(view: dict[str, object]) -> HttpResponse:
    return json_response(200, orjson.dumps(view))


def _not_found(request: HttpRequest) -> HttpResponse:
    return json_response(404, orjson.dumps({"error": f"no route for {request.path}"[:300]}))


def _model_operation(method: str) -> Callable[[str], Operation]:
    def operation(template: str) -> Operation:
        summary = (
            "A model's trace settings (its own, else the global ones)"
            if method == "GET"
            else "Change a model's trace settings (null: back to the global one)"
        )
        parameters = [{"$ref": "#/components/parameters/Model"}]
        if "{version}" in template:
            parameters.append({"$ref": "#/components/parameters/Version"})
        described: Operation = {
            "tags": ["trace"],
            "parameters": parameters,
            "operationId": ("get" if method == "GET" else "update")
            + ("VersionTraceSetting" if "{version}" in template else "ModelTraceSetting"),
            "summary": summary
            + (" (the version is ignored: settings are per model)" if "{version}" in template else ""),
            "responses": {
                "200": {"$ref": "#/components/responses/TraceSetting"},
                "default": {"$ref": "#/components/responses/Error"},
            },
        }
        if method == "POST":
            described["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TraceSetting"}}},
            }
        return described

    return operation
