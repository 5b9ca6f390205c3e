"""What routing costs, and what shadow traffic costs the primary, measured side by side.

One server (pinned to CPU 0) serves three models; ``ortserve bench`` (pinned to CPU 1) loads
them in alternating rounds, so both arms of each comparison see the same machine state:

- ``small_mlp`` (no policy) vs ``small_routed`` (the same graph as versions 1 and 2 with a
  70/30 split, sticky on ``parameters.user_id``, a different key per request body): c=1 p50
  and c=64 req/s. Beside them ``small_mlp_b`` (identical to ``small_mlp``: the A/A control,
  how far two identical models differ in this run) and ``small_one`` (one version, a sticky
  ``{"1": 100}`` split: the decision without the split into two queues). At c=64 the
  statistics extension gives each version's executions and rows per batch.
- ``heavy_mlp`` (versions 1 and 2, the same graph) at c=16 with ``{"split": {"1": 100}}`` vs
  the same plus ``shadow: {version: "2", fraction: 0.1}``, switched through ``PUT
  /v2/routing``: primary p99 and req/s, and the shadow's sent / dropped counts.

Also, in this process, the routing decision alone (``--micro``): the microseconds one
``DataPlane.submit`` spends with the 70/30 sticky policy against none, on a version that only
creates the request's future (no validation, no queue), so the difference is what routing adds
to every request whatever the machine's load.

Usage: ``python benchmarks/bench_routing.py [--rounds 3] [--seconds 4] [--micro]``; writes
benchmarks/out/routing.json. Medians over rounds are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp

from ortserve.demo import write_demo_repository
from ortserve.testing import ServerProcess, run_server

OUT = Path(__file__).parent / "out"
SHADOW_OFF = {"split": {"1": 100}}
SMALL_ARMS = ("small_mlp", "small_mlp_b", "small_one", "small_routed")
SHADOW_ON = {"split": {"1": 100}, "shadow": {"version": "2", "fraction": 0.1}}


def repository(root: Path) -> None:
    write_demo_repository(root)
    for name in ("hotword", "dispatch"):
        shutil.rmtree(root / name, ignore_errors=True)
    config = (root / "small_mlp" / "config.yaml").read_text()
    shutil.copytree(root / "small_mlp", root / "small_mlp_b")  # the A/A control
    one = root / "small_one"
    shutil.copytree(root / "small_mlp" / "1", one / "1")
    (one / "config.yaml").write_text(
        config + '\nrouting:\n  split: {"1": 100}\n  sticky: {parameter: user_id}\n'
    )
    routed = root / "small_routed"
    for version in ("1", "2"):
        shutil.copytree(root / "small_mlp" / "1", routed / version)
    (routed / "config.yaml").write_text(
        config
        + '\nversion_policy: all\nrouting:\n  split: {"1": 70, "2": 30}\n  sticky: {parameter: user_id}\n'
    )
    shutil.copytree(root / "heavy_mlp" / "1", root / "heavy_mlp" / "2")
    heavy = (root / "heavy_mlp" / "config.yaml").read_text()
    (root / "heavy_mlp" / "config.yaml").write_text(
        heavy + '\nversion_policy: all\nrouting:\n  split: {"1": 100}\n'
    )


def bodies(path: Path, width: int, count: int = 2000) -> Path:
    rng = np.random.default_rng(0)
    with path.open("w") as out:
        for i in range(count):
            data = rng.standard_normal(width).astype(np.float32).round(4).tolist()
            tensor = {"name": "input", "datatype": "FP32", "shape": [1, width], "data": data}
            out.write(json.dumps({"inputs": [tensor], "parameters": {"user_id": f"user-{i}"}}) + "\n")
    return path


def bench(
    server: ServerProcess, model: str, inputs: Path, concurrency: int, seconds: float, out: Path
) -> dict[str, float]:
    command = [
        "taskset",
        "-c",
        "1",
        sys.executable,
        "-m",
        "ortserve",
        "bench",
        server.http_url,
        "--model",
        model,
        "--input-file",
        str(inputs),
        "-c",
        str(concurrency),
        "-d",
        str(seconds),
        "--warmup",
        "1",
        "--no-progress",
        "-o",
        str(out),
    ]
    subprocess.run(command, check=True, capture_output=True)
    summary = json.loads(out.read_text())["levels"][0]["summary"]
    return {
        "rate": summary["achieved_rate"],
        "p50_ms": summary["latency_ms"]["p50"],
        "p99_ms": summary["latency_ms"]["p99"],
        "errors": summary["errors"],
    }


def executions(server: ServerProcess, model: str) -> dict[str, tuple[int, int]]:
    """Each version's (inference_count, execution_count) so far (statistics extension)."""
    with urllib.request.urlopen(f"{server.http_url}/v2/models/{model}/stats", timeout=10) as reply:
        found = json.loads(reply.read())["model_stats"]
    return {s["version"]: (int(s["inference_count"]), int(s["execution_count"])) for s in found}


