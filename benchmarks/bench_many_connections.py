"""Overload over many connections (issue 30): goodput, admitted p99 and 429 p99 at 2x/4x/8x the
capacity, over 64, 1,600 and 3,000 connections, HTTP/1.1 and gRPC, and where the loop's time goes.

The server runs on CPU 0 with one ORT thread; the load is the native generator
(benchmarks/openloop: it holds thousands of connections from one core, HTTP/1.1 or gRPC over
HTTP/2, latency from each request's intended send time) on CPU 1. Per round and model and
transport: the capacity (closed loop, 64 requests in flight: 64 HTTP/1.1 connections, or 4
HTTP/2 connections x 16 streams), then open-loop constant-rate load at ``--multiples`` of it
over each ``--connections`` count (gRPC: one stream per connection, so an HTTP/2 connection
holds one call like an HTTP/1.1 one) and, for gRPC, ``--streams-point`` connections x streams
(100 x 100). Each point: goodput as a fraction of that round's capacity, the arithmetic bound
(1 - k r) / (1 - r) with r = the server's CPU per refusal / per served request, measured at
the same point (see RESULTS.md), admitted p50/p99 against 2x the capacity p99, 429 p99
against 20 ms, timeouts, the load average, and the loop's figures from /metrics: request heads
read, CPU per head, sampled loop lag (mean and longest), deferred turns (longest, and how many
reached the per-iteration budget), accepts and the largest accept burst, write pauses.

Medians over ``--rounds`` (the machine is shared: every point carries its load average).
With ``--baseline-src``, an older checkout is measured too, arms alternating round by round.

    .venv/bin/python benchmarks/bench_many_connections.py --seconds 10 --rounds 3
    .venv/bin/python benchmarks/bench_many_connections.py --models heavy_mlp --transports http \\
        --connections 1600 --multiples 4 --baseline-src /tmp/base/src

Writes benchmarks/out/many_connections.json and, with matplotlib, many_connections.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
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
TIMEOUT_S = 5.0
REFUSED_P99_TARGET_MS = 20.0
REFUSALS = ("429", "503", "1008", "1014")  # HTTP, and gRPC RESOURCE_EXHAUSTED / UNAVAILABLE (1000 + code)


def scrape(server: ServerProcess) -> dict[str, float]:
    """The loop's counters and gauges, and the scheduler's rejections, summed (empty when the
    overloaded server does not answer the scrape in time: its figures are then missing)."""
    url = f"http://{server.host}:{server.metrics_port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            text = reply.read().decode()
    except OSError:
        return {}
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("ortserve_loop_") or line.startswith("ortserve_scheduler_rejections_total"):
            name, value = line.rsplit(" ", 1)
            name = name.split("{", 1)[0]
            found[name] = found.get(name, 0.0) + float(value)
    return found


def loop_figures(after: dict[str, float], before: dict[str, float], cpu_s: float) -> dict[str, float]:
    """The loop's work over one point (maxima are since the previous scrape)."""
    if not after or not before:
        return {}
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    heads = d.get("ortserve_loop_request_heads_total", 0.0)
    samples = d.get("ortserve_loop_lag_samples_total", 0.0) or 1.0
    figures = {
        "heads": heads,
        "cpu_us_per_head": round(cpu_s / heads * 1e6, 1) if heads else None,
        "lag_mean_ms": round(d.get("ortserve_loop_lag_seconds_total", 0.0) / samples * 1e3, 2),
        "lag_max_ms": round(after.get("ortserve_loop_lag_max_seconds", 0.0) * 1e3, 1),
        "rejections": d.get("ortserve_scheduler_rejections_total", 0.0),
    }
    if "ortserve_loop_turns_total" in after:  # absent from older checkouts
        figures |= {
            "deferred": d["ortserve_loop_deferred_requests_total"],
            "turns": d["ortserve_loop_turns_total"],
            "turns_over_budget": d["ortserve_loop_turns_over_budget_total"],
            "turn_max_ms": round(after["ortserve_loop_turn_max_seconds"] * 1e3, 2),
            "accepts": d["ortserve_loop_accepts_total"],
            "accept_burst_max": after["ortserve_loop_accept_burst_max"],
            "write_pauses": d["ortserve_loop_write_pauses_total"],
        }
    return figures


