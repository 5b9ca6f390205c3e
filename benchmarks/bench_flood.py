"""How long a CONTINUATION flood on the gRPC port stalls the shared event loop.

One HEADERS frame without END_HEADERS, then ``--frames`` empty CONTINUATION frames, sent in
one write to the gRPC port of a server pinned to CPU 0; meanwhile (this process, CPU 1) an
HTTP health probe is sent every 2 ms and the slowest answer during the flood is the stall.
Also reports how the flood connection ended (GOAWAY code, bytes the server read). Repeats
``--repeats`` times and prints the medians.

    python benchmarks/bench_flood.py --frames 16000 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp

from ortserve.demo import write_demo_repository
from ortserve.testing import run_server

OUT = Path(__file__).parent / "out"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def flood(port: int, frames: int) -> str:
    """Send the flood; return how the server ended the connection."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(PREFACE + frame(4, 0, 0) + frame(1, 0, 1, b"\x83") + frame(9, 0, 1) * frames)
        sock.settimeout(10)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    pos = 0
    while pos + 9 <= len(received):
        length = int.from_bytes(received[pos : pos + 3], "big")
        if received[pos + 3] == 7:  # GOAWAY
            return f"GOAWAY code {int.from_bytes(received[pos + 13 : pos + 17], 'big')}"
        pos += 9 + length
    return "no GOAWAY"


def probe_http(port: int, stop: threading.Event, latencies: list[float]) -> None:
    request = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port)) as sock:
        while not stop.is_set():
            started = time.perf_counter()
            sock.sendall(request)
            sock.recv(4096)
            latencies.append(time.perf_counter() - started)
            time.sleep(0.002)


def one_run(http_port: int, grpc_port: int, frames: int) -> tuple[float, float, str]:
    latencies: list[float] = []
    stop = threading.Event()
    prober = threading.Thread(target=probe_http, args=(http_port, stop, latencies))
    prober.start()
    time.sleep(0.2)
    before = len(latencies)
    started = time.perf_counter()
    ending = flood(grpc_port, frames)
    flood_s = time.perf_counter() - started
    time.sleep(0.2)
    stop.set()
    prober.join()
    during = latencies[before:]
    return max(during) * 1000, statistics.median(latencies[:before]) * 1000, f"{ending} after {flood_s:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=16_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    OUT.mkdir(exist_ok=True)
    repository = OUT / "flood-models"
    write_demo_repository(repository)
    stalls, idle, endings = [], [], []
    with run_server(repository, OUT / "flood-server.log", pin_cpu=0) as server:
        for _ in range(args.repeats):
            stall_ms, idle_ms, ending = one_run(server.http_port, server.grpc_port, args.frames)
            stalls.append(stall_ms)
            idle.append(idle_ms)
            endings.append(ending)
    result = {
        **machine_stamp(),
        "frames": args.frames,
        "slowest_probe_during_flood_ms": statistics.median(stalls),
        "probe_before_flood_ms": statistics.median(idle),
        "runs": endings,
    }
    (OUT / "flood.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
