"""Tenants sharing a model's queue (issue 32.5): what the shares cost per request, and the quiet
tenant's p99 beside a flooding one.

1. ``cost``: CPU per request through the HTTP app, codec, scheduler and ONNX Runtime (no
   sockets, as ``bench_hot_path.py``), small_mlp, bursts of 32: tenancy off; tenancy on with one
   tenant (a quota too large to refuse anything: the gate names the tenant, the scheduler keeps
   shares); tenancy on with two tenants alternating (``X-Tenant-Id``).
2. ``fairness``: ``bench_tenants.py``'s quiet tenant (one request at a time) alone, then beside
   ``ortserve bench -c 32`` (tenant ``default``), with tenancy on (the same large quota).
3. ``deep``: the quiet tenant on heavy_mlp beside ``ortserve bench -c 128`` on it, so batches of
   the flood queue ahead; ``--instances 1 2`` runs it once per ``instances`` count (the sessions
   share the server's one core; with two, the last free one is kept for the quiet tenant), and
   reports the flood's answered requests per second beside the quiet tenant's latencies;
   ``--src NAME=PATH`` (repeated) runs each arm's server from that ``src`` (old against new),
   arms alternated round by round (``--rounds``), with medians per arm. Beside each phase it
   reads the server's threads' scheduler statistics (``/proc/PID/task/TID/schedstat``: CPU
   time, time runnable but waiting for the CPU, slices), grouped as the event loop (the main
   thread), the bulk lane (threads at a nice above 0) and the other threads, to show where
   the quiet request's time goes: a quiet request's run stretched by the flood's batch shows
   as the workers' waiting time, the loop's as the loop's.

Run old against new by pointing ``PYTHONPATH`` at the old tree's ``src`` (the server
subprocesses inherit it), server on CPU 0, clients on CPU 1:

    taskset -c 1 .venv/bin/python benchmarks/bench_fairness.py cost
    taskset -c 1 .venv/bin/python benchmarks/bench_fairness.py fairness --seconds 6
    taskset -c 1 .venv/bin/python benchmarks/bench_fairness.py deep --seconds 4 --instances 2 \
        --rounds 3 --src old=/tmp/old/src --src new=src
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np
from bench_tenants import fairness

from ortserve.demo import write_demo_repository
from ortserve.server.http.messages import Deferred, HttpRequest, HttpResponse
from ortserve.server.lifecycle import Server
from ortserve.settings import ServerSettings
from ortserve.testing import run_server

UNLIMITED = "requests=1e9,burst=1e9"
"""A quota that refuses nothing: tenancy on, admission as without a quota."""


async def cpu_per_request(models: Path, quota: str | None, tenants: int, requests: int) -> float:
    settings = ServerSettings(
        model_repository=models,
        http_port=0,
        grpc_port=-1,
        metrics_port=-1,
        intra_op_threads=1,
        tenant_quota=quota,
    )
    server = Server(settings)
    await server.load()  # no ports: requests go to the HTTP app directly
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.1] * 64}]}
    )
    heads = [
        {b"content-type": b"application/json", b"x-tenant-id": f"t{i}".encode()} for i in range(tenants)
    ] or [{b"content-type": b"application/json"}]
    request_of = [HttpRequest("POST", "/v2/models/small_mlp/infer", "", h, body.encode()) for h in heads]

    async def one(index: int) -> HttpResponse:
        result = server.http_app(request_of[index % len(request_of)])
        assert isinstance(result, Deferred)
        with contextlib.suppress(Exception):
            await result.future
        return result.finish(result.future)

    for i in range(200):
        await one(i)
    start = time.process_time()
    done = 0
    while done < requests:
        responses = await asyncio.gather(*(one(done + i) for i in range(32)))
        assert all(r.status == 200 for r in responses)
        done += 32
    cpu = time.process_time() - start
    with contextlib.suppress(Exception):
        await server.stop()
    return cpu / done * 1e6


def quiet_p99(port: int, model: str, width: int, seconds: float) -> tuple[float, float, int, int]:
    """The quiet tenant, one request at a time: p50 and p99 (ms) of its answered requests,
    how many were answered and how many refused."""
    body = json.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, width], "data": [0.5] * width}]}
    )
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)  # a stall fails the run
    headers = {"Content-Type": "application/json", "X-Tenant-Id": "quiet"}
    latencies: list[float] = []
    refused = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        connection.request("POST", f"/v2/models/{model}/infer", body, headers)
        reply = connection.getresponse()
        reply.read()
        if reply.status == 200:
            latencies.append(time.perf_counter() - started)
        else:
            refused += 1
    connection.close()
    p50, p99 = np.percentile(latencies, [50, 99]) * 1e3
    return float(p50), float(p99), len(latencies), refused


def _found(document: object, key: str) -> object:
    """The first value of ``key`` anywhere in a JSON document (None: absent)."""
    if isinstance(document, dict):
        if key in document:
            return document[key]
        document = list(document.values())
    if isinstance(document, list):
        for item in document:
            value = _found(item, key)
            if value is not None:
                return value
    return None


def _answered(result: object) -> float:
    """The flood's 200s per second of its run."""
    statuses = _found(result, "statuses")
    elapsed = _found(result, "elapsed_s")
    ok = statuses.get("200", 0) if isinstance(statuses, dict) else 0
    return float(ok) / float(elapsed) if isinstance(elapsed, int | float) and elapsed else 0.0


