"""CPU per request of the HTTP connection alone: parsing, bookkeeping, writing; no sockets.

Feeds POST requests (a 300-byte body, one request per read, as keep-alive clients send them)
to one ``HttpConnection`` whose handler answers at once, and a transport that drops what is
written; ``time.process_time`` per request, median of ``--repeats``. Run it under the old and
the new tree to compare the connection's own cost, which the server's noisy end-to-end
figures cannot resolve:

    PYTHONPATH=/tmp/limits-old/src python benchmarks/bench_http_connection.py
    python benchmarks/bench_http_connection.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp

import ortserve
from ortserve.server.connections import ConnectionSet
from ortserve.server.http.connection import ConnectionLimits, HttpConnection
from ortserve.server.http.messages import HttpRequest, HttpResponse

REQUEST = b"POST /v2/models/small_mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 300\r\n\r\n" + b"x" * 300
ANSWER = HttpResponse(200, [b'{"ok":true}'])


class DropTransport:
    """What the connection writes to goes nowhere."""

    def write(self, data: bytes) -> None:
        pass

    def writelines(self, chunks: list[bytes]) -> None:
        pass

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def answer(request: HttpRequest) -> HttpResponse:
    return ANSWER


async def measure(requests: int) -> float:
    loop = asyncio.get_running_loop()
    connection = HttpConnection(answer, ConnectionLimits(), ConnectionSet(), loop)
    connection.connection_made(DropTransport())  # type: ignore[arg-type]
    started = time.process_time()
    for _ in range(requests):
        connection.data_received(REQUEST)
    return (time.process_time() - started) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    runs = [asyncio.run(measure(args.requests)) for _ in range(args.repeats)]
    result = {
        **machine_stamp(),
        "tree": str(Path(ortserve.__file__).parent),
        "us_per_request": round(statistics.median(runs), 3),
        "runs": [round(r, 3) for r in runs],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
