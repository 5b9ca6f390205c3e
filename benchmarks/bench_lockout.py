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
CPU share while probed. Where the time goes: each HTTP probe's connect and answer are timed
apart (a connect past ~1 s is a SYN the kernel dropped: the accept queue), and every 100 ms
a sampler reads the server's CPU time, how long its loop thread was runnable but waiting for
a CPU (``/proc/PID/task/PID/schedstat``), CPU 0's busy time and the kernel's accept-queue
counters (system-wide); each probe over 500 ms is listed beside those figures and the
attacker's closes and re-opens in the seconds it waited. ``--server-nice -10`` is the
control experiment (the server's loop no longer waits behind the other processes on its CPU);
``--py-spy PATH`` profiles the server while it is probed.

    python benchmarks/bench_lockout.py --old-src /tmp/old/src
    python benchmarks/bench_lockout.py --old-src src --variants new [--new-src /tmp/head/src] [--server-nice -10]
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
import subprocess
import sys
import threading
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
    reopened: mp.Queue[tuple[int, int, dict[int, list[int]]]],
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
    # Per whole second (monotonic): connections the server closed, re-opened, calls re-opened.
    timeline: dict[int, list[int]] = {}
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
            second = timeline.setdefault(int(time.monotonic()), [0, 0, 0])
            if not data:
                selector.unregister(sock)
                sock.close()
                closed.append(target)
                second[0] += 1
            elif client is not None:
                more, opened = restall(client, data)
                if more:
                    with contextlib.suppress(OSError):
                        sock.send(more)
                restalled += opened
                second[2] += opened
        if closed and time.monotonic() >= next_reopen:
            for target in closed:
                held = stall(host, *target)
                if held is not None:
                    selector.register(held[0], selectors.EVENT_READ, (target, held[1]))
                    count += 1
                    timeline.setdefault(int(time.monotonic()), [0, 0, 0])[1] += 1
            closed = []
            next_reopen = time.monotonic() + 0.5
    reopened.put((count, restalled, timeline))
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]


PHASES: list[tuple[float, float]] = []
"""Each HTTP probe's (connect, answer) milliseconds, in order: a connect past ~1 s is a SYN
the kernel dropped and the client sent again (the accept queue), a slow answer is the loop."""


def http_probe(server: ServerProcess) -> bool:
    connection = http.client.HTTPConnection(server.host, server.http_port, timeout=10)
    started = time.perf_counter()
    connected = started
    try:
        connection.connect()
        connected = time.perf_counter()
        connection.request("GET", "/v2/health/ready")
        return connection.getresponse().status == 200
    finally:
        PHASES.append(((connected - started) * 1000, (time.perf_counter() - connected) * 1000))
        connection.close()


def grpc_probe(server: ServerProcess) -> bool:
    with grpc.insecure_channel(server.grpc_address) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Probe = tuple[bool, float, float]
"""(answered, milliseconds, when it began: monotonic seconds)."""
_COUNTERS = ("ListenOverflows", "ListenDrops", "TCPReqQFullDrop", "SyncookiesSent")


def tcp_counters() -> dict[str, int]:
    """The kernel's accept-queue counters (TcpExt of /proc/net/netstat)."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:]))
            return {name: int(table.get(name, 0)) for name in _COUNTERS}
    return {}


class Sampler(threading.Thread):
    """Every 100 ms: the server's CPU seconds and the kernel's accept-queue counters, so a slow
    probe can be put beside what the server and the kernel did while it waited."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.samples: list[tuple[float, float, dict[str, int]]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):
            with contextlib.suppress(OSError):
                counters: dict[str, int] = {
                    **tcp_counters(),
                    "server_waited_ns": run_queue_ns(self.pid),
                    "probe_waited_ns": run_queue_ns(os.getpid()),
                    "cpu0_busy_ticks": cpu0_busy_ticks(),
                }
                self.samples.append((time.monotonic(), cpu_seconds(self.pid), counters))

    def window(self, begin: float, end: float) -> dict[str, object]:
        """From ``begin`` to ``end``: the server's CPU share, the share of the time its loop
        thread and the probing thread were ready to run but waited for a CPU (schedstat), and
        the accept-queue counters' growth."""
        inside = [s for s in self.samples if begin - 0.1 <= s[0] <= end + 0.1]
        if len(inside) < 2:
            return {}
        (t0, c0, k0), (t1, c1, k1) = inside[0], inside[-1]
        span = max(t1 - t0, 1e-3)
        grown = {name: k1[name] - k0.get(name, 0) for name in k1}
        return {
            "server_cpu_share": round((c1 - c0) / span, 2),
            "server_loop_waiting_for_cpu_share": round(grown.pop("server_waited_ns") / 1e9 / span, 2),
            "probe_waiting_for_cpu_share": round(grown.pop("probe_waited_ns") / 1e9 / span, 2),
            "cpu0_busy_share": round(grown.pop("cpu0_busy_ticks") / os.sysconf("SC_CLK_TCK") / span, 2),
            **{name: n for name, n in grown.items() if n},
        }


