"""Seed applications: dispatch quality against the exact optimum, dispatch latency at c=1, and
the hotword route before and after the corpus/ranker change.

1. Quality: ``--instances`` random city instances (4-10 couriers of capacity 1-4, 1.0-1.3x as
   many orders as free slots, half with unit weights and half with weights 0.5-2), every pair
   scored by the trained scorer in process; the pipeline's answer against the exact optimum
   (a two-phase MIP without time limit or gap: most orders, then most score).
2. Latency: ``POST /v1/route`` at c=1 for 50 orders x 20 couriers and 500 x 200 (unit and
   mixed weights), server pinned to CPU 0, this client on CPU 1; p50/p99 of all requests.
3. Hotword before/after: the server at ``--before`` (a git revision, checked out into a
   temporary worktree, its own demo models) and this checkout's, alternated, wrk on CPU 1,
   c=1 p50 and c=64 req/s, median of ``--repeats``.

    python benchmarks/bench_apps.py --instances 200 --seconds 5 --repeats 3 --before 07278d0^
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_array

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp
from wrk import WrkResult, run_wrk

from ortserve.apps.dispatch.pipeline import DispatchPipeline
from ortserve.apps.dispatch.training import OUTPUT, train_dispatch
from ortserve.apps.seeds import SEED_APPS, write_seed_apps
from ortserve.pipeline.contract import PipelineContext
from ortserve.testing import run_server

OUT = Path(__file__).parent / "out"
ROOT = Path(__file__).resolve().parent.parent
NOW = 1_759_017_600_000
PREDICT = {"query": "国庆旅游攻略", "region_id": 110000, "timestamp": NOW}


def instance(rng: np.random.Generator, orders: int, couriers: int, weights: list[float]) -> dict[str, Any]:
    """A city instance around central Beijing (about 12 km across)."""
    capacity = rng.integers(1, 5, couriers) * (1.0 if weights == [1.0] else 2.0)
    return {
        "now": NOW,
        "orders": [
            {"id": f"o{i:03d}", "lat": 39.86 + rng.uniform(0, 0.11), "lon": 116.33 + rng.uniform(0, 0.14),
             "created_at": NOW, "deadline": NOW + int(rng.integers(20, 91)) * 60_000,
             "weight": float(rng.choice(weights))}
            for i in range(orders)
        ],
        "couriers": [
            {"id": f"c{j:03d}", "lat": 39.86 + rng.uniform(0, 0.11), "lon": 116.33 + rng.uniform(0, 0.14),
             "capacity": float(capacity[j])}
            for j in range(couriers)
        ],
    }  # fmt: skip


def random_instance(rng: np.random.Generator, unit: bool) -> dict[str, Any]:
    couriers = int(rng.integers(4, 11))
    weights = [1.0] if unit else [0.5, 1.0, 1.5, 2.0]
    draft = instance(rng, 1, couriers, weights)
    slots = sum(c["capacity"] for c in draft["couriers"]) / float(np.mean(weights))
    return instance(rng, max(1, round(slots * rng.uniform(1.0, 1.3))), couriers, weights)


def exact(
    score: np.ndarray, eligible: np.ndarray, weights: np.ndarray, room: np.ndarray
) -> tuple[int, float]:
    """Most orders, then most score: two MIPs without time limit, the second holding the count."""
    orders, couriers = np.nonzero(eligible)
    if not len(orders):
        return 0, 0.0
    n = len(orders)
    columns = np.arange(n)
    constraints = [
        LinearConstraint(csr_array((np.ones(n), (orders, columns)), shape=(score.shape[0], n)), -np.inf, 1.0),
        LinearConstraint(
            csr_array((weights[orders], (couriers, columns)), shape=(len(room), n)), -np.inf, room + 1e-9
        ),
    ]
    options = {"mip_rel_gap": 0.0}
    first = milp(
        -np.ones(n), integrality=np.ones(n), bounds=Bounds(0, 1), constraints=constraints, options=options
    )
    count = round(-first.fun)
    constraints.append(LinearConstraint(np.ones((1, n)), count, np.inf))
    second = milp(
        -score[orders, couriers],
        integrality=np.ones(n),
        bounds=Bounds(0, 1),
        constraints=constraints,
        options=options,
    )
    return count, float(-second.fun)


def quality(repo: Path, instances: int, seed: int = 2026) -> dict[str, Any]:
    """The pipeline's answers vs the exact optimum, pairs scored by the trained model."""
    pipeline = DispatchPipeline(PipelineContext("dispatch", "1", repo / "dispatch" / "1"))
    session = ort.InferenceSession(
        str(repo / "dispatch" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(instances):
        document = random_instance(rng, unit=i % 2 == 0)
        prepared = pipeline.parse(document)
        [call] = pipeline.preprocess(prepared)
        scores = session.run(None, dict(call.inputs))[0]
        answer = pipeline.answer([{OUTPUT: scores}], prepared)
        request = prepared.request
        shape = (len(request.orders), len(request.couriers))
        score = scores[:, 0].astype(np.float64).reshape(shape)
        on_time = scores[:, 1].astype(np.float64).reshape(shape)
        assert prepared.features is not None
        eligible = prepared.features.fits & (on_time >= request.min_on_time)
        weights = np.array([o.weight for o in request.orders])
        room = np.array([c.capacity - c.load for c in request.couriers])
        best_count, best_score = exact(score, eligible, weights, room)
        courier_index = {c.id: j for j, c in enumerate(request.couriers)}
        chosen = [
            (o, courier_index[a["courier_id"]]) for o, a in enumerate(answer["orders"]) if a["courier_id"]
        ]
        got = float(sum(score[o, c] for o, c in chosen))
        rows.append({
            "unit": i % 2 == 0, "orders": shape[0], "couriers": shape[1], "method": answer["solver"]["method"],
            "count": len(chosen), "best_count": best_count, "score": got, "best_score": best_score,
        })  # fmt: skip
    ratios = [r["score"] / r["best_score"] if r["best_score"] else 1.0 for r in rows]
    methods: dict[str, int] = {}
    for r in rows:
        methods[r["method"]] = methods.get(r["method"], 0) + 1
    return {
        "instances": instances,
        "count_equal_share": sum(r["count"] == r["best_count"] for r in rows) / instances,
        "score_ratio_mean": statistics.fmean(ratios),
        "score_ratio_min": min(ratios),
        "methods": methods,
        "rows": rows,
    }


def post_timings(port: int, body: bytes, count: int) -> list[float]:
    """Seconds per ``POST /v1/route`` on one keep-alive connection, one at a time."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    times = []
    try:
        for _ in range(count):
            start = time.perf_counter()
            connection.request("POST", "/v1/route", body, {"Content-Type": "application/json"})
            reply = connection.getresponse()
            payload = reply.read()
            times.append(time.perf_counter() - start)
            if reply.status != 200:
                raise RuntimeError(f"/v1/route answered {reply.status}: {payload[:200]!r}")
    finally:
        connection.close()
    return times


def latency(repo: Path, requests: int) -> dict[str, Any]:
    """c=1 p50/p99 of /v1/route for 50x20 and 500x200, unit and mixed weights."""
    rng = np.random.default_rng(7)
    cases = {
        f"{o}x{c} {'unit' if w == [1.0] else 'mixed'}": instance(rng, o, c, w)
        for o, c in ((50, 20), (500, 200))
        for w in ([1.0], [0.5, 1.0, 1.5, 2.0])
    }
    result: dict[str, Any] = {}
    args = ["--intra-op-threads", "1", "--grpc-port", "-1", "--metrics-port", "-1"]
    os.sched_setaffinity(0, {1})
    try:
        with run_server(repo, OUT / "apps-route-server.log", args, pin_cpu=0) as server:
            for name, document in cases.items():
                body = orjson.dumps(document)
                count = requests if document["orders"].__len__() <= 50 else max(10, requests // 5)
                post_timings(server.http_port, body, 3)  # warm
                times = post_timings(server.http_port, body, count)
                answer = json.loads(_post_once(server.http_port, body))
                result[name] = {
                    "requests": count,
                    "p50_ms": float(np.percentile(times, 50) * 1e3),
                    "p99_ms": float(np.percentile(times, 99) * 1e3),
                    "method": answer["solver"]["method"],
                    "assigned": sum(o["courier_id"] is not None for o in answer["orders"]),
                }
                print("route", name, result[name], flush=True)
    finally:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    return result


def _post_once(port: int, body: bytes) -> bytes:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", "/v1/route", body, {"Content-Type": "application/json"})
        return connection.getresponse().read()
    finally:
        connection.close()


def hotword_repo(folder: Path, src: Path | None) -> Path:
    """A repository with only the hotword model, trained by the code in ``src`` (None: this one)."""
    if (folder / "hotword" / "config.yaml").exists():
        return folder
    if src is None:
        write_seed_apps(folder)
        return folder
    script = "import sys; from pathlib import Path; from ortserve.apps.seeds import write_seed_apps; write_seed_apps(Path(sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, "-c", script, str(folder)], check=True, env=env)
    return folder


def hotword_before_after(before: str, seconds: float, repeats: int) -> dict[str, Any]:
    """Both servers up at once (CPU 0), measured in alternation with wrk on CPU 1."""
    tree = OUT / "apps-before-src"
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), before], check=True)
    old_src = tree / "src"
    repos = {
        "before": hotword_repo(OUT / "apps-before-models", old_src),
        "after": hotword_repo(OUT / "apps-after-models", None),
    }
    args = ["--intra-op-threads", "1", "--grpc-port", "-1", "--metrics-port", "-1"]
    body = orjson.dumps(PREDICT)
    result: dict[str, Any] = {}
    with (
        run_server(
            repos["before"], OUT / "apps-before.log", args, env={"PYTHONPATH": str(old_src)}, pin_cpu=0
        ) as old,
        run_server(repos["after"], OUT / "apps-after.log", args, pin_cpu=0) as new,
    ):
        servers = {"before": old, "after": new}
        for server in servers.values():
            run_wrk(server.http_url, "/v1/predict", body, 4, 1)  # warm
        for concurrency in (1, 64):
            runs: dict[str, list[WrkResult]] = {name: [] for name in servers}
            for _ in range(repeats):
                for name, server in servers.items():
                    runs[name].append(run_wrk(server.http_url, "/v1/predict", body, concurrency, seconds))
            for name, results in runs.items():
                cell = {k: statistics.median(r.as_dict()[k] for r in results) for k in results[0].as_dict()}
                result[f"{name}/c{concurrency}"] = cell
                print("hotword", name, concurrency, cell, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--instances", type=int, default=200)
    parser.add_argument(
        "--requests", type=int, default=200, help="requests per 50x20 case (500x200: a fifth)"
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", default="07278d0^", help="git revision of the hotword 'before' server")
    parser.add_argument("--skip-hotword", action="store_true")
    parser.add_argument("--skip-dispatch", action="store_true")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    repo = OUT / "apps-route-models"
    if not (repo / "dispatch" / "config.yaml").exists():
        train_dispatch(repo / "dispatch" / "1")
        (repo / "dispatch" / "config.yaml").write_text(SEED_APPS["dispatch"][1], encoding="utf-8")
    report: dict[str, Any] = {**machine_stamp(), "command": " ".join(sys.argv)}
    if not args.skip_dispatch:
        report["quality"] = quality(repo, args.instances)
        print("quality", {k: v for k, v in report["quality"].items() if k != "rows"}, flush=True)
        report["latency"] = latency(repo, args.requests)
    if not args.skip_hotword:
        report["hotword"] = hotword_before_after(args.before, args.seconds, args.repeats)
    (OUT / f"apps-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
