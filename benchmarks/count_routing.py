"""Instructions per request that routing adds, counted by callgrind (machine noise cannot move it).

The end-to-end routing benchmark (``bench_routing.py``) resolves a few percent only with an
A/A control and many rounds, and on this VM not even then. Here one server runs under
``valgrind --tool=callgrind --instr-atstart=no`` (CPU 0, one intra-op thread) with the models
of ``bench_routing.py``: ``small_mlp`` (no policy), ``small_mlp_b`` (identical: the A/A control),
``small_one`` (one version, sticky ``{"1": 100}``: the decision alone) and ``small_routed``
(70/30 sticky over two versions), and ``small_nb`` / ``small_nb_b``: ``small_mlp`` with
``max_batch_size: 0``, so every request runs alone and at ``--clients 64`` the count per
request is the edge's work and one run's, not a share of the batches the scheduler happened to
form (with batching, rows per batch differ between arms and runs, and so does the count).
h2load (CPU 1) sends ``--calls`` and then ``2 * --calls`` requests (c=1, or ``--clients``) to
each, over HTTP/1.1 (JSON, ``parameters.user_id``) and gRPC (the same tensor and parameter);
instructions per request are the difference of the two counts over
``--calls``, so what each run pays once drops out. Each dump is kept for ``callgrind_annotate``.

Each arm is also given "without gc": the same difference less the cyclic garbage collector's
collections (``gc_collect_main``, inclusive). A collection's cost follows the heap (how many
objects are alive: 64 requests in flight hold more) and which window its allocation threshold
falls in, not the request's path: between two identical unbatched models at c=64 it moved the
count per request by 1k to 12k, as much as the edge's whole change.

    python benchmarks/count_routing.py --tree before=/tmp/old/src --tree after=src --calls 300

Writes benchmarks/out/count_routing-STAMP/count_routing.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_grpc import INFER
from bench_routing import SMALL_ARMS, executions, repository
from count_grpc import callgrind_server, counted, write_report
from h2load import GRPC_HEADERS, grpc_frame

from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.testing import ServerProcess

OUT = Path(__file__).parent / "out"
WIDTH = 64
NO_BATCH = ("small_nb", "small_nb_b")
"""``small_mlp`` unbatched, twice (the A/A): the count per request does not follow batching."""


def http_body() -> bytes:
    data = np.random.default_rng(1).standard_normal(WIDTH).astype(np.float32).round(4).tolist()
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, WIDTH], "data": data}
    return json.dumps({"inputs": [tensor], "parameters": {"user_id": "user-7"}}).encode()


def grpc_body(model: str) -> bytes:
    data = np.random.default_rng(1).standard_normal((1, WIDTH)).astype(np.float32)
    message = pb.ModelInferRequest(
        model_name=model,
        inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[1, WIDTH])],
        raw_input_contents=[data.tobytes()],
    )
    message.parameters["user_id"].string_param = "user-7"
    return grpc_frame(message.SerializeToString())


def h2load(url: str, body: bytes, calls: int, headers: tuple[str, ...], h1: bool, clients: int) -> float:
    """``calls`` requests from ``clients`` connections, one in flight on each; the seconds."""
    with tempfile.NamedTemporaryFile(prefix="count-routing-", suffix=".bin") as file:
        file.write(body)
        file.flush()
        command = [
            "taskset",
            "-c",
            "1",
            "h2load",
            "-t1",
            f"-c{clients}",
            "-m1",
            f"-n{calls}",
            "-d",
            file.name,
        ]
        command += ["--h1"] if h1 else []
        command += [arg for header in headers for arg in ("-H", header)]
        started = time.monotonic()
        done = subprocess.run([*command, url], capture_output=True, text=True, check=True, timeout=900)
    match = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", done.stdout)
    if match is None or int(match.group(2)) != calls:
        raise RuntimeError(f"h2load did not complete {calls} requests:\n{done.stdout}")
    return time.monotonic() - started


POLICIES: dict[str, object] = {
    "none": None,
    "one": {"split": {"1": 100}, "sticky": {"parameter": "user_id"}},
    "split": {"split": {"1": 70, "2": 30}, "sticky": {"parameter": "user_id"}},
}


def set_policy(server: ServerProcess, model: str, policy: object) -> None:
    """Put ``policy`` in force for ``model`` through the control API (None: remove it)."""
    url = f"{server.http_url}/v2/routing/models/{model}"
    body = None if policy is None else json.dumps(policy).encode()
    request = urllib.request.Request(url, body, method="DELETE" if policy is None else "PUT")
    with urllib.request.urlopen(request, timeout=60) as reply:
        reply.read()


_INCLUSIVE = re.compile(r"^\s*([\d,]+) \([ \d.]+%\)\s+\S*:gc_collect_main \[", re.MULTILINE)


def collector_ir(dump: Path) -> int:
    """Instructions spent in the cyclic GC's collections in ``dump`` (inclusive of what they
    freed), read with ``callgrind_annotate --inclusive=yes``."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--auto=no", str(dump)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return max((int(found.replace(",", "")) for found in _INCLUSIVE.findall(text)), default=0)


def runs_of(server: ServerProcess, model: str) -> int:
    """The model's executions so far, every version (statistics extension)."""
    return sum(runs for _, runs in executions(server, model).values())