def cpu0_busy_ticks() -> int:
    """Clock ticks CPU 0 (the server's) has spent on anything but idle and I/O wait."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu0 "):
            ticks = [int(x) for x in line.split()[1:]]
            return sum(ticks) - ticks[3] - ticks[4]
    return 0


def run_queue_ns(pid: int) -> int:
    """Nanoseconds the main thread of ``pid`` has spent runnable but waiting for a CPU."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[1])


def timed(call: Callable[[], bool]) -> Probe:
    began = time.monotonic()
    started = time.perf_counter()
    try:
        ok = call()
    except Exception:
        ok = False
    return ok, (time.perf_counter() - started) * 1000, began


def summary(results: list[Probe]) -> dict[str, object]:
    times = sorted(ms for _, ms, _ in results)
    slow = [(i, round(ms)) for i, (_, ms, _) in enumerate(results) if ms > 500]
    return {
        "slow_probes": slow[:20],  # (index, ms): when, in the run, the tail happened
        "answered": sum(ok for ok, _, _ in results),
        "of": len(results),
        "p50_ms": round(statistics.median(times), 2),
        "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 2),
        "max_ms": round(times[-1], 2),
    }


def probe(
    server: ServerProcess, seconds: float
) -> tuple[list[Probe], list[Probe], list[tuple[float, float]]]:
    """New clients, one every 50 ms, alternating HTTP and gRPC, for ``seconds``; and each HTTP
    probe's (connect, answer) milliseconds."""
    http_results, grpc_results = [], []
    PHASES.clear()
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        http_results.append(timed(lambda: http_probe(server)))
        time.sleep(0.05)
        grpc_results.append(timed(lambda: grpc_probe(server)))
        time.sleep(0.05)
    return http_results, grpc_results, list(PHASES)


def where_time_went(
    http_results: list[Probe],
    grpc_results: list[Probe],
    phases: list[tuple[float, float]],
    sampler: Sampler,
    timeline: dict[int, list[int]],
) -> list[dict[str, object]]:
    """Every probe over 500 ms beside what happened while it waited: its phases (HTTP), the
    server's CPU share, the accept-queue counters' growth, the attacker's closes/re-opens."""
    slow: list[dict[str, object]] = []
    for kind, results in (("http", http_results), ("grpc", grpc_results)):
        for index, (ok, ms, began) in enumerate(results):
            if ms <= 500:
                continue
            row: dict[str, object] = {"probe": kind, "index": index, "ms": round(ms), "answered": ok}
            if kind == "http" and index < len(phases):
                row["connect_ms"], row["answer_ms"] = (round(x) for x in phases[index])
            row.update(sampler.window(began, began + ms / 1000))
            seconds = range(int(began) - 1, int(began + ms / 1000) + 1)
            row["attacker_closed_reopened_calls"] = [timeline.get(t, [0, 0, 0]) for t in seconds]
            slow.append(row)
    return slow