def point(
    server: ServerProcess,
    model: str,
    transport: str,
    rate: float,
    connections: int,
    streams: int,
    seconds: float,
) -> dict:
    request = wire(server, model, "grpc" if transport == "grpc" else "http-json")
    before, cpu = scrape(server), server_cpu_s(server)
    summary = run_openloop(
        request.target, request.data, rate, seconds, connections, 1, TIMEOUT_S,
        grpc_path=request.grpc_path, streams=streams, warmup_s=1.0,
    )  # fmt: skip
    used = server_cpu_s(server) - cpu
    row = open_figures(summary, used)
    row["loop"] = loop_figures(scrape(server), before, used)
    row["load_average_1m"] = round(os.getloadavg()[0], 2)
    row |= {"rate": round(rate), "connections": connections, "streams": streams}
    row["completed"] = summary.completed
    ok = sum(
        count for status, count in summary.statuses.items() if status.startswith("2") or status == "1000"
    )
    row["served"] = ok
    row["refused"] = sum(count for status, count in summary.statuses.items() if status in REFUSALS)
    return row


def per_request_cpu(row: dict, capacity: dict) -> dict[str, float | None]:
    """r = CPU per refusal / CPU per served request, from the point's own server CPU: the
    served requests cost what they cost at capacity, the rest of the CPU is the refusals'."""
    served_us = capacity["server_cpu_us_per_answer"]
    total_us = (row["server_cpu_us_per_answer"] or 0.0) * row["completed"]
    refused = row["refused"]
    if not served_us or not refused:
        return {"refusal_us": None, "r": None}
    refusal_us = max(0.0, total_us - row["served"] * served_us) / refused
    return {"refusal_us": round(refusal_us, 1), "r": round(refusal_us / served_us, 4)}


def bound(multiple: float, r: float | None) -> float | None:
    if r is None or r >= 1:
        return None
    return round(max(0.0, min(1.0, (1 - multiple * r) / (1 - r))), 3)


def one_round(root: Path, logs: Path, env: dict[str, str] | None, args: argparse.Namespace) -> dict:
    result: dict = {}
    with run_server(root, logs / "server.log", ["--intra-op-threads", "1"], env=env, pin_cpu=0) as server:
        for model in args.models:
            for transport in args.transports:
                conns, streams = (4, 16) if transport == "grpc" else (64, 1)
                capacity = point(server, model, transport, 0, conns, streams, args.seconds)
                entry: dict = {"capacity": capacity}
                progress(result | {f"{model}/{transport}": entry})
                print(f"  {model} {transport} capacity: {capacity['goodput']:.0f}/s, "
                      f"p99 {capacity['admitted_p99_ms']} ms, load {capacity['load_average_1m']}", flush=True)  # fmt: skip
                shapes = [(c, 1) for c in args.connections]
                if transport == "grpc" and args.streams_point:
                    shapes.append(tuple(args.streams_point))
                for connections, per in shapes:
                    for multiple in args.multiples:
                        row = point(
                            server,
                            model,
                            transport,
                            capacity["goodput"] * multiple,
                            connections,
                            per,
                            args.seconds,
                        )
                        row["multiple"] = multiple
                        row["of_capacity"] = (
                            round(row["goodput"] / capacity["goodput"], 3) if capacity["goodput"] else None
                        )
                        row |= per_request_cpu(row, capacity)
                        row["bound"] = bound(multiple, row["r"])
                        entry[f"{connections}x{per}/{multiple}x"] = row
                        print(
                            f"    {model} {transport} {connections}x{per} {multiple}x: {line(row, capacity)}",
                            flush=True,
                        )
                        progress(result | {f"{model}/{transport}": entry})
                result[f"{model}/{transport}"] = entry
    return result


def progress(partial: dict) -> None:
    """The round so far, kept in case a later point fails."""
    OUT.mkdir(exist_ok=True)
    (OUT / "many_connections_partial.json").write_text(json.dumps(partial, indent=2, default=str))


