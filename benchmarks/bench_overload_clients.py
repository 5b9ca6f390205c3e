"""Overload with many clients and on a busy machine (issue 30).

Two measurements, each against this checkout and, with ``--baseline-src``, an older one,
alternating round by round (the machine is shared: read the ratios within a round):

- ``hog``: a closed loop that never holds more than the batch capacity in flight (64
  connections on heavy_mlp, ``max_batch_size`` 32) while ``--hogs`` busy loops share the
  server's CPU. Every answer should be a 200; the scheduler's rejections by reason are read
  from ``/metrics`` (``ortserve_scheduler_rejections_total``).
- ``many``: capacity (the native generator's closed loop at 64 in flight), then constant-rate
  open-loop load at ``--multiples`` of it over 64 and ``--connections`` (1,600) HTTP/1.1
  connections: goodput, admitted p99, 429 p99, timeouts, and the server's loop statistics.

The server runs on CPU 0 with one ORT thread, the generator (benchmarks/openloop, needs gcc)
on CPU 1.

    .venv/bin/python benchmarks/bench_overload_clients.py hog --hogs 1 --rounds 3
    .venv/bin/python benchmarks/bench_overload_clients.py many --baseline-src /tmp/old/src

Writes benchmarks/out/overload_clients.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import machine
from bench_overload import open_figures, server_cpu_s, wire
from openloop.run import run_openloop

from ortserve.demo import write_demo_repository
from ortserve.testing import ServerProcess, run_server

OUT = Path(__file__).parent / "out"
HOG = "import os\nos.sched_setaffinity(0, {0})\nwhile True: pass\n"


LOOP = (
    "ortserve_loop_request_heads_total",
    "ortserve_loop_lag_samples_total",
    "ortserve_loop_lag_seconds_total",
    "ortserve_loop_lag_max_seconds",
)


def scrape(server: ServerProcess) -> tuple[dict[str, float], dict[str, float]]:
    """The scheduler's rejections so far, by model and reason; the loop's read statistics
    (``server/read_lag.py``; absent from older checkouts; the maxima reset at each scrape)."""
    url = f"http://{server.host}:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    counts: dict[str, float] = {}
    loop: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("ortserve_scheduler_rejections_total{"):
            labels, value = line.rsplit(" ", 1)
            counts[labels[len("ortserve_scheduler_rejections_total") :]] = float(value)
        elif line.split(" ", 1)[0] in LOOP:
            name, value = line.split(" ", 1)
            loop[name] = float(value)
    return counts, loop


def rejections(server: ServerProcess) -> dict[str, float]:
    return scrape(server)[0]


def loop_figures(after: dict[str, float], before: dict[str, float]) -> dict[str, float] | None:
    """Request heads read per second of the window and the loop's lag (the unread-wait
    estimate): mean over its 5 ms samples, and the longest."""
    if not after:
        return None
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    samples = d["ortserve_loop_lag_samples_total"] or 1.0
    return {
        "heads": d["ortserve_loop_request_heads_total"],
        "lag_mean_ms": round(d["ortserve_loop_lag_seconds_total"] / samples * 1e3, 2),
        "lag_max_ms": round(after["ortserve_loop_lag_max_seconds"] * 1e3, 1),
    }


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


def closed_loop(
    server: ServerProcess, model: str, connections: int, seconds: float, timeout_s: float
) -> dict:
    request = wire(server, model, "http-json")
    before, cpu = rejections(server), server_cpu_s(server)
    summary = run_openloop(request.target, request.data, 0, seconds, connections, 1, timeout_s, warmup_s=1.0)
    row = open_figures(summary, server_cpu_s(server) - cpu)
    row["rejections"] = delta(rejections(server), before)
    return row


def open_loop(
    server: ServerProcess, model: str, rate: float, connections: int, seconds: float, timeout_s: float
) -> dict:
    request = wire(server, model, "http-json")
    (before, loop_before), cpu = scrape(server), server_cpu_s(server)
    summary = run_openloop(
        request.target, request.data, rate, seconds, connections, 1, timeout_s, warmup_s=1.0
    )
    row = open_figures(summary, server_cpu_s(server) - cpu)
    after, loop_after = scrape(server)
    row["rejections"] = delta(after, before)
    row["loop"] = loop_figures(loop_after, loop_before)
    row["rate"] = round(rate)
    row["connections"] = connections
    return row


def hog_round(root: Path, logs: Path, env: dict[str, str] | None, args: argparse.Namespace) -> dict:
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    try:
        with run_server(root, logs / "server.log", ["--intra-op-threads", "1"], env=env, pin_cpu=0) as server:
            start = rejections(server)
            # The first seconds count too: the cost model is then still learning the loop.
            first = closed_loop(server, "heavy_mlp", args.connections_hog, 2.0, 5.0)
            row = closed_loop(server, "heavy_mlp", args.connections_hog, args.seconds, 5.0)
            row["first_2s_statuses"] = first["statuses"]
            row["rejections_whole_run"] = delta(rejections(server), start)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    return row


def many_round(root: Path, logs: Path, env: dict[str, str] | None, args: argparse.Namespace) -> dict:
    result: dict = {}
    extra = ["--intra-op-threads", "1"]
    with run_server(root, logs / "server.log", extra, env=env, pin_cpu=0) as server:
        for model in args.models:
            capacity = closed_loop(server, model, 64, args.seconds, 5.0)
            entry: dict = {"capacity": capacity}
            for connections in (64, args.connections):
                for multiple in args.multiples:
                    rate = capacity["goodput"] * multiple
                    row = open_loop(server, model, rate, connections, args.seconds, args.timeout)
                    print(f"    {model} c={connections} {multiple}x: {summary_line(row)}", flush=True)
                    entry[f"c{connections}/{multiple}x"] = row
            result[model] = entry
    return result


def summary_line(row: dict) -> str:
    keys = (
        "goodput",
        "offered",
        "admitted_p99_ms",
        "refused_p99_ms",
        "timeouts",
        "statuses",
        "rejections",
        "loop",
    )
    keys += ("first_2s_statuses", "rejections_whole_run")
    return " ".join(f"{k}={row.get(k)}" for k in keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("hog", "many"))
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--hogs", type=int, default=1, help="busy loops on the server's CPU (hog)")
    parser.add_argument("--connections-hog", type=int, default=64)
    parser.add_argument("--connections", type=int, default=1600, help="the many-client count (many)")
    parser.add_argument("--multiples", type=lambda s: [float(x) for x in s.split(",")], default=[2.0, 4.0])
    parser.add_argument("--models", type=lambda s: s.split(","), default=["heavy_mlp", "small_mlp"])
    parser.add_argument("--timeout", type=float, default=5.0, help="client timeout, open loop")
    parser.add_argument("--baseline-src", type=Path, help="src/ of an older checkout to compare")
    parser.add_argument("--new-src", type=Path, help="src/ of the checkout to measure (default: this one)")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    new_env = (
        None if args.new_src is None else {"PYTHONPATH": str(args.new_src), "PYTHONDONTWRITEBYTECODE": "1"}
    )
    arms: list[tuple[str, dict[str, str] | None]] = [("new", new_env)]
    if args.baseline_src is not None:
        base_env = {"PYTHONPATH": str(args.baseline_src), "PYTHONDONTWRITEBYTECODE": "1"}
        arms.insert(0, ("base", base_env))
    paths = {"baseline_src": str(args.baseline_src), "new_src": str(args.new_src)}
    results: dict = {"stamp": machine.stamp(), "args": vars(args) | paths}
    rounds: dict[str, list] = {name: [] for name, _ in arms}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        write_demo_repository(root)
        for folder in root.iterdir():  # the MLPs only: an older checkout may not load the apps
            if folder.name not in ("heavy_mlp", "small_mlp"):
                shutil.rmtree(folder)
        for number in range(args.rounds):
            order = arms if number % 2 == 0 else arms[::-1]
            for name, env in order:
                print(f"round {number + 1}, {name}:", flush=True)
                run = hog_round if args.mode == "hog" else many_round
                row = run(root, Path(tmp), env, args)
                if args.mode == "hog":
                    print(f"    {summary_line(row)}", flush=True)
                rounds[name].append(row)
    results["rounds"] = rounds
    if args.mode == "hog":
        results["median_refused"] = {
            name: statistics.median(sum(r["rejections_whole_run"].values()) for r in rows)
            for name, rows in rounds.items()
        }
        print("median rejections per round (first 2 s included):", results["median_refused"])
    path = OUT / f"overload_clients_{args.mode}.json"
    path.write_text(json.dumps(results, indent=2))
    print("wrote", path, flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
