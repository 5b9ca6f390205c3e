"""OpenTelemetry spans: request -> decode, queue, batch execution, encode, continuing traceparent."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import onnx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ortserve.core.dataplane import DataPlane
from ortserve.core.types import ServerMetadata
from ortserve.demo import build_mlp
from ortserve.protocol.tensors import TensorLimits
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.server.http.app import HttpApp
from ortserve.server.http.messages import Deferred, HttpRequest, HttpResponse
from ortserve.settings import ServerSettings
from ortserve.statistics import ServerStatistics
from ortserve.telemetry import Telemetry
from ortserve.tracing import Tracing, build_tracing, route_template, tracer_provider

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
ROOT = "POST /v2/models/{model}/infer"
"""An HTTP request span's name: method and route template (OpenTelemetry HTTP conventions)."""


class Served:
    def __init__(self, app: HttpApp, exporter: InMemorySpanExporter) -> None:
        self.app = app
        self.exporter = exporter

    async def infer(self, headers: dict[bytes, bytes], width: int = 4) -> HttpResponse:
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, width], "data": [0.5] * width}]}
        request = HttpRequest("POST", "/v2/models/tiny/infer", "", headers, json.dumps(body).encode())
        result = self.app(request)
        if isinstance(result, HttpResponse):
            return result
        assert isinstance(result, Deferred)
        await result.future
        return result.finish(result.future)

    def spans(self) -> dict[str, ReadableSpan]:
        return {span.name: span for span in self.exporter.get_finished_spans()}


async def serve_tiny(tmp_path: Path, sampling_ratio: float) -> tuple[Served, ModelRegistry]:
    model_dir = tmp_path / "tiny" / "1"
    model_dir.mkdir(parents=True)
    onnx.save(build_mlp([4, 8, 2], seed=0, name="tiny"), model_dir / "model.onnx")
    exporter = InMemorySpanExporter()
    provider = tracer_provider(sampling_ratio, SimpleSpanProcessor(exporter))
    telemetry = Telemetry(ServerStatistics(), tracing=Tracing(provider.get_tracer("test")))
    registry = ModelRegistry(observers=telemetry.observer_for)
    await LifecycleManager(registry, ServerSettings(model_repository=tmp_path, intra_op_threads=1)).start()
    dataplane = DataPlane(registry, ServerMetadata("ortserve", "test", ()))
    return Served(HttpApp(dataplane, TensorLimits(1 << 20, 8, 1 << 20), telemetry), exporter), registry


@pytest.fixture
async def always(tmp_path: Path) -> AsyncIterator[Served]:
    served, registry = await serve_tiny(tmp_path, 1.0)
    yield served
    await registry.unload_all(5.0)


@pytest.fixture
async def never(tmp_path: Path) -> AsyncIterator[Served]:
    served, registry = await serve_tiny(tmp_path, 0.0)
    yield served
    await registry.unload_all(5.0)


def interval(span: ReadableSpan) -> tuple[int, int]:
    assert span.start_time is not None and span.end_time is not None
    return span.start_time, span.end_time


def attribute(span: ReadableSpan, key: str) -> object:
    assert span.attributes is not None
    return span.attributes[key]


async def test_a_request_is_traced_as_decode_queue_batch_execution_and_encode(always: Served) -> None:
    response = await always.infer({})
    assert response.status == 200
    spans = always.spans()
    root = spans[ROOT]
    assert set(spans) == {ROOT, "decode", "queue", "batch execution", "encode"}
    root_start, root_end = interval(root)
    for name in ("decode", "queue", "batch execution", "encode"):
        parent = spans[name].parent
        assert parent is not None and root.context is not None
        assert parent.span_id == root.context.span_id
        start, end = interval(spans[name])
        assert root_start <= start <= end <= root_end
    assert (
        interval(spans["decode"])[1] <= interval(spans["queue"])[0] <= interval(spans["batch execution"])[0]
    )
    assert interval(spans["batch execution"])[1] <= interval(spans["encode"])[0]
    assert attribute(spans["batch execution"], "ortserve.batch.rows") == 1
    assert attribute(root, "ortserve.version") == "1"
    assert attribute(root, "ortserve.outcome") == "success"


