"""Connections and memory under abuse, old tree against this one, side by side.

Three scenes, each on a fresh server pinned to CPU 0 (this process on CPU 1), every process
with ``ulimit -n`` raised to its hard limit (20,000 here, which an unprivileged container cannot
raise; the idle sockets are held by helper processes of 9,000 each):

- ``idle``: ``--idle`` sockets opened and left silent (half to the HTTP port, half to gRPC),
  then ``--probes`` HTTP requests and gRPC health checks, each on a new connection: how many
  are answered, and how fast.
- ``keepalive``: 16 connections each send one ``--body-mib`` body, get the answer, and stay
  open idle; server RSS before and after.
- ``inflight``: ``--bodies`` connections send a ``--body-mib`` body at once; the server's peak
  RSS (sampled every 10 ms) against its RSS before, and the answers' status codes.
- ``cost``: server CPU per request under wrk (c=64, small_mlp JSON, 8 s after an 8 s warm-up):
  what the bookkeeping costs on the hot path (``--scenes cost --repeats 5``).

Bodies go to an unknown route: the server buffers the whole body (that is what
is measured) and answers 404 without decoding it. The new server runs with ``--max-inflight-bytes``
``--inflight-mib``; the old one has no such flag.

    python benchmarks/bench_limits.py --old-src /tmp/limits-old/src
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import multiprocessing as mp
import os
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event
from pathlib import Path

import grpc
import onnx
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp

from ortserve.demo import DEMO_MODELS, build_mlp
from ortserve.testing import ServerProcess, run_server

OUT = Path(__file__).parent / "out"
MIB = 1 << 20


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def post_body(host: str, port: int, size: int, keep: list[socket.socket] | None = None) -> int:
    """POST ``size`` bytes to an unknown route; returns the status (0: connection failed)."""
    sock = socket.create_connection((host, port), timeout=60)
    try:
        sock.sendall(b"POST /v2/nothing-here HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
        chunk = b"x" * MIB
        try:
            for _ in range(size // MIB):
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused early and closed; the answer may still be readable
        reply = http.client.HTTPResponse(sock)
        reply.begin()
        reply.read()
        return reply.status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        if keep is None:
            sock.close()
        else:
            keep.append(sock)


def timed(call: Callable[[], bool]) -> tuple[bool, float]:
    started = time.perf_counter()
    try:
        ok = call()
    except Exception:
        ok = False
    return ok, (time.perf_counter() - started) * 1000


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


def summary(results: list[tuple[bool, float]]) -> dict[str, object]:
    times = [ms for _, ms in results]
    return {
        "answered": sum(ok for ok, _ in results),
        "of": len(results),
        "p50_ms": round(statistics.median(times), 2),
        "max_ms": round(max(times), 2),
    }


def hold_idle(
    host: str, ports: tuple[int, int], count: int, opened: mp.Queue[tuple[int, int]], stop: Event
) -> None:
    """In a child process (one process cannot hold 21,000 sockets under ``ulimit -n`` 20,000):
    open ``count`` silent connections alternately to both ports, report, hold until ``stop``."""
    os.sched_setaffinity(0, {1})
    held, failed = [], 0
    for i in range(count):
        try:
            held.append(socket.create_connection((host, ports[i % 2]), timeout=5))
        except OSError:
            failed += 1
    opened.put((len(held), failed))
    stop.wait()
    for sock in held:
        sock.close()


def scene_idle(server: ServerProcess, idle: int, probes: int) -> dict[str, object]:
    per_process = 9_000
    opened: mp.Queue[tuple[int, int]] = mp.Queue()
    stop = mp.Event()
    shares = [min(per_process, idle - start) for start in range(0, idle, per_process)]
    ports = (server.http_port, server.grpc_port)
    holders = [mp.Process(target=hold_idle, args=(server.host, ports, n, opened, stop)) for n in shares]
    started = time.perf_counter()
    for holder in holders:
        holder.start()
    counts = [opened.get(timeout=300) for _ in holders]
    open_s = time.perf_counter() - started
    time.sleep(1.0)
    result = {
        "idle_sockets": sum(n for n, _ in counts),
        "idle_connect_failures": sum(f for _, f in counts),
        "open_s": round(open_s, 2),
        "http": summary([timed(lambda: http_probe(server)) for _ in range(probes)]),
        "grpc": summary([timed(lambda: grpc_probe(server)) for _ in range(probes)]),
    }
    stop.set()
    for holder in holders:
        holder.join()
    return result


def scene_keepalive(server: ServerProcess, body: int) -> dict[str, object]:
    pid = server.process.pid
    before = rss_mib(pid)
    kept: list[socket.socket] = []
    statuses = [post_body(server.host, server.http_port, body, kept) for _ in range(16)]
    time.sleep(1.0)
    after = rss_mib(pid)
    for sock in kept:
        sock.close()
    return {
        "rss_before_mib": round(before),
        "rss_with_16_idle_mib": round(after),
        "statuses": dict(collections.Counter(statuses)),
    }


def scene_inflight(server: ServerProcess, bodies: int, body: int) -> dict[str, object]:
    pid = server.process.pid
    before = rss_mib(pid)
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib(pid))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    statuses: list[int] = []
    started = time.perf_counter()
    threads = [
        threading.Thread(target=lambda: statuses.append(post_body(server.host, server.http_port, body)))
        for _ in range(bodies)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    time.sleep(1.0)
    done.set()
    sampler.join()
    return {
        "rss_before_mib": round(before),
        "rss_peak_mib": round(peak[0]),
        "rss_after_mib": round(rss_mib(pid)),
        "statuses": dict(collections.Counter(statuses)),
        "seconds": round(elapsed, 2),
    }


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scene_cost(server: ServerProcess, seconds: int) -> dict[str, object]:
    """Server CPU per request under wrk (c=64, small_mlp JSON): the hot-path cost of the
    bookkeeping (deadline stamps, the idle queue, the byte budget). Steadier than req/s here."""
    body = OUT / "limits-small-body.json"
    body.write_text(
        json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]})
    )
    lua = Path(__file__).parent / "post.lua"
    env = {**os.environ, "BODY": str(body), "URL_PATH": "/v2/models/small_mlp/infer"}
    command = ["wrk", "-t1", "-c64", f"-d{seconds}s", "-s", str(lua), server.http_url]
    subprocess.run(command, env=env, capture_output=True, check=True)  # warm-up
    before = cpu_seconds(server.process.pid)
    output = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    used = cpu_seconds(server.process.pid) - before
    requests = int(output.split(" requests in ")[0].split()[-1])
    return {
        "requests": requests,
        "req_per_s": round(requests / seconds),
        "cpu_us_per_request": round(used / requests * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-src", type=Path, required=True, help="src/ of the baseline tree")
    parser.add_argument("--idle", type=int, default=21_000)
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--bodies", type=int, default=40)
    parser.add_argument("--body-mib", type=int, default=60)
    parser.add_argument("--inflight-mib", type=int, default=256)
    parser.add_argument("--scenes", default="idle,keepalive,inflight")
    parser.add_argument("--variants", default="old,new")
    parser.add_argument("--repeats", type=int, default=1, help="of each scene, variants alternating")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # raised as far as allowed; inherited
    os.sched_setaffinity(0, {1})
    OUT.mkdir(exist_ok=True)
    repository = OUT / "limits-models"  # small_mlp alone: the scenes measure the transport
    (repository / "small_mlp" / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(build_mlp(*DEMO_MODELS["small_mlp"], "small_mlp"), str(repository / "small_mlp/1/model.onnx"))
    variants = {
        "old": ({"PYTHONPATH": str(args.old_src.resolve())}, []),
        "new": ({}, ["--max-inflight-bytes", str(args.inflight_mib * MIB)]),
    }
    body = args.body_mib * MIB
    scenes: dict[str, Callable[[ServerProcess], dict[str, object]]] = {
        "idle": lambda server: scene_idle(server, args.idle, args.probes),
        "keepalive": lambda server: scene_keepalive(server, body),
        "inflight": lambda server: scene_inflight(server, args.bodies, body),
        "cost": lambda server: scene_cost(server, 8),
    }
    results: dict[str, dict[str, list[dict[str, object]]]] = {}
    for scene in [s for s in args.scenes.split(",") for _ in range(args.repeats)]:
        for name in args.variants.split(","):
            env, extra = variants[name]
            log = OUT / f"limits-{scene}-{name}.log"
            with run_server(
                repository, log, ["--log-level", "WARNING", *extra], env=env, pin_cpu=0
            ) as server:
                measured = scenes[scene](server)
            results.setdefault(scene, {}).setdefault(name, []).append(measured)
            print(scene, name, json.dumps(measured), flush=True)
    result = {**machine_stamp(), "args": {k: str(v) for k, v in vars(args).items()}, "results": results}
    (OUT / "limits.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
