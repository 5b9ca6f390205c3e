"""GET /openapi.json (the REST surface as OpenAPI 3.1) and GET /docs (Redoc, vendored).

The document is ``openapi.yaml`` (package data) plus the operations of routes added at run time
(each pipeline's own route), built from the app on every request, so it follows what the app
serves. The docs page and its renderer come from the server itself: its Content-Security-Policy
lets nothing load from anywhere else.
"""

from __future__ import annotations

import copy
import functools
from importlib import resources
from typing import Any

import orjson
import yaml

from ortserve.server.http.app import HttpApp, Operation
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response

__all__ = [
    "DOCS_PATH",
    "OPENAPI_PATH",
    "add_openapi_routes",
    "base_document",
    "openapi_document",
    "pipeline_operation",
]

OPENAPI_PATH = "/openapi.json"
DOCS_PATH = "/docs"
RENDERER_PATH = "/docs/redoc.standalone.js"
_PACKAGE = "ortserve.server.http"
# Relative URLs, so the page also works behind a path prefix: from /docs they resolve to
# /openapi.json and /docs/redoc.standalone.js.
_DOCS_PAGE = b"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ortserve API</title>
<style>body { margin: 0; padding: 0; }</style>
</head>
<body>
<redoc spec-url="openapi.json"></redoc>
<script src="docs/redoc.standalone.js"></script>
</body>
</html>
"""
# Redoc styles with inline <style> elements and runs its search index in a blob: worker.
_DOCS_POLICY = (
    b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    b"img-src 'self' data:; worker-src blob:; connect-src 'self'"
)


@functools.cache
def base_document() -> dict[str, Any]:
    """openapi.yaml as loaded (shared: copy before changing it)."""
    text = resources.files(_PACKAGE).joinpath("openapi.yaml").read_text(encoding="utf-8")
    document: dict[str, Any] = yaml.safe_load(text)
    return document


@functools.cache
def _renderer() -> bytes:
    return resources.files(_PACKAGE).joinpath("static/redoc.standalone.js").read_bytes()


def openapi_document(app: HttpApp, version: str) -> dict[str, Any]:
    """openapi.yaml plus the operations of every added route it does not describe.

    Paths of openapi.yaml the app does not serve (``/metrics`` with metrics off) are left out.
    """
    document = copy.deepcopy(base_document())
    document["info"]["version"] = version
    paths: dict[str, dict[str, Any]] = document["paths"]
    routes = app.routes()
    served = {(method.lower(), path) for method, path in routes}
    for path, item in list(paths.items()):
        for method in [m for m in item if m in _METHODS and (m, path) not in served]:
            del item[method]
        if not any(m in _METHODS for m in item):
            del paths[path]
    for (method, path), operation in routes.items():
        if operation is not None and method.lower() not in paths.get(path, {}):
            paths.setdefault(path, {})[method.lower()] = operation
    return document


_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})


def pipeline_operation(model: str, example: object) -> Operation:
    """How a pipeline's own POST route is described: its model, JSON in and out, an example."""
    return {
        "tags": ["pipelines"],
        "operationId": f"pipeline_{model}",
        "summary": f"The {model} pipeline: a JSON document in, its JSON answer out",
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {"$ref": "#/components/schemas/PipelineRequest"},
                    "example": example,
                }
            },
        },
        "responses": {
            "200": {
                "description": "The pipeline's answer.",
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/PipelineResponse"}}
                },
            },
            "default": {"$ref": "#/components/responses/Error"},
        },
    }


def add_openapi_routes(app: HttpApp, version: str) -> None:
    """Serve the document, the docs page and its renderer on ``app``."""

    async def document(request: HttpRequest) -> HttpResponse:
        return json_response(200, orjson.dumps(openapi_document(app, version)))

    app.add_route("GET", OPENAPI_PATH, document)
    app.add_route("GET", DOCS_PATH, _docs_page)
    app.add_route("GET", RENDERER_PATH, _docs_renderer)


async def _docs_page(request: HttpRequest) -> HttpResponse:
    return HttpResponse(
        200, [_DOCS_PAGE], b"text/html; charset=utf-8", [(b"content-security-policy", _DOCS_POLICY)]
    )


async def _docs_renderer(request: HttpRequest) -> HttpResponse:
    return HttpResponse(
        200, [_renderer()], b"application/javascript; charset=utf-8", [(b"cache-control", b"max-age=86400")]
    )