def batching(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict[str, float]:
    """Rows per batch and executions over a phase, all versions together and per version."""
    found: dict[str, float] = {}
    rows = runs = 0
    for version, (rows_after, runs_after) in sorted(after.items()):
        rows_v = rows_after - before.get(version, (0, 0))[0]
        runs_v = runs_after - before.get(version, (0, 0))[1]
        rows, runs = rows + rows_v, runs + runs_v
        found[f"v{version}_executions"] = runs_v
        found[f"v{version}_rows_per_batch"] = rows_v / max(1, runs_v)
    found["executions"] = runs
    found["rows_per_batch"] = rows / max(1, runs)
    return found


def put(server: ServerProcess, model: str, policy: object) -> dict[str, object]:
    request = urllib.request.Request(
        f"{server.http_url}/v2/routing/models/{model}", json.dumps(policy).encode(), method="PUT"
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return dict(json.loads(reply.read()))


def get(server: ServerProcess, model: str) -> dict[str, object]:
    with urllib.request.urlopen(f"{server.http_url}/v2/routing/models/{model}", timeout=10) as reply:
        return dict(json.loads(reply.read()))


def median(rounds: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


class _Instant:
    """A served version that only creates the answer's future (what routing adds is measured)."""

    def __init__(self, version: str) -> None:
        from ortserve.core.model import ModelState, VersionInfo

        self.info = VersionInfo("m", version, (), (), 8, ("cpu",))
        self.state = ModelState.READY
        self.ready = True

    def submit(self, request: object) -> asyncio.Future[object]:
        return asyncio.get_running_loop().create_future()


async def micro(rounds: int, count: int = 50_000) -> dict[str, float]:
    """Microseconds per DataPlane.submit with a sticky 70/30 policy and without one."""
    from ortserve.config.model import ModelConfig
    from ortserve.config.routing import RoutingConfig
    from ortserve.core.dataplane import DataPlane
    from ortserve.core.types import InferInput, InferRequest, ServerMetadata
    from ortserve.repository.registry import ModelRegistry
    from ortserve.routing.table import RoutingTable

    registry = ModelRegistry()
    for name in ("plain", "m"):
        for version in ("1", "2"):
            registry.publish(name, int(version), _Instant(version), 0.0)  # type: ignore[arg-type]
    registry.entry("m").config = ModelConfig(
        routing=RoutingConfig.model_validate({"split": {"1": 70, "2": 30}})
    )
    table = RoutingTable(registry, time.monotonic)
    table.sync()
    plane = DataPlane(registry, ServerMetadata("b", "0", ()))
    plane.routers = table.routers
    x = np.zeros((1, 64), dtype=np.float32)
    headers = [{"x-user-id": f"user-{i}"}.get for i in range(1000)]

    async def run(model: str) -> float:
        # Answered at once; the done callbacks (routing's outcome counting) run every 64
        # requests, inside the timing, as they would between the loop's reads.
        started = time.perf_counter()
        for i in range(count):
            request = InferRequest(
                model, [InferInput("input", "FP32", (1, 64), x)], headers=headers[i % 1000]
            )
            plane.submit(request).set_result(None)
            if i % 64 == 63:
                await asyncio.sleep(0)
        await asyncio.sleep(0)
        return (time.perf_counter() - started) / count * 1e6

    figures: dict[str, list[float]] = {"plain_us": [], "routed_us": []}
    for _ in range(rounds):
        figures["plain_us"].append(await run("plain"))
        figures["routed_us"].append(await run("m"))
    return {key: statistics.median(values) for key, values in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--micro", action="store_true", help="Only the in-process decision cost.")
    parser.add_argument("--cells", choices=("all", "routing", "shadow"), default="all")
    args = parser.parse_args()
    if args.micro:
        figures = asyncio.run(micro(max(args.rounds, 5)))
        print(json.dumps(figures))
        OUT.mkdir(exist_ok=True)
        (OUT / "routing_micro.json").write_text(json.dumps({**machine_stamp(), **figures}, indent=2))
        return
    OUT.mkdir(exist_ok=True)
    cells: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "models"
        repository(root)
        small = bodies(Path(scratch) / "small.jsonl", 64)
        heavy = bodies(Path(scratch) / "heavy.jsonl", 512, 500)
        with run_server(root, Path(scratch) / "server.log", ["--intra-op-threads", "1"], pin_cpu=0) as server:
            shadow_state: dict[str, object] = {}
            for round_ in range(args.rounds):
                flip = round_ % 2 == 1  # alternate which arm goes first, against drift
                shift = round_ % len(SMALL_ARMS)  # rotate the order, against drift
                for c in (1, 64) if args.cells != "shadow" else ():
                    for model in SMALL_ARMS[shift:] + SMALL_ARMS[:shift]:
                        before = executions(server, model)
                        result = bench(server, model, small, c, args.seconds, Path(scratch) / "r.json")
                        if c == 64:
                            result.update(batching(before, executions(server, model)))
                        cells.setdefault(f"{model} c={c}", []).append(result)
                arms = (("shadow off", SHADOW_OFF), ("shadow on", SHADOW_ON))
                for label, policy in (reversed(arms) if flip else arms) if args.cells != "routing" else ():
                    put(server, "heavy_mlp", policy)
                    result = bench(server, "heavy_mlp", heavy, 16, args.seconds, Path(scratch) / "r.json")
                    cells.setdefault(f"heavy_mlp c=16 {label}", []).append(result)
                    if label == "shadow on":
                        shadow_state = get(server, "heavy_mlp")["shadow"]  # type: ignore[assignment]
    table = {cell: {k: median(rounds, k) for k in rounds[0]} for cell, rounds in cells.items()}
    pairs = {
        "A/A small_mlp_b/small_mlp c=1 p50": ("small_mlp_b c=1", "small_mlp c=1", "p50_ms"),
        "A/A small_mlp_b/small_mlp c=64 req/s": ("small_mlp_b c=64", "small_mlp c=64", "rate"),
        "decision only: one/plain c=1 p50": ("small_one c=1", "small_mlp c=1", "p50_ms"),
        "decision only: one/plain c=64 req/s": ("small_one c=64", "small_mlp c=64", "rate"),
        "routed/plain c=1 p50": ("small_routed c=1", "small_mlp c=1", "p50_ms"),
        "routed/plain c=64 req/s": ("small_routed c=64", "small_mlp c=64", "rate"),
        "routed/one c=64 req/s (the split)": ("small_routed c=64", "small_one c=64", "rate"),
        "shadow on/off c=16 p99": ("heavy_mlp c=16 shadow on", "heavy_mlp c=16 shadow off", "p99_ms"),
        "shadow on/off c=16 req/s": ("heavy_mlp c=16 shadow on", "heavy_mlp c=16 shadow off", "rate"),
    }
    pairs = {name: pair for name, pair in pairs.items() if pair[0] in cells}
    # The ratio of each round's two arms (measured seconds apart), then the median over rounds.
    ratios = {
        name: statistics.median(a[key] / b[key] for a, b in zip(cells[arm], cells[base], strict=True))
        for name, (arm, base, key) in pairs.items()
    }
    document = {
        **machine_stamp(),
        "rounds": args.rounds,
        "seconds": args.seconds,
        "cells": table,
        "ratios": ratios,
        "all_rounds": cells,
        "last_shadow_state": shadow_state,
    }
    (OUT / "routing.json").write_text(json.dumps(document, indent=2))
    for cell, figures in table.items():
        line = f"{cell:<28} {figures['rate']:>9.1f} req/s  p50 {figures['p50_ms']:.3f} ms  p99 {figures['p99_ms']:.3f} ms  errors {figures['errors']:g}"
        if "rows_per_batch" in figures:
            per_version = " ".join(f"{k} {v:.1f}" for k, v in figures.items() if k.startswith("v"))
            line += f"  rows/batch {figures['rows_per_batch']:.2f} ({per_version})"
        print(line)
    for name, value in ratios.items():
        print(f"{name:<40} {value:.3f}")


if __name__ == "__main__":
    main()