def line(row: dict, capacity: dict) -> str:
    loop = row["loop"] or {}
    return (
        f"goodput {row['of_capacity']} (bound {row['bound']}, r {row['r']}), "
        f"admitted p99 {row['admitted_p99_ms']} ms (2x cap {2 * (capacity['admitted_p99_ms'] or 0):.0f}), "
        f"429 p99 {row['refused_p99_ms']} ms, timeouts {row['timeouts']}, load {row['load_average_1m']}, "
        f"lag {loop.get('lag_mean_ms')}/{loop.get('lag_max_ms')} ms, cpu/head {loop.get('cpu_us_per_head')} us, "
        f"turn max {loop.get('turn_max_ms')} ms over-budget {loop.get('turns_over_budget')}, "
        f"accept burst {loop.get('accept_burst_max')}, write pauses {loop.get('write_pauses')}"
    )


MEDIAN_KEYS = (
    "of_capacity", "bound", "r", "refusal_us", "admitted_p50_ms", "admitted_p99_ms", "refused_p99_ms",
    "timeouts", "load_average_1m", "goodput", "server_cpu_us_per_answer", "send_lag_p99_ms",
)  # fmt: skip
LOOP_KEYS = (
    "cpu_us_per_head", "lag_mean_ms", "lag_max_ms", "turn_max_ms", "turns_over_budget",
    "accept_burst_max", "write_pauses",
)  # fmt: skip


def medians(rounds: list[dict]) -> dict:
    """Per point, the median of each figure over the rounds (None where a round had none)."""
    table: dict = {}
    for key in rounds[0]:
        for name in rounds[0][key]:
            rows = [r[key][name] for r in rounds if name in r.get(key, {})]
            cell: dict = {}
            for figure in MEDIAN_KEYS:
                values = [row.get(figure) for row in rows]
                values = [v for v in values if v is not None]
                cell[figure] = round(statistics.median(values), 3) if values else None
            for figure in LOOP_KEYS:
                values = [(row["loop"] or {}).get(figure) for row in rows]
                values = [v for v in values if v is not None]
                cell[figure] = round(statistics.median(values), 3) if values else None
            cell["rounds"] = len(rows)
            table[f"{key}/{name}"] = cell
    return table


