"""The traffic policy control endpoint over HTTP: ``/v2/routing[/models/<m>]``.

``GET`` shows the policy in force with live per-version counts, rollout progress and shadow
divergence; ``PUT`` replaces a model's policy (the ``routing:`` section as JSON) atomically;
``DELETE`` removes it. Restricted like the repository API (``--http-restricted-api
routing:HEADER=VALUE``).
"""

from __future__ import annotations

import orjson

from ortserve.errors import InvalidInput, ModelNotFound
from ortserve.routing.table import RoutingTable
from ortserve.server.http.app import HttpApp
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response
from ortserve.server.http.methods import method_not_allowed
from ortserve.server.restriction import Restriction

__all__ = ["ROUTING_ROUTES", "add_routing_routes"]

ROUTING_ROUTES = (
    ("GET", "/v2/routing"),
    ("GET", "/v2/routing/models/{model}"),
    ("PUT", "/v2/routing/models/{model}"),
    ("DELETE", "/v2/routing/models/{model}"),
)


def add_routing_routes(app: HttpApp, table: RoutingTable, restriction: Restriction | None = None) -> None:
    """Route ``/v2/routing`` to ``table``; ``restriction``: the header every call must carry."""
    routes = _RoutingRoutes(table, restriction)
    app.add_section("routing", routes.section, ROUTING_ROUTES)


class _RoutingRoutes:
    def __init__(self, table: RoutingTable, restriction: Restriction | None) -> None:
        self._table = table
        self._restriction = restriction

    def section(self, request: HttpRequest, parts: list[str]) -> HttpResponse:
        if self._restriction is not None:
            self._restriction.check(request.header(self._restriction.key.encode()))
        if not parts:
            if request.method != "GET":
                return method_not_allowed("GET")
            return _json(self._table.all())
        if len(parts) != 2 or parts[0] != "models" or not parts[1]:
            raise ModelNotFound(f"no route for {request.path}")
        name = parts[1]
        if request.method == "GET":
            return _json(self._table.get(name))
        if request.method == "PUT":
            return _json(self._table.put(name, _body(request)))
        if request.method == "DELETE":
            self._table.delete(name)
            return _json(self._table.get(name))
        return method_not_allowed("GET", "PUT", "DELETE")


def _json(document: object) -> HttpResponse:
    return json_response(200, orjson.dumps(document))


def _body(request: HttpRequest) -> object:
    try:
        document = orjson.loads(request.body or b"{}")
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidInput("the request body must be a JSON object (the routing section)")
    return document
