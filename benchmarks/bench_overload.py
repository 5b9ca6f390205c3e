"""Overload: goodput, admitted and refused latency at 1x-8x the measured capacity (issue 10).

The server runs on CPU 0, ``ortserve bench`` on CPU 1. For each model and transport the
capacity is measured first (closed loop, concurrency 64: requests/s and p99), then open-loop
constant-rate load (uniform arrivals, latency from the intended send time) at 1x, 2x, 4x and
8x that rate. Also: the same models with ``latency_budget_ms``, 3,000 connections in a closed
loop on small_mlp (2 s client timeout), and, with ``--baseline-src``, the c=64 closed loop and
the 4x point of an older checkout side by side.

    .venv/bin/python benchmarks/bench_overload.py --seconds 8
    .venv/bin/python benchmarks/bench_overload.py --baseline-src /tmp/base/src

Writes benchmarks/out/overload.json and, with matplotlib, benchmarks/out/overload.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import machine

from ortserve.demo import write_demo_repository
from ortserve.testing import ServerProcess, run_server

OUT = Path(__file__).parent / "out"
MULTIPLES = (1, 2, 4, 8)
BUDGETS_MS = {"heavy_mlp": 100.0, "small_mlp": 20.0}


def repository(root: Path) -> Path:
    """The demo MLPs, plus copies with a latency budget (the pipelines are left out: an
    older checkout given as baseline may not load today's)."""
    write_demo_repository(root)
    for folder in root.iterdir():
        if folder.name not in BUDGETS_MS:
            shutil.rmtree(folder)
    for name, budget in BUDGETS_MS.items():
        copy = root / f"{name}_budget"
        shutil.copytree(root / name, copy)
        config = (copy / "config.yaml").read_text()
        (copy / "config.yaml").write_text(config + f"  latency_budget_ms: {budget}\n")
    return root


def server_cpu_s(server: ServerProcess) -> float:
    """CPU seconds the server process has used (user + system, all threads)."""
    fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench(server: ServerProcess, model: str, transport: str, level: list[str], seconds: float) -> dict:
    """One ``ortserve bench`` level on CPU 1; returns its summary, with the server's CPU time
    per answer (warm-up included on both sides: answers scaled by (seconds + 1) / seconds)."""
    url = (
        f"{server.host}:{server.grpc_port}"
        if transport == "grpc"
        else f"http://{server.host}:{server.http_port}"
    )
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [
            "taskset", "-c", "1", sys.executable, "-m", "ortserve", "bench", url, "-m", model,
            "--transport", transport, "-d", str(seconds), "--warmup", "1", "-o", out.name,
            "--no-progress", *level,
        ]  # fmt: skip
        cpu_before = server_cpu_s(server)
        subprocess.run(command, check=True, capture_output=True)
        cpu = server_cpu_s(server) - cpu_before
        document = json.loads(Path(out.name).read_text())
    summary: dict = document["levels"][0]["summary"]
    answers = summary["requests"] * (seconds + 1) / seconds
    summary["server_cpu_us_per_answer"] = round(cpu / answers * 1e6, 1) if answers else None
    return summary


def figures(summary: dict) -> dict:
    """Goodput (2xx/s), admitted p50/p99, refusal p99, timeouts, generator lag."""
    statuses = summary["statuses"]
    ok = sum(count for name, count in statuses.items() if name.startswith("2") or name == "OK")
    refused = summary.get("refused_latency_ms", {})
    return {
        "goodput": round(ok / summary["elapsed_s"], 1) if summary["elapsed_s"] else 0.0,
        "offered": summary["achieved_rate"],
        "admitted_p50_ms": summary["latency_ms"]["p50"],
        "admitted_p99_ms": summary["latency_ms"]["p99"],
        "refused_p99_ms": refused.get("p99"),
        "statuses": statuses,
        "send_lag_p99_ms": summary.get("send_lag_p99_ms"),
        "generator_cores": summary["generator_cpu_cores"],
        "server_cpu_us_per_answer": summary["server_cpu_us_per_answer"],
    }


def sweep(
    server: ServerProcess,
    model: str,
    transport: str,
    capacity: float,
    seconds: float,
    multiples: tuple[int, ...],
) -> list[dict]:
    """Open-loop constant-rate levels at these multiples of ``capacity``."""
    rows = []
    for multiple in multiples:
        rate = capacity * multiple
        level = ["-r", f"{rate:.0f}", "--arrivals", "uniform", "--connections", "512", "--timeout", "5"]
        row = figures(bench(server, model, transport, level, seconds))
        row |= {"multiple": multiple, "rate": round(rate)}
        print(f"  {model} {transport} {multiple}x ({rate:.0f}/s): {row}", flush=True)
        rows.append(row)
    return rows


def closed(server: ServerProcess, model: str, transport: str, concurrency: int, seconds: float) -> dict:
    level = ["-c", str(concurrency), "--timeout", "2"]
    row = figures(bench(server, model, transport, level, seconds))
    print(f"  {model} {transport} c={concurrency}: {row}", flush=True)
    return row


def measure(root: Path, logs: Path, seconds: float, env: dict[str, str] | None, full: bool) -> dict:
    """Everything against one server build (``env`` may point PYTHONPATH at another checkout)."""
    results: dict = {}
    with run_server(root, logs / "server.log", ["--intra-op-threads", "1"], env=env, pin_cpu=0) as server:
        for model in ("heavy_mlp", "small_mlp"):
            for transport in ("http-json", "grpc") if full else ("http-json",):
                capacity = closed(server, model, transport, 64, seconds)
                entry: dict = {"capacity": capacity}
                multiples = MULTIPLES if full else (4,)
                entry["open_loop"] = sweep(server, model, transport, capacity["goodput"], seconds, multiples)
                if full and transport == "http-json":
                    entry["budget_ms"] = BUDGETS_MS[model]
                    entry["budget_open_loop"] = sweep(
                        server, f"{model}_budget", transport, capacity["goodput"], seconds, MULTIPLES
                    )
                results[f"{model}/{transport}"] = entry
        results["small_mlp/http-json/c3000"] = closed(server, "small_mlp", "http-json", 3000, seconds)
    return results


def plot(results: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for key, entry in results["new"].items():
        if "open_loop" not in entry:
            continue
        capacity = entry["capacity"]["goodput"]
        for variant in ("open_loop", "budget_open_loop"):
            rows = entry.get(variant)
            if not rows:
                continue
            label = key + (" budget" if variant != "open_loop" else "")
            xs = [r["multiple"] for r in rows]
            left.plot(xs, [r["goodput"] / capacity for r in rows], marker="o", label=label)
            right.plot(xs, [r["admitted_p99_ms"] for r in rows], marker="o", label=label)
    left.axhline(0.9, color="grey", linestyle="--")
    left.set(xlabel="offered load (x capacity)", ylabel="goodput / capacity", xscale="log", ylim=(0, 1.2))
    right.set(xlabel="offered load (x capacity)", ylabel="admitted p99 (ms)", xscale="log", yscale="log")
    left.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--baseline-src", type=Path, help="src/ of an older checkout to compare")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    results: dict = {"stamp": machine.stamp(), "seconds": args.seconds}
    with tempfile.TemporaryDirectory() as tmp:
        root = repository(Path(tmp) / "models")
        if args.baseline_src is not None:
            print("baseline:", args.baseline_src, flush=True)
            env = {"PYTHONPATH": str(args.baseline_src), "PYTHONDONTWRITEBYTECODE": "1"}
            results["baseline"] = measure(root, Path(tmp), args.seconds, env, full=False)
        print("this checkout:", flush=True)
        results["new"] = measure(root, Path(tmp), args.seconds, None, full=True)
    (OUT / "overload.json").write_text(json.dumps(results, indent=2))
    plot(results, OUT / "overload.png")
    print("wrote", OUT / "overload.json", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
