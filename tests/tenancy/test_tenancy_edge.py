"""Tenancy is one concern of the one request edge: every request kind, on both transports, is
identified by its API key and held to its tenant's quota the same way, before its body is
decoded: no key is 401 / UNAUTHENTICATED, a tenant past its request quota is 429 + Retry-After
/ RESOURCE_EXHAUSTED (counted in ``ortserve_tenant_requests_total``), and an LLM request is
refused while its tenant owes tokens (its prompt and output are charged when it ends, in
``ortserve_tenant_tokens_total``), while the tenant's other requests are still served.

The quotas run on a fake clock: nothing refills unless a test moves it."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc
import orjson
import pytest
import pytest_asyncio
from google.protobuf.message import Message

from ortserve.core.dataplane import DataPlane
from ortserve.core.types import ServerMetadata
from ortserve.demo import write_demo_repository
from ortserve.llm.demo import DEMO_LLM_NAME, write_demo_llm
from ortserve.protocol.grpc import apps_pb2 as apb
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
from ortserve.tenancy.buckets import QuotaPolicy, TenantQuotas
from ortserve.tenancy.gate import TenantGate
from ortserve.tenancy.keys import ApiKeys
from ortserve.testing import FakeClock

pytestmark = pytest.mark.asyncio(loop_scope="module")

NOW = 1_759_017_600_000
SERVICE = "/inference.GRPCInferenceService"
KINDS = (
    "oip-http",
    "pipeline-http",
    "chat",
    "generate",
    "responses",
    "tokenize",
    "oip-grpc",
    "stream-grpc",
    "pipeline-grpc",
)
BURST = 2


@dataclass
class Edge:
    app: HttpApp
    target: str
    quotas: TenantQuotas
    clock: FakeClock


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def edge(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Edge]:
    root = tmp_path_factory.mktemp("tenancy-edge")
    demo = root / "demo"
    write_demo_repository(demo)
    models = root / "models"
    models.mkdir()
    for name in ("small_mlp", "hotword"):
        shutil.copytree(demo / name, models / name)
    write_demo_llm(models)
    telemetry = Telemetry(ServerStatistics())
    registry = ModelRegistry(observers=telemetry.observer_for)
    settings = ServerSettings(model_repository=models, intra_op_threads=1)
    await LifecycleManager(registry, settings).start()
    dataplane = DataPlane(registry, ServerMetadata("ortserve", "test", ()))
    routing = RoutingTable(registry, lambda: 0.0)
    dataplane.routers = routing.routers
    clock = FakeClock()
    policy = QuotaPolicy(requests_per_s=1.0, request_burst=BURST, tokens_per_s=1.0, token_burst=8.0)
    quotas = TenantQuotas(policy, clock.now)
    keys = {f"key-{kind}": kind for kind in KINDS} | {"key-chatty": "chatty"}
    exchange = Exchange(dataplane, telemetry, None, routing.routers, TenantGate(ApiKeys(keys), quotas))
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
        yield Edge(app, f"127.0.0.1:{port}", quotas, clock)
    finally:
        listener.stop_accepting(1.0)
        await listener.wait_closed()
        await registry.unload_all(5.0)


@dataclass(frozen=True)
class Answer:
    code: int | str  # the HTTP status or the gRPC status name
    retry_after: str | None  # HTTP's Retry-After


async def http(edge: Edge, path: str, document: object, key: str | None, broken: bool) -> Answer:
    headers = {b"content-type": b"application/json"}
    if key is not None:
        headers[b"authorization"] = f"Bearer {key}".encode()
    body = b"{not json" if broken else orjson.dumps(document)
    response: HttpResponse = await resolve_response(edge.app(HttpRequest("POST", path, "", headers, body)))
    if response.stream is not None:
        async for _ in response.stream:
            pass
    return Answer(response.status, dict(response.headers).get(b"retry-after", b"").decode() or None)


def infer_message(broken: bool) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="small_mlp")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    tensor.contents.fp32_contents.extend([0.5] * (3 if broken else 64))  # 3 values for 64: invalid
    return request


async def grpc_call(
    edge: Edge, method: str, message: Message, answer: type[Message], key: str | None, stream: bool
) -> Answer:
    metadata = () if key is None else (("authorization", f"Bearer {key}"),)
    async with grpc.aio.insecure_channel(edge.target) as channel:
        serialize = type(message).SerializeToString
        try:
            if stream:
                call = channel.stream_stream(method, serialize, answer.FromString)
                replies = [r async for r in call(iter([message]), metadata=metadata, timeout=30)]
                error = replies[0].error_message if replies else "no reply"
                if error:
                    return Answer(error, None)
            else:
                await channel.unary_unary(method, serialize, answer.FromString)(
                    message, metadata=metadata, timeout=30
                )
        except grpc.aio.AioRpcError as failure:
            return Answer(failure.code().name, None)
    return Answer("OK", None)


Send = Callable[[Edge, str | None, bool], Awaitable[Answer]]


def chat(model: str = DEMO_LLM_NAME, max_tokens: int = 4) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "The lighthouse"}],
        "max_tokens": max_tokens,
    }


SENDS: dict[str, Send] = {
    "oip-http": lambda e, k, b: http(
        e,
        "/v2/models/small_mlp/infer",
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]},
        k,
        b,
    ),
    "pipeline-http": lambda e, k, b: http(e, "/v1/predict", {"query": "天气", "timestamp": NOW}, k, b),
    "chat": lambda e, k, b: http(e, "/v1/chat/completions", chat(), k, b),
    "generate": lambda e, k, b: http(
        e, f"/v2/models/{DEMO_LLM_NAME}/generate", {"text_input": "The", "max_tokens": 2}, k, b
    ),
    "responses": lambda e, k, b: http(
        e, "/v1/responses", {"model": DEMO_LLM_NAME, "input": "The", "max_output_tokens": 2}, k, b
    ),
    "tokenize": lambda e, k, b: http(e, "/tokenize", {"model": DEMO_LLM_NAME, "prompt": "The"}, k, b),
    "oip-grpc": lambda e, k, b: grpc_call(
        e, f"{SERVICE}/ModelInfer", infer_message(b), pb.ModelInferResponse, k, False
    ),
    "stream-grpc": lambda e, k, b: grpc_call(
        e, f"{SERVICE}/ModelStreamInfer", infer_message(b), pb.ModelStreamInferResponse, k, True
    ),
    "pipeline-grpc": lambda e, k, b: grpc_call(
        e,
        "/ortserve.apps.v1.HotwordService/Predict",
        apb.PredictRequest(query="天气", timestamp=NOW if not b else 0),
        apb.PredictResponse,
        k,
        False,
    ),
}


def tenant_counts(edge: Edge) -> dict[tuple[str, ...], float]:
    return {(s.name, *s.labels.values()): s.value for family in edge.quotas.collect() for s in family.samples}


@pytest.mark.parametrize("kind", KINDS)
async def test_every_kind_is_identified_and_held_to_its_tenant_quota_before_its_body_is_decoded(
    edge: Edge, kind: str
) -> None:
    send = SENDS[kind]
    http_kind = not kind.endswith("grpc")
    # No key, or a wrong one, with a body that would not decode: the key is checked first.
    for key in (None, "key-wrong"):
        refused = await send(edge, key, True)
        if kind == "stream-grpc":  # a stream's request fails alone, the stream stays open
            assert isinstance(refused.code, str) and "API key" in refused.code
        else:
            assert refused.code == (401 if http_kind else "UNAUTHENTICATED")
    answers = [await send(edge, f"key-{kind}", False) for _ in range(BURST + 1)]
    assert [a.code for a in answers[:BURST]] == [200 if http_kind else "OK"] * BURST
    over = answers[BURST]
    if http_kind:
        assert over.code == 429 and over.retry_after is not None and int(over.retry_after) >= 1
    elif kind == "stream-grpc":
        assert isinstance(over.code, str) and "over its quota" in over.code
    else:
        assert over.code == "RESOURCE_EXHAUSTED"
    # Refused at the quota before decoding: a broken body is still a quota refusal.
    assert (await send(edge, f"key-{kind}", True)).code == over.code
    counts = tenant_counts(edge)
    assert counts[("ortserve_tenant_requests_total", kind, "admitted")] == BURST
    assert counts[("ortserve_tenant_requests_total", kind, "refused")] == 2


async def test_an_llm_tenant_that_spent_its_tokens_waits_while_its_onnx_requests_are_served(
    edge: Edge,
) -> None:
    send_onnx = SENDS["oip-http"]
    first = await http(edge, "/v1/chat/completions", chat(max_tokens=8), "key-chatty", False)
    assert first.code == 200
    await asyncio.sleep(0)  # the charge runs as the request's scope finishes (a callback)
    used = tenant_counts(edge)[("ortserve_tenant_tokens_total", "chatty")]
    assert used > 8  # prompt and output: more than the token burst, so the tenant is in debt
    refused = await http(edge, "/v1/chat/completions", chat(), "key-chatty", False)
    assert refused.code == 429 and refused.retry_after is not None
    assert int(refused.retry_after) >= int(used - 8)  # one token a second
    assert (await send_onnx(edge, "key-chatty", False)).code == 200
    edge.clock.advance(used)  # the debt paid back (and a request's unit refilled)
    assert (await http(edge, "/v1/chat/completions", chat(), "key-chatty", False)).code == 200
