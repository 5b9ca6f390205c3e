"""Time to ready: from process start to the first 200 of /v2/health/ready, one small model.

Run from the repo root (on an otherwise idle core):
    taskset -c 0 .venv/bin/python benchmarks/bench_startup.py --runs 5
Prints the median and every run, with gRPC on (the default) and off (--grpc-port -1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from model_builders import write_scaled_version
from ortserve.testing import free_port


def time_to_ready(repository: Path, grpc: bool) -> float:
    port = free_port()
    args = [sys.executable, "-m", "ortserve", "serve", "--model-repository", str(repository)]
    args += [
        "--http-port",
        str(port),
        "--metrics-port",
        "-1",
        "--grpc-port",
        str(free_port()) if grpc else "-1",
    ]
    started = time.perf_counter()
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as reply:
                    if reply.status == 200:
                        return time.perf_counter() - started
            except (urllib.error.URLError, ConnectionError):
                pass
            if process.poll() is not None:
                raise RuntimeError("the server exited")
            time.sleep(0.005)
    finally:
        process.terminate()
        process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repository = Path(folder)
        write_scaled_version(repository, "small", 1, 2.0)
        result = {}
        for grpc in (True, False):
            runs = [time_to_ready(repository, grpc) for _ in range(args.runs)]
            result["grpc on" if grpc else "grpc off"] = {
                "median_s": round(statistics.median(runs), 3),
                "runs_s": [round(r, 3) for r in runs],
            }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
