"""Triton's model repository extension and model configuration API over HTTP.

``POST /v2/repository/index``, ``POST /v2/repository/models/<m>/load``,
``POST /v2/repository/models/<m>/unload`` and ``GET /v2/models/<m>[/versions/<v>]/config``:
decode the body, call :class:`~ortserve.server.model_control.ModelControl`, encode the answer.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import orjson
from google.protobuf import json_format

from ortserve.errors import InvalidInput, ModelNotFound
from ortserve.server.http.app import HttpApp
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response
from ortserve.server.http.methods import method_not_allowed
from ortserve.server.model_control import ModelControl
from ortserve.server.restriction import Restriction

__all__ = ["REPOSITORY_ROUTES", "add_repository_routes"]

REPOSITORY_ROUTES = (
    ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/models/{model}/load"),
    ("POST", "/v2/repository/models/{model}/unload"),
)

_OK = b""


def add_repository_routes(
    app: HttpApp, control: ModelControl, restriction: Restriction | None = None
) -> None:
    """Route the repository extension and ``/config`` to ``control``.

    Args:
        restriction: the header every repository call must carry (None: unrestricted).
    """
    routes = _RepositoryRoutes(control, restriction)
    app.add_section("repository", routes.section, REPOSITORY_ROUTES)
    app.add_model_route("GET", "config", routes.config)


class _RepositoryRoutes:
    def __init__(self, control: ModelControl, restriction: Restriction | None) -> None:
        self._control = control
        self._restriction = restriction

    def section(
        self, request: HttpRequest, parts: list[str]
    ) -> HttpResponse | Coroutine[Any, Any, HttpResponse]:
        if self._restriction is not None:
            self._restriction.check(request.header(self._restriction.key.encode()))
        if request.method != "POST":
            return method_not_allowed("POST")
        if parts == ["index"]:
            return self._index(request)
        if len(parts) == 3 and parts[0] == "models" and parts[2] == "load":
            return self._load(parts[1], _body(request))
        if len(parts) == 3 and parts[0] == "models" and parts[2] == "unload":
            return self._unload(parts[1], _body(request))
        raise ModelNotFound(f"no route for {request.path}")

    def _index(self, request: HttpRequest) -> HttpResponse:
        body = _body(request)
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidInput("field ready must be a boolean")
        rows = self._control.index(ready)
        entries = [{"name": r.name, "version": r.version, "state": r.state, "reason": r.reason} for r in rows]
        return json_response(200, orjson.dumps(entries))

    async def _load(self, name: str, body: dict[str, Any]) -> HttpResponse:
        parameters = _parameters(body)
        config = parameters.get("config")
        if config is not None and not isinstance(config, str):
            raise InvalidInput("parameters.config must be a string holding the model configuration as JSON")
        if any(key.startswith("file:") for key in parameters):
            raise InvalidInput("parameters file:<path> (model files in the request) are not supported")
        await self._control.load(name, config)
        return json_response(200, _OK)

    async def _unload(self, name: str, body: dict[str, Any]) -> HttpResponse:
        dependents = _parameters(body).get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InvalidInput("parameters.unload_dependents must be a boolean")
        await self._control.unload(name, dependents)
        return json_response(200, _OK)

    def config(self, request: HttpRequest, name: str, version: str | None) -> HttpResponse:
        if request.method != "GET":
            return method_not_allowed("GET")
        message = self._control.config(name, version)
        document = json_format.MessageToDict(message, preserving_proto_field_name=True)
        return json_response(200, orjson.dumps(document))


def _body(request: HttpRequest) -> dict[str, Any]:
    if not request.body.strip():
        return {}
    try:
        document = orjson.loads(request.body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidInput("the request body must be a JSON object")
    return document


def _parameters(body: dict[str, Any]) -> dict[str, Any]:
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInput("field parameters must be a JSON object")
    return parameters
