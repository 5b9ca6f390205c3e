"""The lockout of issue 27 item 1: how new clients fare while 10,000 connections hold requests
that never finish, old tree against this one, side by side.

Each variant runs a fresh server (``--max-connections`` = ``--stalled``) pinned to CPU 0; this
process and its helpers run on CPU 1, every process with ``ulimit -n`` raised to its hard
limit. Helper processes (at most 9,000 sockets each) open ``--stalled`` connections: most send
the gRPC preface and the HEADERS of a ModelInfer call without END_STREAM, the rest
(``--http-share``) an HTTP request head announcing a 1 MB body and its first byte; then they go
silent. The attacker keeps the pressure on: a gRPC connection whose call the server ends opens
the next one at once (stalled the same way), and every connection the server closes is opened
and stalled again twice a second (the helpers run at nice 10, so the probes sharing their CPU
measure the server). Once all are held, new clients probe the server for ``--probe-seconds``
(and for 10 s before the attack: the machine's noise floor), one every 50 ms, alternating,
each on a new connection: HTTP ``GET /v2/health/ready`` and gRPC
``grpc.health.v1.Health/Check``. Reported: how many were answered (200 / SERVING), the
latency percentiles of every probe (a refusal counts at the time it took), and the server's
CPU share while probed.

    python benchmarks/bench_lockout.py --old-src /tmp/old/src
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing as mp
import os
import resource
import selectors
import socket
import statistics
import sys
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import onnx
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp

from ortserve.demo import DEMO_MODELS, build_mlp
from ortserve.testing import ServerProcess, run_server

OUT = Path(__file__).parent / "out"
PER_PROCESS = 9_000


FIELDS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/inference.GRPCInferenceService/ModelInfer"),
    (":authority", "x"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]
GRPC = b"grpc"  # a target's payload marker: the bytes come from its own h2 client


def grpc_client() -> tuple[h2.connection.H2Connection, bytes]:
    """A client, and its preface, SETTINGS and an open ModelInfer call (no END_STREAM)."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(1, FIELDS)
    return client, client.data_to_send()


def restall(client: h2.connection.H2Connection, data: bytes) -> tuple[bytes, bool]:
    """Read what the server sent; when it ended the open call, open the next one (True)."""
    ended = opened = False
    try:
        for event in client.receive_data(data):
            ended = ended or isinstance(event, h2.events.StreamEnded | h2.events.StreamReset)
        if ended and not client.open_outbound_streams:
            client.send_headers(client.get_next_available_stream_id(), FIELDS)
            opened = True
    except h2.exceptions.H2Error:
        pass
    return client.data_to_send(), opened


HTTP_STALL = b"POST /v2/models/small_mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{"


def stall(
    host: str, port: int, payload: bytes
) -> tuple[socket.socket, h2.connection.H2Connection | None] | None:
    client = None
    if payload == GRPC:
        client, payload = grpc_client()
    try:
        sock = socket.create_connection((host, port), timeout=5)
        sock.sendall(payload)
        sock.setblocking(False)
        return sock, client
    except OSError:
        return None


def hold(
    host: str,
    targets: list[tuple[int, bytes]],
    opened: mp.Queue[tuple[int, int]],
    reopened: mp.Queue[tuple[int, int]],
    stop: Event,
) -> None:
    """In a child process: open and stall one connection per target, report, then keep them
    held (reading and dropping what the server sends) and reopen the ones it closes."""
    os.sched_setaffinity(0, {1})
    os.nice(10)  # the probes on the same CPU measure the server, not the attacker's loop
    selector = selectors.DefaultSelector()
    failed = 0
    for target in targets:
        held = stall(host, *target)
        if held is None:
            failed += 1
        else:
            selector.register(held[0], selectors.EVENT_READ, (target, held[1]))
    opened.put((len(targets) - failed, failed))
    closed: list[tuple[int, bytes]] = []
    count = restalled = 0
    next_reopen = time.monotonic() + 0.5
    while not stop.is_set():
        for key, _ in selector.select(timeout=0.1):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            target, client = key.data
            if not data:
                selector.unregister(sock)
                sock.close()
                closed.append(target)
            elif client is not None:
                more, opened = restall(client, data)
                if more:
                    with contextlib.suppress(OSError):
                        sock.send(more)
                restalled += opened
        if closed and time.monotonic() >= next_reopen:
            for target in closed:
                held = stall(host, *target)
                if held is not None:
                    selector.register(held[0], selectors.EVENT_READ, (target, held[1]))
                    count += 1
            closed = []
            next_reopen = time.monotonic() + 0.5
    reopened.put((count, restalled))
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]


def http_probe(server: ServerProcess) -> bool:
    connection = http.client.HTTPConnection(server.host, server.http_port, timeout=10)
    try:
        connection.request("GET", "/v2/health/ready")
        return connection.getresponse().status == 200
    finally:
        connection.close()