Threads = dict[int, tuple[int, int, int, int]]
"""Per thread id: CPU ns, ns runnable waiting for the CPU, slices, nice."""


def thread_stats(pid: int) -> Threads:
    """The scheduler's counters of every thread of ``pid`` (Linux; empty elsewhere)."""
    found: Threads = {}
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                cpu, waited, slices = (int(v) for v in (task / "schedstat").read_text().split())
                nice = int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])
                found[int(task.name)] = (cpu, waited, slices, nice)
    return found


def thread_split(pid: int, before: Threads, after: Threads, seconds: float) -> dict[str, dict[str, float]]:
    """CPU and waiting time between two readings, per group, in ms per second of the phase."""
    groups: dict[str, list[float]] = {}
    for tid, (cpu, waited, slices, nice) in after.items():
        cpu0, waited0, slices0, _ = before.get(tid, (0, 0, 0, nice))
        group = "loop" if tid == pid else "bulk lane" if nice > 0 else "other threads"
        totals = groups.setdefault(group, [0.0, 0.0, 0.0])
        totals[0] += (cpu - cpu0) / 1e6 / seconds
        totals[1] += (waited - waited0) / 1e6 / seconds
        totals[2] += (slices - slices0) / seconds
    return {
        group: {"cpu_ms_per_s": round(c, 1), "waiting_ms_per_s": round(w, 1), "slices_per_s": round(n)}
        for group, (c, w, n) in sorted(groups.items())
    }


