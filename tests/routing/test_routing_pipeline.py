"""Pipeline routes follow the wrapped model's routing policy: the sticky key from the body or a
header, ab_tag in the body, the version that served in X-Model-Version, and the model calls
really run on that version."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from ortserve.core.dataplane import DataPlane
from ortserve.core.types import ServerMetadata
from ortserve.protocol.tensors import TensorLimits
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.routing.table import RoutingTable
from ortserve.server.exchange import Exchange
from ortserve.server.http.app import HttpApp
from ortserve.server.http.messages import HttpRequest, HttpResponse
from ortserve.server.http.pipeline_routes import register_pipeline_routes
from ortserve.settings import ServerSettings
from ortserve.statistics import ServerStatistics
from ortserve.telemetry import Telemetry

NOW = 1_759_017_600_000
ROUTING = """
version_policy: all
routing:
  split: {"1": 50, "2": 50}
  override: {variants: {new: "2"}}
"""


class Routed:
    def __init__(self, app: HttpApp, statistics: ServerStatistics, table: RoutingTable) -> None:
        self.app, self.statistics, self.table = app, statistics, table

    async def version(self, headers: dict[bytes, bytes] | None = None, **fields: object) -> str:
        body = orjson.dumps({"query": "天气", "timestamp": NOW, **fields})
        result = self.app(HttpRequest("POST", "/v1/predict", "", headers or {}, body))
        response = await result  # type: ignore[misc]
        assert isinstance(response, HttpResponse) and response.status == 200
        return dict(response.headers)[b"x-model-version"].decode()

    def inferences(self, version: str) -> int:
        return sum(s.inference_count for s in self.statistics.snapshot("hotword", version))


@pytest.fixture
async def routed(demo_repository: Path, tmp_path: Path) -> AsyncIterator[Routed]:
    model = tmp_path / "models" / "hotword"
    shutil.copytree(demo_repository / "hotword", model)
    shutil.copytree(model / "1", model / "2")
    with (model / "config.yaml").open("a", encoding="utf-8") as config:
        config.write(ROUTING)
    telemetry = Telemetry(ServerStatistics())
    registry = ModelRegistry(observers=telemetry.observer_for)
    settings = ServerSettings(model_repository=tmp_path / "models", intra_op_threads=1)
    await LifecycleManager(registry, settings).start()
    table = RoutingTable(registry, time.monotonic)
    table.sync()
    dataplane = DataPlane(registry, ServerMetadata("ortserve", "test", ()))
    exchange = Exchange(dataplane, telemetry, routers=table.routers)
    app = HttpApp(dataplane, TensorLimits(1 << 20, 8, 1 << 20), exchange=exchange)
    register_pipeline_routes(registry, app)
    try:
        yield Routed(app, telemetry.statistics, table)
    finally:
        await registry.unload_all(5.0)


async def test_the_body_key_sticks_and_the_model_calls_run_on_the_routed_version(routed: Routed) -> None:
    before = {v: routed.inferences(v) for v in ("1", "2")}
    chosen = {f"user-{i}": await routed.version(user_id=f"user-{i}") for i in range(30)}
    assert set(chosen.values()) == {"1", "2"}
    for user, version in list(chosen.items())[:10]:
        assert await routed.version(user_id=user) == version
        assert await routed.version({b"x-user-id": user.encode()}) == version
    served = Counter(chosen.values())
    for version in list(chosen.values())[:10]:
        served[version] += 2
    rows = {version: routed.inferences(version) - before[version] for version in ("1", "2")}
    # Every request is the same query (the same rows): each version ran exactly its requests' rows.
    assert rows["1"] > 0 and rows["2"] > 0
    assert rows["1"] * served["2"] == rows["2"] * served["1"]
    counts = routed.table.get("hotword")["versions"]
    assert counts["1"]["requests"] + counts["2"]["requests"] == 50


async def test_ab_tag_in_the_body_or_the_override_header_forces_a_version(routed: Routed) -> None:
    assert {await routed.version(user_id=f"u{i}", ab_tag="new") for i in range(5)} == {"2"}
    assert await routed.version({b"x-model-version": b"1"}, user_id="u1") == "1"