def plot(table: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    series: dict[str, list[tuple[float, dict]]] = {}
    for key, cell in table.items():
        shape_multiple = key.rsplit("/", 1)[1]
        if shape_multiple == "capacity":
            continue
        model, transport, shape = key.split("/")[:3]
        multiple = float(shape_multiple.rstrip("x"))
        series.setdefault(f"{model} {transport} {shape}", []).append((multiple, cell))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for label, points in sorted(series.items()):
        points.sort(key=lambda p: p[0])
        xs = [p[0] for p in points]
        (goodput,) = axes[0].plot(xs, [p[1]["of_capacity"] for p in points], marker="o", label=label)
        axes[0].plot(xs, [p[1]["bound"] for p in points], linestyle=":", color=goodput.get_color())
        axes[1].plot(xs, [p[1]["admitted_p99_ms"] for p in points], marker="o", label=label)
        axes[2].plot(xs, [p[1]["refused_p99_ms"] for p in points], marker="o", label=label)
    axes[0].set(xlabel="offered (x capacity)", ylabel="goodput / capacity (dotted: bound)", ylim=(0, 1.3))
    axes[1].set(xlabel="offered (x capacity)", ylabel="admitted p99 (ms)", yscale="log")
    axes[2].axhline(REFUSED_P99_TARGET_MS, color="grey", linestyle="--")
    axes[2].set(xlabel="offered (x capacity)", ylabel="429 p99 (ms)", yscale="log")
    axes[2].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def markdown(table: dict) -> str:
    """The medians as a RESULTS.md table: one row per point."""
    rows = [
        "| point | goodput / cap. (bound) | r | admitted p50 / p99 ms (2x cap. p99) | 429 p99 ms | timeouts "
        "| load | loop lag mean / max ms | turn max ms (over budget) | CPU us / head | accept burst |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    capacity_p99: dict[str, float] = {}
    for key, cell in table.items():
        if key.endswith("/capacity"):
            capacity_p99[key.rsplit("/", 1)[0]] = cell["admitted_p99_ms"] or 0.0

    def fmt(value: object, digits: int = 0) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:,.{digits}f}"
        return str(value)

    for key, cell in table.items():
        model_transport = "/".join(key.split("/")[:2])
        if key.endswith("/capacity"):
            rows.append(
                f"| {key} | {fmt(cell['goodput'])}/s | | {fmt(cell['admitted_p50_ms'])} / "
                f"{fmt(cell['admitted_p99_ms'])} | | {fmt(cell['timeouts'])} | {fmt(cell['load_average_1m'], 1)} "
                f"| {fmt(cell['lag_mean_ms'], 1)} / {fmt(cell['lag_max_ms'])} | | {fmt(cell['cpu_us_per_head'])} | |"
            )
            continue
        rows.append(
            f"| {key} | {fmt(cell['of_capacity'], 2)} ({fmt(cell['bound'], 2)}) | {fmt(cell['r'], 3)} "
            f"| {fmt(cell['admitted_p50_ms'])} / {fmt(cell['admitted_p99_ms'])} "
            f"({fmt(2 * capacity_p99.get(model_transport, 0.0))}) | {fmt(cell['refused_p99_ms'])} "
            f"| {fmt(cell['timeouts'])} | {fmt(cell['load_average_1m'], 1)} "
            f"| {fmt(cell['lag_mean_ms'], 1)} / {fmt(cell['lag_max_ms'])} "
            f"| {fmt(cell['turn_max_ms'])} ({fmt(cell['turns_over_budget'])}) "
            f"| {fmt(cell['cpu_us_per_head'])} | {fmt(cell['accept_burst_max'])} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    split = lambda kind: lambda s: [kind(x) for x in s.split(",")]  # noqa: E731
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", type=split(str), default=["heavy_mlp", "small_mlp"])
    parser.add_argument("--transports", type=split(str), default=["http", "grpc"])
    parser.add_argument("--connections", type=split(int), default=[64, 1600, 3000])
    parser.add_argument("--multiples", type=split(float), default=[2.0, 4.0, 8.0])
    parser.add_argument(
        "--streams-point", type=split(int), default=[100, 100], help="gRPC connections,streams"
    )
    parser.add_argument("--baseline-src", type=Path, help="src/ of an older checkout, measured alternately")
    parser.add_argument("--new-src", type=Path, help="src/ of the checkout to measure (default: this one)")
    parser.add_argument("--name", default="many_connections")
    parser.add_argument("--table-from", type=Path, help="only print a written result's medians as markdown")
    args = parser.parse_args()
    if args.table_from is not None:
        written = json.loads(args.table_from.read_text())
        for name, table in written["medians"].items():
            print(f"{name}:\n{markdown(table)}\n")
        return
    OUT.mkdir(exist_ok=True)
    new_env = (
        None if args.new_src is None else {"PYTHONPATH": str(args.new_src), "PYTHONDONTWRITEBYTECODE": "1"}
    )
    arms: list[tuple[str, dict[str, str] | None]] = [("new", new_env)]
    if args.baseline_src is not None:
        arms.append(("base", {"PYTHONPATH": str(args.baseline_src), "PYTHONDONTWRITEBYTECODE": "1"}))
    rounds: dict[str, list[dict]] = {name: [] for name, _ in arms}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        write_demo_repository(root)
        for folder in root.iterdir():  # the MLPs only: an older checkout may not load the apps
            if folder.name not in ("heavy_mlp", "small_mlp"):
                shutil.rmtree(folder)
        for number in range(args.rounds):
            for name, env in arms if number % 2 == 0 else arms[::-1]:
                print(f"round {number + 1}, {name}:", flush=True)
                rounds[name].append(one_round(root, Path(tmp), env, args))
    tables = {name: medians(rows) for name, rows in rounds.items() if rows}
    results = {
        "stamp": machine.stamp(),
        "args": vars(args) | {"baseline_src": str(args.baseline_src), "new_src": str(args.new_src)},
        "rounds": rounds,
        "medians": tables,
    }
    (OUT / f"{args.name}.json").write_text(json.dumps(results, indent=2, default=str))
    plotted = plot(tables["new"], OUT / f"{args.name}.png")
    for name, table in tables.items():
        print(f"{name}:\n{markdown(table)}\n")
    print("wrote", OUT / f"{args.name}.json", "and the plot" if plotted else "(no matplotlib: no plot)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
