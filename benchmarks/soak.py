"""Soak and chaos: mixed traffic for minutes while injected faults switch fallback levels.

One server (pinned to CPU 0 with ``--pin``) serves ``soak_mlp`` (the demo small MLP) with a
CPU fallback session, remembered default answers and an input sandbox; its faults switch
level 0 off for part of every cycle and, less often, level 2 too (then only remembered answers
or a 503 remain). Meanwhile, from this process:

- HTTP JSON (2 clients), HTTP binary (tritonclient), gRPC unary and gRPC streaming clients,
  every answer checked against a local ONNX Runtime run on the same rows;
- the pipeline routes ``POST /v1/predict`` (hotword, 20/s) and ``POST /v1/route`` (dispatch,
  10/s) of the seed applications, every answer checked against the answer the same pipelines
  give the same body in this process (``soak_pipelines.py``);
- clients that disconnect mid-request (half a body, or a full request never read);
- a slow reader (a 32-row answer read 64 bytes at a time);
- malformed requests (bad JSON, wrong shape, sandbox violations, oversized bodies, unknown
  model), each expected to get its own 4xx;
- a reload of the model, then of ``hotword`` (its pipeline follows), every ``--reload-s``
  seconds (explicit model control).

Per window (a minute by default): p50/p99 of answered model requests (the pipeline routes have
their own count and p99), requests/s, outcomes by kind,
answers by level, server RSS, open fds and threads. Exit status 1 on any lost answer
(transport error, timeout, 500, an unexpected status) or wrong answer, or, for runs of 5
minutes or more, a growth trend in RSS, fds or threads.

Usage: ``python benchmarks/soak.py [--duration-s 600] [--window-s 60] [--pin]``
Writes benchmarks/out/soak.json (and soak.png with matplotlib).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp
from soak_clients import Clients, Record, proc_counts
from soak_pipelines import PIPELINE_MODELS, ROUTES, build_pools, write_pipeline_models

from ortserve.demo import DEMO_MODELS, build_mlp
from ortserve.testing import run_server

OUT = Path(__file__).parent / "out"
MODEL = "soak_mlp"


def config_text(cycle_scale: float) -> str:
    """L0 fails 12 s of every 40 s from 5 s after each (re)load; L2 fails 8 s from 50 s, inside
    L0's second incident (then only remembered answers, or 503, are left)."""
    k = cycle_scale
    return f"""batching: {{max_batch_size: 32, max_queue_delay_ms: 1.0}}
fallback:
  session: cpu
  build: load
  default: {{last_good: 4096}}
  breaker: {{consecutive_failures: 3, open_s: {max(0.25, k):g}, max_open_s: {max(0.5, 4 * k):g}}}
faults:
  L0: {{error_rate: 1.0, cycle_s: {40 * k:g}, active_s: {12 * k:g}, offset_s: {5 * k:g}}}
  L2: {{error_rate: 1.0, cycle_s: {1000 * k:g}, active_s: {8 * k:g}, offset_s: {50 * k:g}}}
inputs:
  input: {{min: -100, max: 100, allow_nan: false, allow_inf: false}}
"""


def write_repository(root: Path, cycle_scale: float) -> Path:
    sizes, seed = DEMO_MODELS["small_mlp"]
    folder = root / MODEL / "1"
    folder.mkdir(parents=True)
    onnx.save(build_mlp(sizes, seed, MODEL), str(folder / "model.onnx"))
    (root / MODEL / "config.yaml").write_text(config_text(cycle_scale), encoding="utf-8")
    return folder / "model.onnx"


