"""Choosing the HTTP stack by measurement: the same routes and model under three servers.

ortserve's own HTTP/1.1 protocol (asyncio + httptools under uvloop), uvicorn (uvloop +
httptools) and granian (ASGI), each serving small_mlp through the same HttpApp via
``asgi_adapter.py``; server on CPU 0, wrk on CPU 1, median of ``--repeats`` runs.

    python benchmarks/bench_http_stack.py --seconds 6 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from wrk import run_wrk

from ortserve.demo import write_demo_repository
from ortserve.testing import free_port

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent


def command(stack: str, port: int, repo: Path) -> list[str]:
    if stack == "ortserve":
        return [
            str(BIN / "ortserve"),
            "serve",
            "--model-repository",
            str(repo),
            "--http-port",
            str(port),
            "--grpc-port",
            "-1",
            "--metrics-port",
            "-1",
            "--intra-op-threads",
            "1",
            "--log-level",
            "WARNING",
        ]
    if stack == "uvicorn":
        return [
            str(BIN / "uvicorn"),
            "asgi_adapter:app",
            "--port",
            str(port),
            "--loop",
            "uvloop",
            "--http",
            "httptools",
            "--no-access-log",
            "--log-level",
            "warning",
        ]
    return [
        str(BIN / "granian"),
        "--interface",
        "asgi",
        "--port",
        str(port),
        "--workers",
        "1",
        "--loop",
        "uvloop",
        "--no-ws",
        "--log-level",
        "warning",
        "asgi_adapter:app",
    ]


def wait_ready(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/small_mlp/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError("server did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    repo = HERE / "out" / "models"
    if not (repo / "small_mlp").exists():
        write_demo_repository(repo)
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.1] * 64}]}
    ).encode()
    rows = []
    for stack in ("ortserve", "uvicorn", "granian"):
        port = free_port()
        env = {**os.environ, "ORTSERVE_MODEL_REPOSITORY": str(repo.resolve())}
        process = subprocess.Popen(
            ["taskset", "-c", "0", *command(stack, port, repo.resolve())],
            cwd=HERE,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_ready(port)
            url = f"http://127.0.0.1:{port}"
            for concurrency in (1, 64):
                runs = [
                    run_wrk(url, "/v2/models/small_mlp/infer", body, concurrency, args.seconds)
                    for _ in range(args.repeats)
                ]
                rows.append(
                    (
                        stack,
                        concurrency,
                        statistics.median(r.requests_per_s for r in runs),
                        statistics.median(r.p50_ms for r in runs),
                        statistics.median(r.p99_ms for r in runs),
                        sum(r.errors for r in runs),
                    )
                )
                print(rows[-1], flush=True)
        finally:
            process.terminate()
            process.wait(30)
    print("\n| stack | concurrency | req/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|---|")
    for stack, concurrency, rate, p50, p99, errors in rows:
        print(f"| {stack} | {concurrency} | {rate:.0f} | {p50:.2f} | {p99:.2f} | {errors} |")


if __name__ == "__main__":
    main()
