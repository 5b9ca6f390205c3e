"""A refusal's CPU inside the server process, without sockets (issue 30): what the HTTP
connection spends on one whole refused POST, by path, beside the bare floor.

One connection with a transport that only counts writes, the server's real edge refusal
(``EarlyRefusal``) over a data plane that refuses every request, and ``data_received`` called
with the same whole request (a 64-float JSON body) again and again; CPU time of the thread per
call. Arms:

- ``bytes``: refused from the request's first bytes (``plain_post.screen_whole``), no parser;
- ``headers``: the same connection without that screen: httptools' callbacks, then the edge's
  verdict from the headers (the path every refusal took before);
- ``bare``: the floor of ``bench_refusal_floor.py`` (httptools parses, one canned write).

Run it against another source tree with PYTHONPATH=<tree>/src (that tree's connection may not
take a screen: then only ``headers`` and ``bare`` run). Syscalls and the loop are not in these
figures; ``bench_refusal_floor.py`` measures the same on the wire.

    taskset -c 1 .venv/bin/python benchmarks/bench_refusal_inprocess.py --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, cast

import httptools

sys.path.insert(0, str(Path(__file__).parent))

import machine

from ortserve.core.dataplane import DataPlane
from ortserve.errors import Overloaded
from ortserve.server.connections import ByteBudget, ConnectionSet
from ortserve.server.http.admission import EarlyRefusal
from ortserve.server.http.connection import ConnectionLimits, HttpConnection
from ortserve.server.http.messages import HttpRequest, HttpResponse
from ortserve.statistics import ServerStatistics
from ortserve.telemetry import Telemetry

OUT = Path(__file__).parent / "out"
BODY = (
    b'{"inputs":[{"name":"input","shape":[1,64],"datatype":"FP32","data":['
    + b",".join([b"0.5"] * 64)
    + b"]}]}"
)
REQUEST = (
    b"POST /v2/models/small_mlp/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
)
CANNED = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b'content-length: 21\r\n\r\n{"error": "overload"}'
)


class Plane:
    """Refuses every request (the kept verdict of an overloaded model)."""

    error = Overloaded("the queue is full")

    def refusal(self, name: str, version: str | None, priority: int, tenant_of: Any = None) -> Overloaded:
        return self.error


class Counting:
    """A transport that counts writes."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1

    def writelines(self, pieces: list[bytes]) -> None:
        self.writes += 1

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


class Bare(asyncio.Protocol):
    def __init__(self, transport: Counting) -> None:
        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.transport.write(CANNED)


def handler(request: HttpRequest) -> HttpResponse:
    raise AssertionError("every request is refused")


def connection(arm: str, loop: asyncio.AbstractEventLoop) -> tuple[Any, Counting]:
    wire = Counting()
    if arm == "bare":
        return Bare(wire), wire
    edge = EarlyRefusal(cast(DataPlane, Plane()), Telemetry(ServerStatistics()))
    screen = (edge.refuse_target,) if arm == "bytes" else ()
    made = HttpConnection(
        handler, ConnectionLimits(), ConnectionSet(), loop, ByteBudget(1 << 40), edge, *screen
    )
    made.connection_made(cast(asyncio.Transport, wire))
    return made, wire


async def one_round(arms: list[str], calls: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    result = {}
    for arm in arms:
        protocol, wire = connection(arm, loop)
        for _ in range(calls // 20):
            protocol.data_received(REQUEST)
        started = time.thread_time()
        for _ in range(calls):
            protocol.data_received(REQUEST)
        result[arm] = (time.thread_time() - started) / calls * 1e6
        assert wire.writes >= calls, f"{arm}: every request answered"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--label", default="this checkout")
    args = parser.parse_args()
    arms = ["bare", "headers"]
    if "screen" in inspect.signature(HttpConnection.__init__).parameters:
        arms.insert(1, "bytes")
    cells: dict[str, list[float]] = {arm: [] for arm in arms}
    for _ in range(args.rounds):
        for arm, value in asyncio.run(one_round(arms, args.calls)).items():
            cells[arm].append(value)
    medians = {arm: round(statistics.median(values), 2) for arm, values in cells.items()}
    OUT.mkdir(exist_ok=True)
    report = {"machine": machine.stamp(), "args": vars(args), "us_per_refusal": cells, "medians": medians}
    (OUT / "refusal_inprocess.json").write_text(json.dumps(report, indent=2, default=str))
    print(args.label, "CPU per refused request in process, medians (us):", medians, flush=True)


if __name__ == "__main__":
    main()
