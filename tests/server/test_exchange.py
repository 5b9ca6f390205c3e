"""Every request family passes through the one Exchange: OIP over HTTP, OIP over gRPC, a
pipeline route, OpenAI chat (plain and streamed), the generate extension, OpenAI responses
(plain and streamed) and vLLM's tokenize and detokenize are each counted under the same labels,
access-logged, traced, captured, and echo their request id; a refused request has the same
shape as the others of its transport."""

from __future__ import annotations

import logging
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import orjson
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ortserve.capture import Capture
from ortserve.capture_records import read_capture
from ortserve.core.dataplane import DataPlane
from ortserve.core.types import ServerMetadata
from ortserve.demo import write_demo_repository
from ortserve.llm.demo import DEMO_LLM_NAME, write_demo_llm
from ortserve.metrics import ServerMetrics
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.protocol.tensors import TensorLimits
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.routing.table import RoutingTable
from ortserve.server.exchange import Exchange
from ortserve.server.grpc.listener import GrpcListener
from ortserve.server.grpc.options import GrpcOptions
from ortserve.server.http.app import HttpApp
from ortserve.server.http.generate_routes import add_generate_routes
from ortserve.server.http.llm_tool_routes import add_llm_tool_routes
from ortserve.server.http.messages import HttpRequest, HttpResponse, resolve_response
from ortserve.server.http.openai_routes import add_openai_routes
from ortserve.server.http.pipeline_routes import register_pipeline_routes
from ortserve.settings import ServerSettings
from ortserve.statistics import ServerStatistics
from ortserve.telemetry import Telemetry
from ortserve.tracing import Tracing, tracer_provider

pytestmark = pytest.mark.asyncio(loop_scope="module")

NOW = 1_759_017_600_000
INFER = "/inference.GRPCInferenceService/ModelInfer"


@dataclass
class Edge:
    app: HttpApp
    grpc_target: str
    metrics: ServerMetrics
    exporter: InMemorySpanExporter
    capture: Capture
    capture_dir: Path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def edge(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Edge]:
    root = tmp_path_factory.mktemp("exchange")
    demo = root / "demo"
    write_demo_repository(demo)
    models = root / "models"
    models.mkdir()
    for name in ("small_mlp", "hotword"):
        shutil.copytree(demo / name, models / name)
    write_demo_llm(models)
    exporter = InMemorySpanExporter()
    tracing = Tracing(tracer_provider(1.0, SimpleSpanProcessor(exporter)).get_tracer("test"))
    metrics = ServerMetrics(lambda: [], lambda: {})
    telemetry = Telemetry(ServerStatistics(), metrics, tracing, access_log=True)
    registry = ModelRegistry(observers=telemetry.observer_for)
    settings = ServerSettings(model_repository=models, intra_op_threads=1)
    await LifecycleManager(registry, settings).start()
    capture = Capture(root / "capture", rate=1.0)
    await capture.start()
    dataplane = DataPlane(registry, ServerMetadata("ortserve", "test", ()))
    routing = RoutingTable(registry, lambda: 0.0)
    dataplane.routers = routing.routers
    exchange = Exchange(dataplane, telemetry, capture, routing.routers)  # one, for both transports
    limits = TensorLimits(1 << 20, 8, 1 << 20)
    app = HttpApp(dataplane, limits, exchange=exchange)
    add_openai_routes(app, registry)
    add_generate_routes(app, registry)
    add_llm_tool_routes(app, registry, dataplane.ready)
    register_pipeline_routes(registry, app)
    listener = GrpcListener(
        dataplane, limits, GrpcOptions.from_settings(settings), telemetry, exchange=exchange
    )
    port = await listener.start("127.0.0.1", 0)
    try:
        yield Edge(app, f"127.0.0.1:{port}", metrics, exporter, capture, root / "capture")
    finally:
        listener.stop_accepting(1.0)
        await listener.wait_closed()
        await capture.stop()
        await registry.unload_all(5.0)


@dataclass(frozen=True)
class Answer:
    """What a family's request got back, in transport-neutral terms."""

    ok: bool
    code: int | str  # the HTTP status or the gRPC status name
    request_id: str | None  # as echoed (X-Request-ID, or the OIP response id)
    body: dict[str, object] | None


