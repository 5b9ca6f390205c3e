"""Does inflating compressed request bodies stall the event loop? Health probes during bombs.

A server pinned to CPU 0 (default 64 MiB body limit) gets ``--bombs`` gzip bodies of 256 MiB of
zeros (about 1.1 MB on the wire each, one after another on one connection): each inflates to
the limit and is answered 413. Meanwhile this process (CPU 1) sends an HTTP health probe every
2 ms on another connection; the slowest probe answered during the bombs is the stall. For
comparison the probe also runs as long again without bombs (what the shared machine alone
costs), and this process times what inflating 64 MiB in one call costs (the stall of a server
that inflated whole bodies on its loop) and ortserve's inflation of a 32 MiB incompressible
body (work linear in the body).

    python benchmarks/bench_inflate.py --bombs 5 --repeats 3
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import statistics
import sys
import threading
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_flood import probe_http
from machine import stamp as machine_stamp

from ortserve.demo import write_demo_repository
from ortserve.testing import run_server

OUT = Path(__file__).parent / "out"
LIMIT = 64 * 1024 * 1024


def send_bombs(port: int, bomb: bytes, count: int) -> list[int]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    statuses = []
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    for _ in range(count):
        connection.request("POST", "/v2/models/small_mlp/infer", bomb, headers)
        reply = connection.getresponse()
        reply.read()
        statuses.append(reply.status)
        if reply.getheader("connection") == "close":
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.close()
    return statuses


def one_run(port: int, bomb: bytes, count: int) -> tuple[float, float, float, list[int]]:
    """(slowest probe during the bombs, slowest probe in as long without them, bombs' wall
    time, statuses): the idle window shows what the shared machine alone costs."""
    latencies: list[float] = []
    stop = threading.Event()
    prober = threading.Thread(target=probe_http, args=(port, stop, latencies))
    prober.start()
    time.sleep(0.1)
    before = len(latencies)
    started = time.perf_counter()
    statuses = send_bombs(port, bomb, count)
    elapsed = time.perf_counter() - started
    during = len(latencies)
    time.sleep(elapsed)
    stop.set()
    prober.join()
    return max(latencies[before:during]), max(latencies[during:]), elapsed, statuses


def inflate_random_s(megabytes: int) -> float:
    """ortserve's Inflation of an incompressible body (the gzip body is as large), best of 3."""
    from ortserve.server.http.encoding import Inflation

    body = gzip.compress(os.urandom(megabytes * 1024 * 1024), compresslevel=1)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        assert Inflation(body, b"gzip", LIMIT).run(LIMIT + 1)
        best = min(best, time.perf_counter() - started)
    return best


def whole_body_inflation_s(bomb: bytes) -> float:
    """Inflating the limit's worth at once, as one call on the loop would (best of 3)."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(bomb, LIMIT + 1)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bombs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    bomb = gzip.compress(bytes(256 * 1024 * 1024), compresslevel=9)
    root = OUT / "inflate-models"
    if not root.exists():
        write_demo_repository(root)
    runs = []
    with run_server(root, OUT / "inflate-server.log", ["--grpc-port", "-1"], pin_cpu=0) as server:
        for _ in range(args.repeats):
            runs.append(one_run(server.http_port, bomb, args.bombs))
    result = {
        **machine_stamp(),
        "bomb_wire_bytes": len(bomb),
        "bombs_per_run": args.bombs,
        "statuses": sorted({s for run in runs for s in run[3]}),
        "slowest_probe_during_bombs_ms": statistics.median(r[0] for r in runs) * 1000,
        "slowest_probe_without_bombs_ms": statistics.median(r[1] for r in runs) * 1000,
        "inflate_32mib_random_ms": inflate_random_s(32) * 1000,
        "bomb_seconds_each": statistics.median(r[2] for r in runs) / args.bombs,
        "whole_body_inflation_on_one_call_ms": whole_body_inflation_s(bomb) * 1000,
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "inflate.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
