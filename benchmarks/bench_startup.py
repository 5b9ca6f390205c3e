"""Time to ready: from process start to the first 200 of /v2/health/ready, one small model.

Run from the repo root (on an otherwise idle core):
    taskset -c 0 .venv/bin/python benchmarks/bench_startup.py --runs 5
Prints, per arm, the median and every run of the wall time to ready and of the server's CPU
time (user + system, all its threads) at that moment; on a shared machine the CPU time is the
steadier figure. With gRPC on (the default) and off (--grpc-port -1) unless --grpc says which.

A/B: ``--src A=/path/to/old/src --src B=/path/to/new/src`` runs each arm with that PYTHONPATH,
the arms interleaved run by run (A, B, A, B, ...), so a change in the machine's load falls on both.
``--workers N`` times ``--workers N`` (the supervisor and its zygote-forked workers) instead.

Bytecode: an installed ortserve (``pip install``, the Docker image) has its modules compiled; a
checkout run with PYTHONDONTWRITEBYTECODE=1 compiles every module from source at each start
(about 40% of the start on this code). Each arm's sources are copied to a temporary folder and
compiled there (nothing written into the tree), unless ``--no-bytecode``. (PYTHONPYCACHEPREFIX
would not do: with it set, the installed packages' own caches are not read either.)
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
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from model_builders import write_scaled_version
from ortserve.testing import free_port

_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads, from /proc (children not counted)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def compiled(src: str | None, copy: Path) -> str:
    """An arm's sources copied to ``copy`` and compiled there; the PYTHONPATH that runs them."""
    shutil.copytree(src or Path(__file__).resolve().parent.parent / "src", copy)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(copy)], check=True)
    return str(copy)


def time_to_ready(repository: Path, grpc: bool, src: str | None, workers: int) -> tuple[float, float]:
    """Seconds from process start to the first ready 200, and the server's CPU seconds then."""
    port = free_port()
    args = [sys.executable, "-m", "ortserve", "serve", "--model-repository", str(repository)]
    args += ["--http-port", str(port), "--metrics-port", "-1"]
    args += ["--grpc-port", str(free_port()) if grpc else "-1"]
    if workers > 1:
        args += ["--workers", str(workers)]
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    log = tempfile.TemporaryFile()  # noqa: SIM115 (read back only when the server fails)
    started = time.perf_counter()
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as reply:
                    if reply.status == 200:
                        return time.perf_counter() - started, _cpu_seconds(process.pid)
            except (urllib.error.URLError, ConnectionError):
                pass
            if process.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"the server exited: {log.read().decode()[-2000:]}")
            time.sleep(0.005)
    finally:
        process.terminate()
        process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--src", action="append", default=[], help="NAME=PYTHONPATH (an arm; repeat)")
    parser.add_argument("--grpc", choices=("on", "off", "both"), default="both")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--no-bytecode", action="store_true", help="compile from source at each start")
    args = parser.parse_args()
    arms = [tuple(s.split("=", 1)) for s in args.src] or [("this tree", None)]
    grpcs = {"on": (True,), "off": (False,), "both": (True, False)}[args.grpc]
    with tempfile.TemporaryDirectory() as folder:
        repository = Path(folder) / "models"
        write_scaled_version(repository, "small", 1, 2.0)
        if not args.no_bytecode:
            arms = [(name, compiled(src, Path(folder) / f"src-{i}")) for i, (name, src) in enumerate(arms)]
        result: dict[str, object] = {"load average before": os.getloadavg()}
        for grpc in grpcs:
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in arms}
            for _ in range(args.runs):
                for name, src in arms:
                    runs[name].append(time_to_ready(repository, grpc, src, args.workers))
            for name, _ in arms:
                walls = [w for w, _ in runs[name]]
                cpus = [c for _, c in runs[name]]
                result[f"{name}, grpc {'on' if grpc else 'off'}"] = {
                    "wall median s": round(statistics.median(walls), 3),
                    "cpu median s": round(statistics.median(cpus), 3),
                    "wall runs s": [round(w, 3) for w in walls],
                    "cpu runs s": [round(c, 3) for c in cpus],
                }
        result["load average after"] = os.getloadavg()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
