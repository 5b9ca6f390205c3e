"""The OpenAPI document: valid 3.1, every served route described and every described one served."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from openapi_spec_validator import validate

from openapi_check import Exchange, Message, OpenApiSpec
from ortserve import __version__
from ortserve.server.http.app import HttpApp
from ortserve.server.http.messages import HttpRequest, HttpResponse
from ortserve.server.http.openapi_routes import base_document, openapi_document
from ortserve.server.lifecycle import Server
from ortserve.settings import ServerSettings
from ortserve.testing import ServerProcess

SAMPLE_SEGMENTS = {"model": "small_mlp", "version": "1", "region": "r"}


@pytest.fixture(scope="module")
def app(demo_repository: Path) -> Iterator[HttpApp]:
    """The HTTP app of a server with everything on (metrics, shared memory, the demo pipelines)."""
    settings = ServerSettings(
        model_repository=demo_repository,
        http_port=0,
        grpc_port=-1,
        metrics_port=-1,
        shared_memory_regions=2,
        shutdown_grace_s=1.0,
    )
    server = Server(settings)

    async def start_and_stop() -> None:
        await server.start()
        await server.stop()

    asyncio.run(start_and_stop())
    yield server.http_app


@pytest.fixture(scope="module")
def document(app: HttpApp) -> dict[str, Any]:
    return openapi_document(app, __version__)


def test_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    validate(document)
    assert document["openapi"].startswith("3.1")


def _operations(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(m.upper(), p) for p, item in document["paths"].items() for m in item if m != "parameters"}


def test_every_route_the_app_serves_is_described(app: HttpApp, document: dict[str, Any]) -> None:
    served = set(app.routes())
    assert ("POST", "/v1/predict") in served and ("GET", "/metrics") in served
    undescribed = served - _operations(document)
    assert not undescribed, f"served but not described in server/http/openapi.yaml: {sorted(undescribed)}"


def test_openapi_yaml_describes_nothing_a_full_server_does_not_serve(app: HttpApp) -> None:
    stale = _operations(base_document()) - set(app.routes())
    assert not stale, f"described in openapi.yaml but not served: {sorted(stale)}"


def _options(app: HttpApp, path: str) -> HttpResponse:
    answer = app(HttpRequest("OPTIONS", path, "", {}, b""))
    assert isinstance(answer, HttpResponse)
    return answer


def test_every_described_operation_is_served_with_exactly_its_methods(
    app: HttpApp, document: dict[str, Any]
) -> None:
    """OPTIONS on each described path (parameters filled in) lists the methods described."""
    for template, item in document["paths"].items():
        path = re.sub(r"\{(\w+)\}", lambda m: SAMPLE_SEGMENTS[m.group(1)], template)
        answer = _options(app, path)
        assert answer.status == 204, (template, answer.status)
        allowed = dict(answer.headers)[b"allow"].decode().split(", ")
        methods = {m.upper() for m in item if m != "parameters"}
        assert set(allowed) - {"HEAD", "OPTIONS"} == methods, template


# Paths Triton, KServe or OpenAI clients call that ortserve may grow: each must stay 404 until
# it is served, and once served it must be described (a tripwire for routes added to _route).
LIKELY_PATHS = [
    "/v2/models/small_mlp/config",
    "/v2/models/small_mlp/versions/1/config",
    "/v2/models/small_mlp/generate",
    "/v2/models/small_mlp/generate_stream",
    "/v2/models/small_mlp/trace/setting",
    "/v2/trace/setting",
    "/v2/logging",
    "/v2/repository/index",
    "/v2/repository/models/small_mlp/load",
    "/v2/repository/models/small_mlp/unload",
    "/v1/models",
    "/v1/completions",
    "/v1/chat/completions",
]


@pytest.mark.parametrize("path", LIKELY_PATHS)
def test_likely_paths_are_not_served_or_are_described(
    app: HttpApp, document: dict[str, Any], path: str
) -> None:
    status = _options(app, path).status
    described = OpenApiSpec(document).describes(path)
    assert status == 404 or described, f"{path} is served (OPTIONS {status}) but not described"


def test_a_route_added_without_a_description_is_left_out_and_so_caught(app: HttpApp) -> None:
    """The coverage test above can fail: an added route with no operation is not in the document."""

    async def handler(request: HttpRequest) -> HttpResponse:
        raise AssertionError("not called")

    bare = HttpApp(app._dataplane, app._limits)
    bare.add_route("GET", "/v1/undescribed", handler)
    described = openapi_document(bare, __version__)["paths"]
    assert ("GET", "/v1/undescribed") in bare.routes() and "/v1/undescribed" not in described


def test_paths_the_app_does_not_serve_are_left_out(demo_repository: Path) -> None:
    bare = Server(ServerSettings(model_repository=demo_repository, metrics=False, grpc_port=-1))
    paths = openapi_document(bare.http_app, __version__)["paths"]
    assert "/metrics" not in paths and "/v2/models/{model}/infer" in paths


def test_pipeline_routes_carry_their_example(document: dict[str, Any]) -> None:
    example = document["paths"]["/v1/predict"]["post"]["requestBody"]["content"]["application/json"][
        "example"
    ]
    assert set(example) >= {"query", "timestamp"}


def _exchange(request: tuple[str, str, bytes], status: int, body: bytes) -> Exchange:
    method, path, sent = request
    headers = {"content-type": "application/json"}
    return Exchange(
        Message(f"{method} {path} HTTP/1.1", {}, sent), Message(f"HTTP/1.1 {status} X", headers, body)
    )


def test_the_checker_refuses_bodies_that_do_not_fit(document: dict[str, Any]) -> None:
    spec = OpenApiSpec(document)
    infer = ("POST", "/v2/models/m/infer", b'{"inputs": []}')
    with pytest.raises(jsonschema.ValidationError, match="should be non-empty"):
        spec.check(_exchange(infer, 400, b'{"error": "x"}'))
    good = ("POST", "/v2/models/m/infer", b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}')
    with pytest.raises(jsonschema.ValidationError, match="'model_version' is a required property"):
        spec.check(_exchange(good, 200, b'{"model_name": "m", "outputs": []}'))
    with pytest.raises(jsonschema.ValidationError, match="'error' is a required property"):
        spec.check(_exchange(("GET", "/v2", b""), 404, b"{}"))
    with pytest.raises(AssertionError, match="is not described"):
        spec.check(_exchange(("GET", "/v3", b""), 404, b"{}"))


@pytest.mark.e2e
def test_the_server_serves_the_document_and_a_self_contained_docs_page(server: ServerProcess) -> None:
    with urllib.request.urlopen(f"{server.http_url}/openapi.json", timeout=10) as reply:
        served = json.load(reply)
    validate(served)
    assert "/v1/route" in served["paths"]
    with urllib.request.urlopen(f"{server.http_url}/docs", timeout=10) as reply:
        page = reply.read().decode()
        policy = reply.headers["Content-Security-Policy"]
    assert "default-src 'self'" in policy
    sources = re.findall(r'(?:src|href|spec-url)="([^"]+)"', page)
    assert sources == ["openapi.json", "docs/redoc.standalone.js"]
    with urllib.request.urlopen(f"{server.http_url}/docs/redoc.standalone.js", timeout=10) as reply:
        script = reply.read()
        assert reply.headers["Content-Type"].startswith("application/javascript")
    assert script.startswith(b"/*! For license information") and len(script) > 500_000
