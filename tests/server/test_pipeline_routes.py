"""The pipelines' REST routes are accounted like OIP inference: request counts by outcome,
latency and the steps' split, trace spans, the request id echoed, traffic captured."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ortserve.capture import Capture
from ortserve.capture_records import read_capture
from ortserve.core.dataplane import DataPlane
from ortserve.core.types import ServerMetadata
from ortserve.metrics import ServerMetrics
from ortserve.protocol.tensors import TensorLimits
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.server.exchange import Exchange
from ortserve.server.http.app import HttpApp
from ortserve.server.http.messages import HttpRequest, HttpResponse
from ortserve.server.http.pipeline_routes import register_pipeline_routes
from ortserve.settings import ServerSettings
from ortserve.statistics import ServerStatistics
from ortserve.telemetry import Telemetry
from ortserve.tracing import Tracing, tracer_provider

NOW = 1_759_017_600_000


@dataclass
class Served:
    app: HttpApp
    metrics: ServerMetrics
    exporter: InMemorySpanExporter
    capture: Capture

    async def post(
        self, path: str, document: object, headers: dict[bytes, bytes] | None = None
    ) -> HttpResponse:
        result = self.app(HttpRequest("POST", path, "", headers or {}, orjson.dumps(document)))
        assert not isinstance(result, HttpResponse)
        response = await result  # type: ignore[misc]
        assert isinstance(response, HttpResponse)
        return response


@pytest.fixture
async def served(demo_repository: Path, tmp_path: Path) -> AsyncIterator[Served]:
    shutil.copytree(demo_repository / "hotword", tmp_path / "models" / "hotword")
    exporter = InMemorySpanExporter()
    provider = tracer_provider(1.0, SimpleSpanProcessor(exporter))
    metrics = ServerMetrics(lambda: [], lambda: {})
    telemetry = Telemetry(ServerStatistics(), metrics, Tracing(provider.get_tracer("test")))
    registry = ModelRegistry(observers=telemetry.observer_for)
    settings = ServerSettings(model_repository=tmp_path / "models", intra_op_threads=1)
    await LifecycleManager(registry, settings).start()
    capture = Capture(tmp_path / "capture", rate=1.0)
    await capture.start()
    dataplane = DataPlane(registry, ServerMetadata("ortserve", "test", ()))
    exchange = Exchange(dataplane, telemetry, capture)
    app = HttpApp(dataplane, TensorLimits(1 << 20, 8, 1 << 20), exchange=exchange)
    assert register_pipeline_routes(registry, app) == ["/v1/predict"]
    try:
        yield Served(app, metrics, exporter, capture)
    finally:
        await capture.stop()
        await registry.unload_all(5.0)


def sample(exposition: str, name: str, **labels: str) -> float:
    for line in exposition.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_pipeline_request_is_counted_timed_by_step_and_echoes_its_id(served: Served) -> None:
    response = await served.post(
        "/v1/predict", {"query": "天气", "timestamp": NOW}, {b"x-request-id": b"req-7"}
    )
    assert response.status == 200 and (b"x-request-id", b"req-7") in response.headers
    bad = await served.post("/v1/predict", {"query": "天气"}, {b"x-request-id": b"req-8"})
    assert bad.status == 400 and (b"x-request-id", b"req-8") in bad.headers
    text = served.metrics.exposition().decode()
    model = {"model": "hotword.pipeline", "version": "1"}
    assert sample(text, "ortserve_requests_total", **model, transport="http", outcome="success") == 1
    assert sample(text, "ortserve_requests_total", **model, transport="http", outcome="invalid") == 1
    assert sample(text, "ortserve_request_duration_seconds_count", **model, transport="http") == 2
    for phase in ("input", "infer", "output"):
        assert sample(text, "ortserve_compute_seconds_count", **model, phase=phase) == 1


async def test_a_pipeline_request_is_traced_with_its_steps_and_captured(
    served: Served, tmp_path: Path
) -> None:
    traceparent = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    response = await served.post(
        "/v1/predict", {"query": "天气", "timestamp": NOW}, {b"traceparent": traceparent}
    )
    assert response.status == 200
    spans = {span.name: span for span in served.exporter.get_finished_spans()}
    assert {"decode", "encode"} <= set(spans)
    assert all(span.context.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736 for span in spans.values())
    await served.capture.stop()
    [record] = list(read_capture([tmp_path / "capture"]))
    assert (record.path, record.model, record.status) == ("/v1/predict", "hotword.pipeline", 200)
    assert orjson.loads(record.body)["query"] == "天气"
    await served.capture.start()