async def test_http_spans_carry_the_http_semantic_conventions(always: Served) -> None:
    await always.infer({})
    root = always.spans()[ROOT]
    assert attribute(root, "http.request.method") == "POST"
    assert attribute(root, "http.route") == "/v2/models/{model}/infer"
    assert attribute(root, "http.response.status_code") == 200
    assert "rpc.system" not in (root.attributes or {})


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/v2/models/tiny/infer", "/v2/models/{model}/infer"),
        ("/v2/models/tiny/versions/3/infer", "/v2/models/{model}/versions/{version}/infer"),
        ("/v2/models/tiny/generate_stream", "/v2/models/{model}/generate_stream"),
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("", "/v2/models/{model}/infer"),
    ],
)
def test_a_route_template_names_no_model_or_version(path: str, template: str) -> None:
    assert route_template(path) == template


async def test_the_callers_traceparent_is_continued(always: Served) -> None:
    await always.infer({b"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01".encode()})
    root = always.spans()[ROOT]
    assert f"{root.context.trace_id:032x}" == TRACE_ID
    assert root.parent is not None
    assert f"{root.parent.span_id:016x}" == PARENT_ID


async def test_a_failed_request_has_an_error_status_and_no_queue_span(always: Served) -> None:
    response = await always.infer({b"x-request-id": b"bad-1"}, width=3)
    assert response.status == 400
    spans = always.spans()
    assert set(spans) == {ROOT, "decode"}
    root = spans[ROOT]
    assert not root.status.is_ok
    assert attribute(root, "ortserve.request_id") == "bad-1"


async def test_ratio_zero_traces_only_requests_whose_caller_sampled_them(never: Served) -> None:
    await never.infer({})
    assert never.spans() == {}
    await never.infer({b"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01".encode()})
    assert ROOT in never.spans()


def test_tracing_is_off_at_ratio_zero_and_rejects_unknown_exporters() -> None:
    from ortserve.errors import ConfigError

    assert build_tracing(0.0, "otlp") is None
    with pytest.raises(ConfigError):
        build_tracing(0.5, "zipkin")


def test_the_service_name_is_ortserve_unless_the_otel_variables_name_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    processor = SimpleSpanProcessor(InMemorySpanExporter())
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert tracer_provider(1.0, processor).resource.attributes["service.name"] == "ortserve"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes,deployment.environment=test")
    resource = tracer_provider(1.0, processor).resource
    assert resource.attributes["service.name"] == "from-attributes"
    assert resource.attributes["deployment.environment"] == "test"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "scorer")
    assert tracer_provider(1.0, processor).resource.attributes["service.name"] == "scorer"


@pytest.mark.e2e
def test_the_default_otlp_exporter_of_the_otel_extra_serves_without_a_collector(
    demo_repository: Path, tmp_path: Path
) -> None:
    import urllib.request

    from ortserve.testing import free_port, run_server

    root = demo_repository
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",  # nobody listens there
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    args = ["--trace-sampling-ratio", "1", "--grpc-port", "-1", "--metrics-port", "-1"]
    with run_server(root, tmp_path / "server.log", args, env) as server:
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}]}
        request = urllib.request.Request(
            f"{server.http_url}/v2/models/small_mlp/infer", json.dumps(body).encode()
        )
        for _ in range(3):
            with urllib.request.urlopen(request, timeout=30) as reply:
                assert reply.status == 200
        assert server.stop() == 0
    assert "Traceback" not in server.log()
    endpoint = env["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert "tracing on: 1 request in 1 traced" in server.log()
    assert f"spans exported to OTLP/HTTP at {endpoint}/v1/traces" in server.log()