def scene(
    server: ServerProcess, stalled: int, http_share: float, seconds: float, py_spy: str | None = None
) -> dict[str, object]:
    http_every = round(1 / http_share) if http_share > 0 else 0
    targets = [
        (server.http_port, HTTP_STALL) if http_every and i % http_every == 0 else (server.grpc_port, GRPC)
        for i in range(stalled)
    ]
    quiet_http, quiet_grpc, _ = probe(server, 10.0)  # the same probes with no attack: the noise floor
    opened: mp.Queue[tuple[int, int]] = mp.Queue()
    reopened: mp.Queue[tuple[int, int, dict[int, list[int]]]] = mp.Queue()
    stop = mp.Event()
    shares = [targets[start : start + PER_PROCESS] for start in range(0, stalled, PER_PROCESS)]
    holders = [mp.Process(target=hold, args=(server.host, share, opened, reopened, stop)) for share in shares]
    sampler = Sampler(server.process.pid)
    sampler.start()
    started = time.perf_counter()
    for holder in holders:
        holder.start()
    counts = [opened.get(timeout=600) for _ in holders]
    open_s = time.perf_counter() - started
    time.sleep(2.0)
    cpu_before, wall_before = cpu_seconds(server.process.pid), time.monotonic()
    counters_before = tcp_counters()
    profiler = None
    if py_spy:  # where the server's CPU goes while probed (collapsed stacks, idle excluded)
        out = OUT / f"lockout-profile-{server.process.pid}.txt"
        profiler = subprocess.Popen(
            [
                *(py_spy, "record", "-p", str(server.process.pid), "-d", str(int(seconds))),
                *("-r", "200", "-f", "raw", "-o", str(out), "--nonblocking"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    http_results, grpc_results, phases = probe(server, seconds)
    if profiler is not None:
        profiler.wait(60)
    server_cpu = (cpu_seconds(server.process.pid) - cpu_before) / (time.monotonic() - wall_before)
    counters = {name: value - counters_before[name] for name, value in tcp_counters().items()}
    whole = sampler.window(wall_before, time.monotonic())
    load = os.getloadavg()[0]
    stop.set()
    again = [reopened.get(timeout=60) for _ in holders]
    for holder in holders:
        holder.join()
    sampler.done.set()
    sampler.join()
    timeline: dict[int, list[int]] = {}
    for _, _, seconds_seen in again:
        for second, numbers in seconds_seen.items():
            merged = timeline.setdefault(second, [0, 0, 0])
            for i, n in enumerate(numbers):
                merged[i] += n
    connects = sorted(c for c, _ in phases)
    answers = sorted(a for _, a in phases)
    return {
        "stalled": sum(n for n, _ in counts),
        "connect_failures": sum(f for _, f in counts),
        "http_stalled": sum(1 for port, _ in targets if port == server.http_port),
        "open_s": round(open_s, 2),
        "server_cpu_share": round(server_cpu, 2),
        "load_average_1m": round(load, 1),
        "reopened_by_attacker": sum(n for n, _, _ in again),
        "calls_reopened_by_attacker": sum(n for _, n, _ in again),
        "accept_queue_counters_while_probed": counters,
        "while_probed": whole,
        "http": summary(http_results),
        "http_connect_p99_ms": round(connects[min(len(connects) - 1, int(len(connects) * 0.99))], 1),
        "http_answer_p99_ms": round(answers[min(len(answers) - 1, int(len(answers) * 0.99))], 1),
        "grpc": summary(grpc_results),
        "no_attack": {"http": summary(quiet_http), "grpc": summary(quiet_grpc)},
        "slow_probes_explained": where_time_went(http_results, grpc_results, phases, sampler, timeline),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-src", type=Path, required=True, help="src/ of the baseline tree")
    parser.add_argument("--stalled", type=int, default=10_000, help="also the server's --max-connections")
    parser.add_argument("--http-share", type=float, default=0.2)
    parser.add_argument("--probe-seconds", type=float, default=30.0)
    parser.add_argument("--variants", default="old,new")
    parser.add_argument("--py-spy", help="py-spy's path: profile the server while it is probed")
    parser.add_argument("--server-args", default="", help="more flags for the server, one string")
    parser.add_argument(
        "--server-nice",
        type=int,
        default=0,
        help="the server's loop thread's nice value (a control experiment: below 0, the other "
        "processes sharing its CPU wait for it, not it for them)",
    )
    parser.add_argument(
        "--new-src", type=Path, help="src/ of the tree measured as new (default: this checkout's)"
    )
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # raised as far as allowed; inherited
    os.sched_setaffinity(0, {1})
    OUT.mkdir(exist_ok=True)
    repository = OUT / "lockout-models"  # small_mlp alone: readiness needs a model
    (repository / "small_mlp" / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(build_mlp(*DEMO_MODELS["small_mlp"], "small_mlp"), str(repository / "small_mlp/1/model.onnx"))
    variants = {
        "old": {"PYTHONPATH": str(args.old_src.resolve())},
        "new": {"PYTHONPATH": str(args.new_src.resolve())} if args.new_src else {},
    }
    results: dict[str, dict[str, object]] = {}
    for name in args.variants.split(","):
        log = OUT / f"lockout-{name}.log"
        extra = ["--log-level", "WARNING", "--max-connections", str(args.stalled), *args.server_args.split()]
        with run_server(repository, log, extra, env=variants[name], pin_cpu=0) as server:
            if args.server_nice:
                os.setpriority(os.PRIO_PROCESS, server.process.pid, args.server_nice)
            results[name] = scene(server, args.stalled, args.http_share, args.probe_seconds, args.py_spy)
        print(name, json.dumps(results[name]), flush=True)
    result = {**machine_stamp(), "args": {k: str(v) for k, v in vars(args).items()}, "results": results}
    (OUT / "lockout.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
