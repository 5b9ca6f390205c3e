"""CPU time per request through the HTTP routes, codec, scheduler and ONNX Runtime, no sockets.

Process CPU time (all threads) divided by requests is far steadier than wall-clock rates on a
shared machine, so it is the figure to compare old against new for hot-path changes.

    python benchmarks/bench_hot_path.py --requests 20000 --burst 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from pathlib import Path

from ortserve.demo import write_demo_repository
from ortserve.server.http.messages import Deferred, HttpRequest, HttpResponse
from ortserve.server.lifecycle import Server
from ortserve.settings import ServerSettings

OUT = Path(__file__).parent / "out"


async def run(model: str, width: int, requests: int, burst: int) -> float:
    settings = ServerSettings(
        model_repository=OUT / "models", http_port=0, grpc_port=-1, metrics_port=-1, intra_op_threads=1
    )
    server = Server(settings)
    await server.registry.load_repository(settings)
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, width], "datatype": "FP32", "data": [0.1] * width}]}
    ).encode()
    request = HttpRequest(
        "POST", f"/v2/models/{model}/infer", "", {b"content-type": b"application/json"}, body
    )

    async def one() -> HttpResponse:
        result = server.http_app(request)
        assert isinstance(result, Deferred)
        with contextlib.suppress(Exception):
            await result.future
        return result.finish(result.future)

    for _ in range(200):
        await one()
    start = time.process_time()
    done = 0
    while done < requests:
        responses = await asyncio.gather(*(one() for _ in range(burst)))
        assert all(r.status == 200 for r in responses)
        done += burst
    cpu = time.process_time() - start
    await server.registry.unload_all(5)
    return cpu / done * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--burst", type=int, default=32)
    args = parser.parse_args()
    if not (OUT / "models" / "small_mlp").exists():
        write_demo_repository(OUT / "models")
    os.sched_setaffinity(0, {0})
    import uvloop

    for model, width in (("small_mlp", 64), ("heavy_mlp", 512)):
        count = args.requests if model == "small_mlp" else args.requests // 10
        micros = uvloop.run(run(model, width, count, args.burst))
        print(f"{model}: {micros:.1f} µs CPU per request (burst {args.burst}, {count} requests)")


if __name__ == "__main__":
    main()