async def http(edge: Edge, path: str, document: object, request_id: str) -> Answer:
    request = HttpRequest(
        "POST",
        path,
        "",
        {b"x-request-id": request_id.encode(), b"content-type": b"application/json"},
        orjson.dumps(document),
    )
    response: HttpResponse = await resolve_response(edge.app(request))
    body = b"".join(bytes(c) for c in response.chunks)
    if response.stream is not None:
        body += b"".join([piece async for piece in response.stream])
    echoed = dict(response.headers).get(b"x-request-id")
    parsed = orjson.loads(body) if response.stream is None else {"events": body.decode()}
    return Answer(response.status == 200, response.status, echoed.decode() if echoed else None, parsed)


async def oip_grpc(edge: Edge, good: bool, request_id: str) -> Answer:
    request = pb.ModelInferRequest(model_name="small_mlp", id=request_id)
    tensor = request.inputs.add(name="input" if good else "nope", datatype="FP32", shape=[1, 64])
    tensor.contents.fp32_contents.extend([0.5] * 64)
    async with grpc.aio.insecure_channel(edge.grpc_target) as channel:
        call = channel.unary_unary(
            INFER,
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        try:
            reply = await call(request, timeout=30)
        except grpc.aio.AioRpcError as error:
            return Answer(False, error.code().name, None, {"error": error.details()})
    return Answer(True, "OK", reply.id, None)


def oip_body(good: bool) -> dict[str, object]:
    name = "input" if good else "nope"
    return {"inputs": [{"name": name, "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]}


def chat_body(good: bool, stream: bool) -> dict[str, object]:
    return {
        "model": DEMO_LLM_NAME,
        "messages": [{"role": "user", "content": "The lighthouse stood at the end"}],
        "max_tokens": 4,
        "temperature": 0 if good else -1,
        "stream": stream,
    }


def responses_body(good: bool, stream: bool) -> dict[str, object]:
    return {
        "model": DEMO_LLM_NAME,
        "input": "The lighthouse stood at the end",
        "max_output_tokens": 4,
        "temperature": 0 if good else -1,
        "stream": stream,
    }


Send = Callable[[Edge, bool, str], Awaitable[Answer]]


@dataclass(frozen=True)
class Family:
    transport: str
    model: str
    path: str  # the captured record's path
    refused: int | str  # the refusal's HTTP status or gRPC code
    send: Send


FAMILIES = {
    "oip-http": Family(
        "http",
        "small_mlp",
        "/v2/models/small_mlp/infer",
        400,
        lambda e, good, rid: http(e, "/v2/models/small_mlp/infer", oip_body(good), rid),
    ),
    "oip-grpc": Family("grpc", "small_mlp", "/v2/models/small_mlp/infer", "INVALID_ARGUMENT", oip_grpc),
    "pipeline": Family(
        "http",
        "hotword.pipeline",
        "/v1/predict",
        400,
        lambda e, good, rid: http(
            e, "/v1/predict", {"query": "天气", **({"timestamp": NOW} if good else {})}, rid
        ),
    ),
    "openai": Family(
        "http",
        DEMO_LLM_NAME,
        "/v1/chat/completions",
        400,
        lambda e, good, rid: http(e, "/v1/chat/completions", chat_body(good, False), rid),
    ),
    "generate": Family(
        "http",
        DEMO_LLM_NAME,
        f"/v2/models/{DEMO_LLM_NAME}/generate",
        400,
        lambda e, good, rid: http(
            e,
            f"/v2/models/{DEMO_LLM_NAME}/generate",
            {"text_input": "The lighthouse", "max_tokens": 4} if good else {"max_tokens": 4},
            rid,
        ),
    ),
    "responses": Family(
        "http",
        DEMO_LLM_NAME,
        "/v1/responses",
        400,
        lambda e, good, rid: http(e, "/v1/responses", responses_body(good, False), rid),
    ),
    "responses-stream": Family(
        "http",
        DEMO_LLM_NAME,
        "/v1/responses",
        400,
        lambda e, good, rid: http(e, "/v1/responses", responses_body(good, True), rid),
    ),
    "tokenize": Family(
        "http",
        DEMO_LLM_NAME,
        "/tokenize",
        400,
        lambda e, good, rid: http(
            e, "/tokenize", {"model": DEMO_LLM_NAME, "prompt": "The lighthouse" if good else 7}, rid
        ),
    ),
    "detokenize": Family(
        "http",
        DEMO_LLM_NAME,
        "/detokenize",
        400,
        lambda e, good, rid: http(
            e, "/detokenize", {"model": DEMO_LLM_NAME, "tokens": [1, 2, 3] if good else [-1]}, rid
        ),
    ),
    "openai-stream": Family(
        "http",
        DEMO_LLM_NAME,
        "/v1/chat/completions",
        400,
        lambda e, good, rid: http(e, "/v1/chat/completions", chat_body(good, True), rid),
    ),
}


def count(edge: Edge, family: Family, outcome: str) -> float:
    labels = (
        f'model="{family.model}"',
        'version="1"',
        f'transport="{family.transport}"',
        f'outcome="{outcome}"',
    )
    for line in edge.metrics.exposition().decode().splitlines():
        if line.startswith("ortserve_requests_total{") and all(label in line for label in labels):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def latencies(edge: Edge, family: Family) -> float:
    labels = (f'model="{family.model}"', 'version="1"', f'transport="{family.transport}"')
    for line in edge.metrics.exposition().decode().splitlines():
        if line.startswith("ortserve_request_duration_seconds_count{") and all(
            label in line for label in labels
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("name", list(FAMILIES))
async def test_every_family_is_counted_logged_traced_captured_and_echoes_its_id(
    edge: Edge, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    family = FAMILIES[name]
    before = (count(edge, family, "success"), count(edge, family, "invalid"), latencies(edge, family))
    with caplog.at_level(logging.INFO, logger="ortserve.access"):
        good = await family.send(edge, True, f"{name}-good")
        bad = await family.send(edge, False, f"{name}-bad")

    assert good.ok and good.request_id == f"{name}-good"
    # The refusal has its transport's shape: the status or code the error owns; over HTTP an
    # "error" body (OIP's string, OpenAI's object) and the id echoed.
    assert not bad.ok and bad.code == family.refused
    assert bad.body is not None and bad.body.get("error")
    if family.transport == "http":
        assert bad.request_id == f"{name}-bad"

    assert count(edge, family, "success") == before[0] + 1
    assert count(edge, family, "invalid") == before[1] + 1
    assert latencies(edge, family) == before[2] + 2
    logged = {
        getattr(r, "request_id", None): r.getMessage() for r in caplog.records if r.name == "ortserve.access"
    }
    assert f"{name}-good" in logged and f"{name}-bad" in logged
    assert f"{family.transport} infer {family.model}/1" in logged[f"{name}-good"]
    spans = [
        s
        for s in edge.exporter.get_finished_spans()
        if s.attributes and s.attributes.get("ortserve.request_id") == f"{name}-good"
    ]
    assert spans and spans[0].attributes is not None and spans[0].attributes["ortserve.model"] == family.model

    await edge.capture.stop()  # flush
    records = [
        r for r in read_capture([edge.capture_dir]) if r.model == family.model and r.path == family.path
    ]
    await edge.capture.start()
    assert {r.status for r in records} >= {200, 400}


async def test_a_stream_the_client_leaves_still_finishes_its_scope(edge: Edge) -> None:
    family = FAMILIES["openai-stream"]
    before = count(edge, family, "success")
    request = HttpRequest(
        "POST", "/v1/chat/completions", "", {}, orjson.dumps(chat_body(True, True) | {"max_tokens": 64})
    )
    response = await resolve_response(edge.app(request))
    assert response.stream is not None
    first = await anext(response.stream)
    assert first.startswith(b"data: ")
    await response.stream.aclose()  # type: ignore[attr-defined]  # what the connection does when the client leaves
    assert count(edge, family, "success") == before + 1
    assert not [s for s in edge.app.exchange.telemetry.live if s.model == DEMO_LLM_NAME]
