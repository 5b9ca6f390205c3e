"""Both seed routes and the pipelines' OIP models through the real server process."""

from __future__ import annotations

import urllib.error
import urllib.request

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient

from ortserve.testing import ServerProcess

pytestmark = pytest.mark.e2e

NOW = 1_759_017_600_000


def post(server: ServerProcess, path: str, body: bytes) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(f"{server.http_url}{path}", data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, orjson.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


def route_body(orders: int, couriers: int, **order_fields: object) -> bytes:
    return orjson.dumps(
        {
            "orders": [
                {"id": f"o{i}", "lat": 39.92, "lon": 116.44, "created_at": NOW, "deadline": NOW + 3_600_000}
                | order_fields
                for i in range(orders)
            ],
            "couriers": [
                {"id": f"c{j}", "lat": 39.93, "lon": 116.45, "capacity": 4} for j in range(couriers)
            ],
            "now": NOW,
        }
    )


def test_predict_answers_ranked_tagged_hotwords_and_flags_unrelated_queries(server: ServerProcess) -> None:
    status, answer = post(
        server, "/v1/predict", orjson.dumps({"query": "旅游攻略", "timestamp": NOW, "top_k": 7})
    )
    assert status == 200 and answer["matched"] is True
    hotwords = answer["hotwords"]
    assert isinstance(hotwords, list) and len(hotwords) == 7
    assert hotwords[0]["word"] == "旅游攻略" and hotwords[1]["word"] == "国庆旅游攻略"
    assert hotwords[1]["tags"] == ["节假日"] and hotwords[1]["tag_ids"] == ["holiday"]
    assert answer["model_version"] == "1"
    status, answer = post(server, "/v1/predict", orjson.dumps({"query": "量子计算机原理", "timestamp": NOW}))
    assert status == 200 and answer["matched"] is False and answer["hotwords"] == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (orjson.dumps({"query": "天气", "timestamp": NOW, "lang": "zh"}), "'lang'"),
        (orjson.dumps({"query": ["天气"], "timestamp": NOW}), "'query'"),
        (orjson.dumps({"query": "天气", "timestamp": "now"}), "'timestamp'"),
        (orjson.dumps({"query": "天气", "timestamp": NOW, "top_k": 0}), "'top_k'"),
        (b"{not json", "not valid JSON"),
    ],
)
def test_predict_rejects_bad_input_with_a_400_naming_the_field(
    server: ServerProcess, body: bytes, field: str
) -> None:
    status, answer = post(server, "/v1/predict", body)
    assert status == 400 and field in str(answer["error"])


def test_route_assigns_orders_within_capacity(server: ServerProcess) -> None:
    status, answer = post(server, "/v1/route", route_body(orders=10, couriers=2))
    assert status == 200
    assigned = [o["courier_id"] for o in answer["orders"]]  # type: ignore[attr-defined]
    assert assigned.count("c0") <= 4 and assigned.count("c1") <= 4
    assert len(answer["unassigned"]) == 10 - sum(c is not None for c in assigned)  # type: ignore[arg-type]


def test_route_leaves_an_unplaceable_address_unassigned_and_rejects_bad_requests_whole(
    server: ServerProcess,
) -> None:
    mars = {"id": "o1", "address": "火星基地", "created_at": NOW, "deadline": NOW + 60_000}
    courier = {"id": "c1", "lat": 39.9, "lon": 116.4, "capacity": 1}
    status, answer = post(server, "/v1/route", orjson.dumps({"orders": [mars], "couriers": [courier]}))
    assert status == 200 and answer["orders"] == []
    assert "orders[0].address" in str(answer["unassigned"])
    status, answer = post(server, "/v1/route", orjson.dumps({"orders": [mars]}))
    assert status == 400 and "'couriers'" in str(answer["error"])
    status, answer = post(server, "/v1/route", route_body(orders=501, couriers=200))
    assert status == 413 and "pairs" in str(answer["error"])


def test_pipelines_are_oip_models_with_bytes_json_documents(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_address)
    try:
        metadata = client.get_model_metadata("hotword.pipeline")
        assert metadata["inputs"] == [{"name": "request", "datatype": "BYTES", "shape": [-1]}]
        documents = np.array(
            [
                orjson.dumps({"query": "天气预报", "timestamp": NOW}),
                orjson.dumps({"query": "中秋月饼礼盒", "timestamp": NOW}),
            ],
            dtype=object,
        )
        tensor = httpclient.InferInput("request", [2], "BYTES")
        tensor.set_data_from_numpy(documents, binary_data=False)
        result = client.infer("hotword.pipeline", [tensor])
        answers = [orjson.loads(item) for item in result.as_numpy("response")]
        assert [a["hotwords"][0]["word"] for a in answers] == ["天气预报", "中秋月饼礼盒"]
    finally:
        client.close()