def window_rows(
    records: list[Record],
    samples: list[tuple[float, float, int, int]],
    start: float,
    window_s: float,
    end: float,
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    t = start
    while t < end - window_s / 2:
        stop = min(t + window_s, end)
        inside = [r for r in records if t <= r.t < stop]
        answered = [r.latency_s for r in inside if r.outcome in ("ok", "degraded") and r.client not in ROUTES]
        routed = [r.latency_s for r in inside if r.outcome == "ok" and r.client in ROUTES]
        kinds: dict[str, int] = {}
        levels: dict[str, int] = {}
        for r in inside:
            kinds[r.outcome] = kinds.get(r.outcome, 0) + 1
            if r.outcome in ("ok", "degraded") and r.client not in ROUTES:
                levels[str(r.level)] = levels.get(str(r.level), 0) + 1
        last = [s for s in samples if s[0] < stop] or samples[:1]
        rss, fds, threads = (last[-1][1], last[-1][2], last[-1][3]) if last else (0.0, 0, 0)
        rows.append(
            {
                "window": len(rows) + 1,
                "p50_ms": round(float(np.percentile(answered, 50)) * 1e3, 2) if answered else None,
                "p99_ms": round(float(np.percentile(answered, 99)) * 1e3, 2) if answered else None,
                "req_s": round(len(inside) / (stop - t), 1),
                "pipeline_answers": len(routed),
                "pipeline_p99_ms": round(float(np.percentile(routed, 99)) * 1e3, 2) if routed else None,
                "outcomes": dict(sorted(kinds.items())),
                "levels": dict(sorted(levels.items())),
                "rss_mib": round(rss, 1),
                "fds": fds,
                "threads": threads,
            }
        )
        t = stop
    return rows


def growth_problems(rows: list[dict[str, object]]) -> list[str]:
    """RSS, fds and threads must not trend up after the first two windows (warm-up)."""
    steady = rows[2:]
    if len(steady) < 3:
        return []
    problems = []
    for key, slack in (("rss_mib", 0.10), ("fds", 0.10), ("threads", 0.10)):
        values = np.array([float(r[key]) for r in steady])  # type: ignore[arg-type]
        slope = float(np.polyfit(np.arange(len(values)), values, 1)[0])
        rise = slope * (len(values) - 1)
        if values[-1] > values[0] * (1 + slack) and rise > values[0] * slack:
            problems.append(f"{key} grows: {values[0]:g} -> {values[-1]:g} (trend +{rise:.1f})")
    return problems


def plot(rows: list[dict[str, object]], window_s: float, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    x = [int(r["window"]) * window_s / 60 for r in rows]  # type: ignore[call-overload]
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    axes[0].plot(x, [r["p50_ms"] for r in rows], label="p50")
    axes[0].plot(x, [r["p99_ms"] for r in rows], label="p99")
    axes[0].set_ylabel("latency (ms)")
    axes[0].legend()
    axes[1].plot(x, [r["req_s"] for r in rows], label="req/s")
    for level in ("0", "2", "3"):
        axes[1].plot(
            x, [r["levels"].get(level, 0) / window_s for r in rows], label=f"level {level} answers/s"
        )  # type: ignore[union-attr]
    axes[1].set_ylabel("requests/s")
    axes[1].legend(fontsize="small")
    axes[2].plot(x, [r["rss_mib"] for r in rows], label="RSS MiB")
    axes[2].plot(x, [r["fds"] for r in rows], label="fds")
    axes[2].plot(x, [r["threads"] for r in rows], label="threads")
    axes[2].set_xlabel("minutes")
    axes[2].legend(fontsize="small")
    fig.suptitle("soak: mixed traffic, faults switching levels, reloads")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--reload-s", type=float, default=90.0)
    parser.add_argument("--cycle-scale", type=float, default=1.0, help="scales the fault cycles")
    parser.add_argument("--pin", action="store_true", help="server on CPU 0, this process on CPU 1")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="ortserve-soak-"))
    try:
        model_path = write_repository(root / "models", args.cycle_scale)
        reference = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
        write_pipeline_models(root / "models", root / "reference")
        pools = build_pools(root / "reference")
        if args.pin:
            os.sched_setaffinity(0, {1})
        server_args = [
            "--enable-fault-injection",
            "--model-control-mode",
            "explicit",
            "--load-model",
            MODEL,
            *(flag for model in PIPELINE_MODELS for flag in ("--load-model", model)),
            "--max-body-bytes",
            "1000000",
            "--intra-op-threads",
            "1",
        ]
        with run_server(
            root / "models", root / "server.log", server_args, pin_cpu=0 if args.pin else None
        ) as server:
            clients = Clients(server, MODEL, reference, args.reload_s, pools, ("hotword",))
            samples: list[tuple[float, float, int, int]] = []
            start = time.monotonic()
            clients.start()
            while (now := time.monotonic()) < start + args.duration_s:
                samples.append((now, *proc_counts(server.process.pid)))
                time.sleep(min(2.0, start + args.duration_s - now))
            end = time.monotonic()
            clients.stop()
            samples.append((end, *proc_counts(server.process.pid)))
            log = server.log()
        rows = window_rows(clients.records, samples, start, args.window_s, end)
        totals: dict[str, int] = {}
        by_client: dict[str, dict[str, int]] = {}
        for r in clients.records:
            totals[r.outcome] = totals.get(r.outcome, 0) + 1
            mine = by_client.setdefault(r.client, {})
            mine[r.outcome] = mine.get(r.outcome, 0) + 1
        moves = log.count("traffic moved from level")
        problems = [f"{n} {kind} answers" for kind, n in totals.items() if kind in ("lost", "wrong")]
        if args.duration_s >= 300:
            problems += growth_problems(rows)
        result = {
            **machine_stamp(),
            "duration_s": round(end - start, 1),
            "window_s": args.window_s,
            "windows": rows,
            "totals": dict(sorted(totals.items())),
            "by_client": {client: dict(sorted(kinds.items())) for client, kinds in sorted(by_client.items())},
            "level_moves_logged": moves,
            "reloads": clients.reloads,
            "examples": clients.examples,
            "problems": problems,
        }
        (args.out / "soak.json").write_text(json.dumps(result, indent=2))
        plotted = plot(rows, args.window_s, args.out / "soak.png")
        print(
            json.dumps(
                {k: result[k] for k in ("duration_s", "totals", "level_moves_logged", "reloads", "problems")}
            )
        )
        print("plot:", args.out / "soak.png" if plotted else "(matplotlib not installed)")
        return 1 if problems else 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
