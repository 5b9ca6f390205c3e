"""How many requests/s ``ortserve bench`` drives from one core, beside wrk, in the same run.

The demo small MLP is served on core 0 (``--intra-op-threads 1``); each generator runs on
core 1 with the same concurrency and body, alternating, for several rounds. Each generator's
CPU time (from ``wait4``) divided by its wall time says how busy its core was; requests/s
divided by that is what one core of that generator could drive. Medians are reported, and a
JSON file stamped with versions, machine and settings is written.

    .venv/bin/python benchmarks/loadgen_efficiency.py --rounds 3 --seconds 5 --concurrency 16
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

from ortserve.demo import DEMO_MODELS, build_mlp
from ortserve.loadtest.inputs import InputSpec, generated_payloads, infer_path
from ortserve.loadtest.report import environment_stamp
from ortserve.testing import ServerProcess, free_port

POST_LUA = Path(__file__).with_name("post.lua")
PATH = infer_path("small_mlp", None)


def _serve(root: Path) -> ServerProcess:
    sizes, seed = DEMO_MODELS["small_mlp"]
    (root / "models" / "small_mlp" / "1").mkdir(parents=True)
    onnx.save(build_mlp(sizes, seed, "small_mlp"), str(root / "models" / "small_mlp" / "1" / "model.onnx"))
    port = free_port()
    args = [
        "taskset", "-c", "0", sys.executable, "-m", "ortserve", "serve",
        "--model-repository", str(root / "models"), "--http-port", str(port),
        "--grpc-port", "-1", "--metrics-port", "-1", "--no-metrics", "--intra-op-threads", "1",
        "--log-level", "WARNING",
    ]  # fmt: skip
    log = root / "server.log"
    process = subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    server = ServerProcess(process, "127.0.0.1", port, -1, -1, log)
    server.wait_ready()
    return server


def _timed(args: list[str], env: dict[str, str] | None = None) -> tuple[str, float]:
    """Run a command to completion; its output and the CPU seconds it used."""
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )
    assert process.stdout is not None
    output = process.stdout.read().decode()
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{args[3]} failed:\n{output}")
    return output, usage.ru_utime + usage.ru_stime


def _ortserve(url: str, concurrency: int, seconds: float, out: Path) -> dict[str, float]:
    args = [
        "taskset", "-c", "1", sys.executable, "-m", "ortserve", "bench", url, "-m", "small_mlp",
        "-c", str(concurrency), "-d", str(seconds), "--warmup", "1", "--no-progress", "-o", str(out),
    ]  # fmt: skip
    _timed(args)
    summary = json.loads(out.read_text())["levels"][0]["summary"]
    # The generator's own CPU during the level (imports and start-up excluded).
    cores = summary["generator_cpu_cores"]
    return {"rate": summary["achieved_rate"], "cores": cores, "p99_ms": summary["latency_ms"]["p99"]}


def _wrk(url: str, concurrency: int, seconds: float, body: Path) -> dict[str, float]:
    args = [
        "taskset", "-c", "1", "wrk", "-t1", f"-c{concurrency}", f"-d{seconds:g}s", "--latency",
        "-s", str(POST_LUA), url + PATH,
    ]  # fmt: skip
    output, cpu = _timed(args, {"BODY": str(body), "URL_PATH": PATH})
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    p99 = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)", output, re.M)
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    p99_ms = float(p99.group(1)) * scale[p99.group(2)] if p99 else float("nan")
    return {"rate": rate, "cores": cpu / seconds, "p99_ms": p99_ms}


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    figures = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    figures["per_core_rate"] = statistics.median(run["rate"] / max(run["cores"], 1e-6) for run in runs)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/loadgen_efficiency.json"))
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        server = _serve(root)
        try:
            body = root / "body.json"
            payload = generated_payloads([InputSpec("input", "FP32", (-1, 64))], PATH, "json", count=1)[0]
            body.write_bytes(payload.body)
            runs: dict[str, list[dict[str, float]]] = {"ortserve bench": [], "wrk": []}
            for round_index in range(options.rounds):
                order = ["ortserve bench", "wrk"] if round_index % 2 == 0 else ["wrk", "ortserve bench"]
                for tool in order:
                    if tool == "wrk":
                        run = _wrk(server.http_url, options.concurrency, options.seconds, body)
                    else:
                        run = _ortserve(
                            server.http_url, options.concurrency, options.seconds, root / "b.json"
                        )
                    runs[tool].append(run)
                    print(f"round {round_index + 1} {tool:>15}: {run}", file=sys.stderr)
        finally:
            server.stop()
    medians = {tool: _median(tool_runs) for tool, tool_runs in runs.items()}
    document = {
        "benchmark": "loadgen_efficiency",
        "environment": environment_stamp(),
        "settings": vars(options) | {"out": str(options.out), "server_cpu": 0, "generator_cpu": 1},
        "runs": runs,
        "medians": medians,
        "rate_ratio_ortserve_to_wrk": medians["ortserve bench"]["rate"] / medians["wrk"]["rate"],
    }
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(document, indent=2))
    print(
        "| generator (core 1) | requests/s achieved | generator core busy | requests/s per busy core | p99 ms |"
    )
    print("|---|---|---|---|---|")
    for tool, m in medians.items():
        print(
            f"| {tool} | {m['rate']:,.0f} | {m['cores']:.0%} | {m['per_core_rate']:,.0f} | {m['p99_ms']:.2f} |"
        )
    print(f"\nratio of achieved rates, ortserve bench / wrk: {document['rate_ratio_ortserve_to_wrk']:.2f}")


if __name__ == "__main__":
    main()