def measure(
    label: str, src: Path, repo: Path, calls: int, out_dir: Path, args: argparse.Namespace
) -> dict[str, float]:
    result: dict[str, float] = {}
    with callgrind_server(label, src, repo, out_dir) as (process, server):
        for transport in args.transports.split(","):
            for index, arm in enumerate(args.arms.split(",")):
                model, _, policy = arm.partition("@")
                if policy:  # the same model with and without a policy: no A/A offset
                    set_policy(server, model, POLICIES[policy])
                headers: tuple[str, ...]
                if transport == "http":
                    url = f"{server.http_url}/v2/models/{model}/infer"
                    body, headers, h1 = http_body(), ("content-type: application/json",), True
                else:
                    url = f"http://{server.grpc_address}{INFER}"
                    body, headers, h1 = grpc_body(model), GRPC_HEADERS, False

                def send(
                    n: int,
                    url: str = url,
                    body: bytes = body,
                    headers: tuple[str, ...] = headers,
                    h1: bool = h1,
                ) -> None:
                    h2load(url, body, n, headers, h1, args.clients)

                send(max(50, 2 * args.clients))  # warm: first-request caches
                name = f"{label}-{transport}-{index}-{model}-{policy or 'file'}"
                runs = runs_of(server, model)
                first = counted(process.pid, out_dir, f"{name}-{calls}", lambda: send(calls))
                second = counted(process.pid, out_dir, f"{name}-{2 * calls}", lambda: send(2 * calls))
                key = f"{transport} {index} {arm}"
                result[key] = (second - first) / calls
                collected = [collector_ir(out_dir / f"{name}-{n}.callgrind") for n in (calls, 2 * calls)]
                result[f"{key} without gc"] = (second - collected[1] - first + collected[0]) / calls
                result[f"{key} rows/batch"] = 3 * calls / max(1, runs_of(server, model) - runs)
                print(
                    label,
                    key,
                    f"{result[key]:,.0f} ir/request,",
                    f"{result[f'{key} without gc']:,.0f} without gc,",
                    f"{result[f'{key} rows/batch']:.1f} rows/batch",
                    flush=True,
                )
        return result


def differences(figures: dict[str, float]) -> dict[str, float]:
    """Each arm against its baseline: ``X_b`` against ``X`` (the A/A), ``small_mlp`` for the
    file's other models (with and without the GC's collections); for ``MODEL@POLICY``, the
    mean of the nearest ``MODEL@none`` arms before and after it (A/B/A: drift cancels)."""
    found: dict[str, float] = {}
    keys = [k for k in figures if not k.endswith(("rows/batch", "without gc"))]
    for key in keys:
        transport, index, arm = key.split()
        model, _, policy = arm.partition("@")
        if not policy:
            base = model.removesuffix("_b") if model.endswith("_b") else "small_mlp"
            plain = [k for k in keys if k.startswith(f"{transport} ") and k.endswith(f" {base}")]
            if plain and model != base:
                found[f"{key} - {base}"] = figures[key] - figures[plain[0]]
                if f"{key} without gc" in figures:
                    found[f"{key} - {base} without gc"] = (
                        figures[f"{key} without gc"] - figures[f"{plain[0]} without gc"]
                    )
            continue
        if policy == "none":
            continue
        same = [k for k in keys if k.startswith(f"{transport} ") and k.endswith(f" {model}@none")]
        before = [k for k in same if int(k.split()[1]) < int(index)]
        after = [k for k in same if int(k.split()[1]) > int(index)]
        bases = [figures[k] for k in (before[-1:] + after[:1])]
        if bases:
            found[f"{key} - {model}@none"] = figures[key] - sum(bases) / len(bases)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="LABEL=PATH of a src/ folder")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--clients", type=int, default=1, help="connections, one request in flight each")
    parser.add_argument("--transports", default="http,grpc")
    parser.add_argument(
        "--arms",
        default=",".join(SMALL_ARMS),
        help="models in order; MODEL@POLICY (none, one, split) first sets that policy at run time",
    )
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    out_dir = OUT / f"count_routing-{time.strftime('%Y%m%dT%H%M%S')}"
    out_dir.mkdir()
    repo = out_dir / "models"
    repository(repo)
    shutil.rmtree(repo / "heavy_mlp")  # not measured here: a shorter start under valgrind
    for name in os.listdir(repo):
        if name not in SMALL_ARMS:
            shutil.rmtree(repo / name)
    for name in NO_BATCH:
        shutil.copytree(repo / "small_mlp" / "1", repo / name / "1")
        (repo / name / "config.yaml").write_text("batching:\n  max_batch_size: 0\n  max_queue_size: 1024\n")
    for config in repo.glob("*/config.yaml"):
        # Under valgrind the server runs ~50x slower: the automatic queue-wait target (two full
        # batches) would shed requests at --clients 64. Every arm gets the same setting.
        text = config.read_text().replace(
            "  max_queue_size: 1024\n", "  max_queue_size: 1024\n  max_queue_wait_ms: 600000\n"
        )
        config.write_text(text)
    trees = dict(item.split("=", 1) for item in args.tree)
    results = {
        label: measure(label, Path(src).resolve(), repo, args.calls, out_dir, args)
        for label, src in trees.items()
    }
    for figures in results.values():
        figures.update(differences(figures))
    write_report(out_dir / "count_routing.json", args, trees, results)


if __name__ == "__main__":
    main()
