"""What the Exchange costs an LLM request, in process: ``begin`` + ``llm`` (the version picked,
through a routing policy or not) + ``finish``, with metrics on and tracing, access log and
capture off, against the demo LLM loaded from its folder. Nothing is generated: the figure is
the edge's own cost, to set beside a generation's (tens of milliseconds per request at 16
streams on this machine, benchmarks/RESULTS.md "Text generation").

    python benchmarks/bench_exchange_overhead.py --requests 20000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from ortserve.core.dataplane import DataPlane
from ortserve.core.types import ServerMetadata
from ortserve.llm.demo import DEMO_LLM_NAME, write_demo_llm
from ortserve.metrics import ServerMetrics
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.routing.table import RoutingTable
from ortserve.server.exchange import Exchange
from ortserve.settings import ServerSettings
from ortserve.statistics import ServerStatistics
from ortserve.telemetry import Telemetry


async def measure(requests: int, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        models = Path(folder)
        write_demo_llm(models)
        telemetry = Telemetry(ServerStatistics(), ServerMetrics(lambda: [], lambda: {}))
        registry = ModelRegistry(observers=telemetry.observer_for)
        await LifecycleManager(registry, ServerSettings(model_repository=models, intra_op_threads=1)).start()
        dataplane = DataPlane(registry, ServerMetadata("ortserve", "bench", ()))
        table = RoutingTable(registry, time.monotonic)
        exchange = Exchange(dataplane, telemetry, None, table.routers)
        headers = {"x-user-id": "user-7"}.get
        results: dict[str, float] = {}
        try:
            for label, policy in (("no policy", None), ("sticky split", {"split": {"1": 100}})):
                if policy is None:
                    table.routers.clear()
                else:
                    table.put(DEMO_LLM_NAME, policy)
                per_request = []
                for _ in range(rounds):
                    started = time.perf_counter()
                    for _ in range(requests):
                        scope = exchange.begin("http", DEMO_LLM_NAME, None, "id", None)
                        exchange.llm(scope, DEMO_LLM_NAME, None, headers)
                        exchange.finish(scope, None, 200)
                    per_request.append((time.perf_counter() - started) / requests)
                results[label] = statistics.median(per_request)
        finally:
            await registry.unload_all(5.0)
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for label, seconds in asyncio.run(measure(args.requests, args.rounds)).items():
        print(f"{label:>14}: {seconds * 1e6:.2f} us per request (median of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
