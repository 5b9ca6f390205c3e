"""``GET /`` and ``/status`` (the page) and ``GET /v2/status.json`` (what it polls).

The page is one HTML file with its script and style inline and a Content-Security-Policy that
lets it load nothing from anywhere (``connect-src 'self'`` for its polls). Its data comes from
the server's own ``/metrics`` route, which in a worker of ``--workers N`` is the supervisor's
merge of every worker: the page shows the whole server either way. The JSON endpoint joins
the ``status`` group of ``--http-restricted-api``; the page sends the key it finds in its URL
fragment (``/status#x-status-key=secret``: a fragment never reaches a server or its logs).
"""

from __future__ import annotations

import time
from importlib import resources
from typing import Any

from ortserve.server.http.app import HttpApp
from ortserve.server.http.messages import HttpRequest, HttpResponse, resolve_response
from ortserve.server.restriction import Restriction
from ortserve.server.status.board import StatusBoard
from ortserve.server.status.events import install_event_log

__all__ = ["STATUS_PATHS", "add_status_routes"]

STATUS_PATHS = ("/", "/status", "/v2/status.json")
_POLICY = (
    b"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    b"connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_PAGE_HEADERS = [
    (b"content-security-policy", _POLICY),
    (b"cache-control", b"no-cache"),
    (b"x-content-type-options", b"nosniff"),
]
_JSON_HEADERS = [(b"cache-control", b"no-store")]


def _operation(operation_id: str, summary: str, content_type: str) -> dict[str, Any]:
    return {
        "operationId": operation_id,
        "summary": summary,
        "tags": ["status"],
        "responses": {
            "200": {"description": summary, "content": {content_type: {"schema": {"type": "string"}}}},
        },
    }


def _exposition_of(app: HttpApp) -> Any:
    async def exposition() -> str | None:
        metrics = app.route("GET", "/metrics")  # read per call: a worker replaces it at start
        if metrics is None:
            return None
        answer = await resolve_response(metrics(HttpRequest("GET", "/metrics", "", {}, b"")))
        if answer.status != 200:
            return None
        return b"".join(bytes(chunk) for chunk in answer.chunks).decode("utf-8", "replace")

    return exposition


def add_status_routes(app: HttpApp, restriction: Restriction | None = None) -> StatusBoard:
    """Serve the page and its JSON on ``app``; returns the board (tests read its counters)."""
    page = resources.files("ortserve.server.status").joinpath("page.html").read_bytes()
    board = StatusBoard(_exposition_of(app), time.monotonic, time.time, install_event_log())

    async def show_page(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, [page], b"text/html; charset=utf-8", list(_PAGE_HEADERS))

    async def status_json(request: HttpRequest) -> HttpResponse:
        if restriction is not None:
            restriction.check(request.header(restriction.key.encode("latin-1")))
        return HttpResponse(200, [await board.document()], b"application/json", list(_JSON_HEADERS))

    page_operation = _operation("status_page", "The status page (HTML, no external resources)", "text/html")
    app.add_route("GET", "/", show_page, page_operation)
    app.add_route("GET", "/status", show_page, {**page_operation, "operationId": "status_page_alias"})
    app.add_route(
        "GET",
        "/v2/status.json",
        status_json,
        _operation(
            "status_document", "Models, rates, history and recent errors the page shows", "application/json"
        ),
    )
    return board
