"""The HTTP edge's refusal with tenancy on: a refusal is checked against the request's tenant,
named from the head by the gate, before the body is read."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from ortserve.core.dataplane import DataPlane
from ortserve.errors import OrtServeError, Overloaded
from ortserve.metrics import ServerMetrics
from ortserve.server.http.admission import EarlyRefusal
from ortserve.statistics import ServerStatistics
from ortserve.telemetry import Telemetry
from ortserve.tenancy.gate import TenantGate
from ortserve.tenancy.keys import ApiKeys

URL = b"/v2/models/m/infer"
FLOODED = Overloaded("about 300 ms of waiting ahead", retry_after_s=0.3)


class FloodedModel:
    """A model whose kept verdict refuses; only the tenant ``quiet`` is under its share."""

    def __init__(self) -> None:
        self.asked: list[str | None] = []

    def refusal(
        self,
        name: str,
        version: str | None,
        priority: int = 0,
        tenant_of: Callable[[], str | None] | None = None,
    ) -> OrtServeError | None:
        tenant = None if tenant_of is None else tenant_of()
        self.asked.append(tenant)
        return None if tenant == "quiet" else FLOODED


def edge(gate: TenantGate | None) -> tuple[EarlyRefusal, FloodedModel]:
    model = FloodedModel()
    telemetry = Telemetry(ServerStatistics(), ServerMetrics(lambda: [], lambda: {}))
    return EarlyRefusal(cast(DataPlane, model), telemetry, gate), model


async def test_the_quiet_tenant_passes_the_edge_that_refuses_the_flood() -> None:
    refusal, model = edge(TenantGate(None, None))
    assert refusal(b"POST", URL, {b"x-tenant-id": b"quiet"}) is None
    refused = refusal(b"POST", URL, {b"x-tenant-id": b"flood"})
    assert refused is not None and b"429" in refused.head
    assert refusal(b"POST", URL, {}) is not None  # no header: tenant "default"
    assert model.asked == ["quiet", "flood", "default"]


async def test_the_tenant_of_a_key_is_the_keys_and_a_bad_key_is_left_to_the_full_path() -> None:
    refusal, model = edge(TenantGate(ApiKeys({"k-quiet": "quiet"}), None))
    assert refusal(b"POST", URL, {b"authorization": b"Bearer k-quiet"}) is None
    assert refusal(b"POST", URL, {b"authorization": b"Bearer wrong", b"x-tenant-id": b"quiet"}) is not None
    assert model.asked == ["quiet", None]


async def test_without_tenancy_the_edge_never_asks_for_a_tenant() -> None:
    refusal, model = edge(None)
    assert refusal(b"POST", URL, {b"x-tenant-id": b"quiet"}) is not None
    assert model.asked == [None]