def deep_flood(
    root: Path,
    model: str,
    width: int,
    connections: int,
    seconds: float,
    instances: int = 1,
    src: str | None = None,
) -> dict[str, object]:
    """As ``bench_tenants.fairness``, with a flood deep enough to queue batches ahead (tenancy on);
    ``instances``: the model's ``instances`` (sessions sharing the server's one core); ``src``:
    the server's sources (None: this interpreter's)."""
    config = root / "models" / model / "config.yaml"
    text = "".join(line for line in config.read_text().splitlines(True) if not line.startswith("instances:"))
    config.write_text(text + f"instances: {instances}\n")
    flood_out = root / "flood.json"
    args = ["--intra-op-threads", "1", "--tenant-quota", UNLIMITED]
    env = None if src is None else {"PYTHONPATH": str(Path(src).resolve())}
    with run_server(root / "models", root / "server.log", args, env=env, pin_cpu=0) as server:
        pid = server.process.pid
        quiet_p99(server.http_port, model, width, 1.0)  # warm
        before, started = thread_stats(pid), time.monotonic()
        solo = quiet_p99(server.http_port, model, width, seconds)
        solo_threads = thread_split(pid, before, thread_stats(pid), time.monotonic() - started)
        command = [
            sys.executable,
            "-m",
            "ortserve",
            "bench",
            server.http_url,
            "-m",
            model,
            "-c",
            str(connections),
        ]
        command += ["-d", str(seconds + 3), "--warmup", "0.5", "--no-progress", "-o", str(flood_out)]
        flooding = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.5)
        before, started = thread_stats(pid), time.monotonic()
        shared = quiet_p99(server.http_port, model, width, seconds)
        flood_threads = thread_split(pid, before, thread_stats(pid), time.monotonic() - started)
        flooding.wait()
    flood_result = json.loads(flood_out.read_text())
    return {
        "instances": instances,
        "flood_sent_per_s": _found(flood_result, "achieved_rate"),  # refused ones too
        "flood_answered_per_s": round(_answered(flood_result), 1),
        "flood_statuses": _found(flood_result, "statuses"),
        "flood_p50_latency_ms": _found(_found(flood_result, "latency_ms"), "p50"),
        "solo_p50_ms": round(solo[0], 2),
        "solo_p99_ms": round(solo[1], 2),
        "flood_p50_ms": round(shared[0], 2),
        "flood_p99_ms": round(shared[1], 2),
        "ratio_p99": round(shared[1] / solo[1], 2),
        "quiet_answered_solo": solo[2],
        "quiet_answered_flood": shared[2],
        "quiet_refused_flood": shared[3],
        "server_threads_solo": solo_threads,
        "server_threads_flood": flood_threads,
    }


def deep_arms(root: Path, args: argparse.Namespace) -> dict[str, object]:
    """``--src`` arms alternated round by round, each with every ``--instances`` count; medians per arm."""
    arms = dict(arm.split("=", 1) for arm in args.src) if args.src else {"this": None}
    runs: list[dict[str, object]] = []
    for round_ in range(args.rounds):
        for name, src in arms.items():
            for instances in args.instances:
                load = os.getloadavg()
                run = deep_flood(root, args.model, args.width, args.connections, args.seconds, instances, src)
                runs.append(
                    {"round": round_ + 1, "arm": name, "load average": [round(v, 2) for v in load], **run}
                )
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    keys = ("solo_p50_ms", "solo_p99_ms", "flood_p50_ms", "flood_p99_ms", "ratio_p99", "flood_answered_per_s")
    medians = {
        f"{name}, instances {n}": {
            key: float(np.median([float(r[key]) for r in runs if r["arm"] == name and r["instances"] == n]))  # type: ignore[arg-type]
            for key in keys
        }
        for name in arms
        for n in args.instances
    }
    return {"medians": medians, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("part", choices=["cost", "fairness", "deep"])
    parser.add_argument("--model", default="heavy_mlp")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--connections", type=int, default=128)
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--instances", type=int, nargs="+", default=[1], help="deep: one run per count")
    parser.add_argument("--src", action="append", help="deep: NAME=PATH, a server arm's src (repeat)")
    parser.add_argument("--rounds", type=int, default=1, help="deep: arms alternated this many times")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_demo_repository(root / "models")
        if args.part == "fairness":
            print(json.dumps(fairness(root, UNLIMITED, args.seconds), indent=2))
            return
        if args.part == "deep":
            print(json.dumps(deep_arms(root, args), indent=2))
            return
        os.sched_setaffinity(0, {0})
        import uvloop

        arms = {"tenancy off": (None, 0), "one tenant": (UNLIMITED, 0), "two tenants": (UNLIMITED, 2)}
        found: dict[str, list[float]] = {arm: [] for arm in arms}
        for _ in range(args.repeats):  # arms interleaved, round by round
            for arm, (quota, tenants) in arms.items():
                found[arm].append(uvloop.run(cpu_per_request(root / "models", quota, tenants, args.requests)))
        print(json.dumps({arm: sorted(round(v, 1) for v in runs) for arm, runs in found.items()}, indent=2))


if __name__ == "__main__":
    main()
