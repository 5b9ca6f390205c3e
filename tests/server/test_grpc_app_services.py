"""The seed applications' typed gRPC services answer as their JSON routes, through the same edge."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from grpc_reflection.v1alpha import reflection_pb2 as rpb

from ortserve.protocol.grpc import apps_pb2 as apb
from ortserve.server.grpc.app_services import message_document
from ortserve.testing import ServerProcess

pytestmark = pytest.mark.e2e

NOW = 1_759_017_600_000


@pytest.fixture
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_address) as opened:
        yield opened


def _serialize(message: Message) -> bytes:
    serialized: bytes = message.SerializeToString()
    return serialized


def _unary(channel: grpc.Channel, path: str, answer: type[Message]) -> Any:
    return channel.unary_unary(path, request_serializer=_serialize, response_deserializer=answer.FromString)


def _post(server: ServerProcess, route: str, document: dict[str, object]) -> Any:
    request = urllib.request.Request(
        f"{server.http_url}{route}", json.dumps(document).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def _as_json(message: Message) -> Any:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def test_predict_over_grpc_equals_the_json_route(server: ServerProcess, channel: grpc.Channel) -> None:
    predict = _unary(channel, "/ortserve.apps.v1.HotwordService/Predict", apb.PredictResponse)
    for query in ("国庆旅游攻略", "天气", "guoqing", "量子计算机原理"):
        request = apb.PredictRequest(query=query, region_id=110000, timestamp=NOW, top_k=3)
        typed, call = predict.with_call(request, timeout=30)
        expected = _post(server, "/v1/predict", message_document(request))
        got = _as_json(typed)
        assert got.get("matched", False) == expected["matched"]
        assert [h["word"] for h in got.get("hotwords", [])] == [h["word"] for h in expected["hotwords"]]
        assert [h["score"] for h in got.get("hotwords", [])] == [h["score"] for h in expected["hotwords"]]
        assert dict(call.trailing_metadata())["x-model-version"] == expected["model_version"]


def test_route_over_grpc_equals_the_json_route(server: ServerProcess, channel: grpc.Channel) -> None:
    route = _unary(channel, "/ortserve.apps.v1.DispatchService/Route", apb.RouteResponse)
    request = apb.RouteRequest(now=NOW, top_k=2)
    request.orders.add(id="o1", lat=39.92, lon=116.44, created_at=NOW, deadline=NOW + 1_800_000)
    request.orders.add(id="o2", address="北京市海淀区中关村大街1号", created_at=NOW, deadline=NOW + 3_600_000)
    request.orders.add(
        id="far", address="浙江省杭州市西湖区文三路1号", created_at=NOW, deadline=NOW + 3_600_000
    )
    request.couriers.add(id="c1", lat=39.92, lon=116.44, capacity=5, load=1)
    request.couriers.add(id="c2", lat=39.96, lon=116.30, capacity=3)
    typed = _as_json(route(request, timeout=30))
    expected = _post(server, "/v1/route", message_document(request))
    assert [(o["order_id"], o.get("courier_id", None)) for o in typed["orders"]] == [
        (o["order_id"], o["courier_id"]) for o in expected["orders"]
    ]
    assert typed["unassigned"] == expected["unassigned"] and typed["solver"] == expected["solver"]
    assert typed["orders"][1]["road"] == "中关村大街" and typed["orders"][1]["city"] == "北京市"


def test_a_bad_request_is_invalid_argument_naming_the_field(channel: grpc.Channel) -> None:
    predict = _unary(channel, "/ortserve.apps.v1.HotwordService/Predict", apb.PredictResponse)
    with pytest.raises(grpc.RpcError) as failure:
        predict(apb.PredictRequest(query="天气"), timeout=30)  # no timestamp
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "timestamp" in str(
        failure.value.details()
    )
    with pytest.raises(grpc.RpcError) as unknown:
        predict(
            apb.PredictRequest(query="天气", timestamp=NOW),
            metadata=(("x-ortserve-model", "nope"),),
            timeout=30,
        )
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_and_describes_the_typed_services(channel: grpc.Channel) -> None:
    reflect = channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        request_serializer=_serialize,
        response_deserializer=rpb.ServerReflectionResponse.FromString,
    )
    questions = [
        rpb.ServerReflectionRequest(list_services=""),
        rpb.ServerReflectionRequest(file_containing_symbol="ortserve.apps.v1.DispatchService"),
    ]
    listed, described = list(reflect(iter(questions), timeout=30))
    names = {service.name for service in listed.list_services_response.service}
    assert {"ortserve.apps.v1.HotwordService", "ortserve.apps.v1.DispatchService"} <= names
    assert described.file_descriptor_response.file_descriptor_proto


def test_route_constraints_travel_as_messages(server: ServerProcess, channel: grpc.Channel) -> None:
    route = _unary(channel, "/ortserve.apps.v1.DispatchService/Route", apb.RouteResponse)
    request = apb.RouteRequest(now=NOW)
    request.orders.add(id="inside", lat=39.92, lon=116.44, created_at=NOW, deadline=NOW + 3_600_000)
    request.couriers.add(id="c1", lat=39.921, lon=116.441, capacity=3)
    zone = request.constraints.add(kind="no_stopping", name="square", forbidden=True)
    for lat, lon in ((39.91, 116.43), (39.91, 116.45), (39.93, 116.45), (39.93, 116.43)):
        zone.polygon.add(lat=lat, lon=lon)
    document = message_document(request)
    assert document["constraints"] == [
        {
            "kind": "no_stopping",
            "name": "square",
            "polygon": [[39.91, 116.43], [39.91, 116.45], [39.93, 116.45], [39.93, 116.43]],
            "forbidden": True,
        }
    ]
    typed = _as_json(route(request, timeout=30))
    expected = _post(server, "/v1/route", document)
    assert typed["unassigned"] == expected["unassigned"] and "square" in typed["unassigned"][0]["reason"]