def grpc_probe(server: ServerProcess) -> bool:
    with grpc.insecure_channel(server.grpc_address) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(call: Callable[[], bool]) -> tuple[bool, float]:
    started = time.perf_counter()
    try:
        ok = call()
    except Exception:
        ok = False
    return ok, (time.perf_counter() - started) * 1000


def summary(results: list[tuple[bool, float]]) -> dict[str, object]:
    times = sorted(ms for _, ms in results)
    slow = [(i, round(ms)) for i, (_, ms) in enumerate(results) if ms > 500]
    return {
        "slow_probes": slow[:20],  # (index, ms): when, in the run, the tail happened
        "answered": sum(ok for ok, _ in results),
        "of": len(results),
        "p50_ms": round(statistics.median(times), 2),
        "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 2),
        "max_ms": round(times[-1], 2),
    }


def probe(server: ServerProcess, seconds: float) -> tuple[list[tuple[bool, float]], list[tuple[bool, float]]]:
    """New clients, one every 50 ms, alternating HTTP and gRPC, for ``seconds``."""
    http_results, grpc_results = [], []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        http_results.append(timed(lambda: http_probe(server)))
        time.sleep(0.05)
        grpc_results.append(timed(lambda: grpc_probe(server)))
        time.sleep(0.05)
    return http_results, grpc_results


def scene(server: ServerProcess, stalled: int, http_share: float, seconds: float) -> dict[str, object]:
    http_every = round(1 / http_share) if http_share > 0 else 0
    targets = [
        (server.http_port, HTTP_STALL) if http_every and i % http_every == 0 else (server.grpc_port, GRPC)
        for i in range(stalled)
    ]
    quiet_http, quiet_grpc = probe(server, 10.0)  # the same probes with no attack: the noise floor
    opened: mp.Queue[tuple[int, int]] = mp.Queue()
    reopened: mp.Queue[tuple[int, int]] = mp.Queue()
    stop = mp.Event()
    shares = [targets[start : start + PER_PROCESS] for start in range(0, stalled, PER_PROCESS)]
    holders = [mp.Process(target=hold, args=(server.host, share, opened, reopened, stop)) for share in shares]
    started = time.perf_counter()
    for holder in holders:
        holder.start()
    counts = [opened.get(timeout=600) for _ in holders]
    open_s = time.perf_counter() - started
    time.sleep(2.0)
    cpu_before, wall_before = cpu_seconds(server.process.pid), time.monotonic()
    http_results, grpc_results = probe(server, seconds)
    server_cpu = (cpu_seconds(server.process.pid) - cpu_before) / (time.monotonic() - wall_before)
    load = os.getloadavg()[0]
    stop.set()
    again = [reopened.get(timeout=60) for _ in holders]
    for holder in holders:
        holder.join()
    return {
        "stalled": sum(n for n, _ in counts),
        "connect_failures": sum(f for _, f in counts),
        "http_stalled": sum(1 for port, _ in targets if port == server.http_port),
        "open_s": round(open_s, 2),
        "server_cpu_share": round(server_cpu, 2),
        "load_average_1m": round(load, 1),
        "reopened_by_attacker": sum(n for n, _ in again),
        "calls_reopened_by_attacker": sum(n for _, n in again),
        "http": summary(http_results),
        "grpc": summary(grpc_results),
        "no_attack": {"http": summary(quiet_http), "grpc": summary(quiet_grpc)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-src", type=Path, required=True, help="src/ of the baseline tree")
    parser.add_argument("--stalled", type=int, default=10_000, help="also the server's --max-connections")
    parser.add_argument("--http-share", type=float, default=0.2)
    parser.add_argument("--probe-seconds", type=float, default=30.0)
    parser.add_argument("--variants", default="old,new")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # raised as far as allowed; inherited
    os.sched_setaffinity(0, {1})
    OUT.mkdir(exist_ok=True)
    repository = OUT / "lockout-models"  # small_mlp alone: readiness needs a model
    (repository / "small_mlp" / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(build_mlp(*DEMO_MODELS["small_mlp"], "small_mlp"), str(repository / "small_mlp/1/model.onnx"))
    variants = {"old": {"PYTHONPATH": str(args.old_src.resolve())}, "new": {}}
    results: dict[str, dict[str, object]] = {}
    for name in args.variants.split(","):
        log = OUT / f"lockout-{name}.log"
        extra = ["--log-level", "WARNING", "--max-connections", str(args.stalled)]
        with run_server(repository, log, extra, env=variants[name], pin_cpu=0) as server:
            results[name] = scene(server, args.stalled, args.http_share, args.probe_seconds)
        print(name, json.dumps(results[name]), flush=True)
    result = {**machine_stamp(), "args": {k: str(v) for k, v in vars(args).items()}, "results": results}
    (OUT / "lockout.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
