"""Instructions per gRPC call, counted by valgrind's callgrind: a figure machine noise cannot move.

For each source tree (``LABEL=PATH/src``), a server runs under ``valgrind --tool=callgrind
--instr-atstart=no`` (pinned to CPU 0, one intra-op thread); callgrind counts nothing until
``callgrind_control -i on``. h2load (CPU 1) then sends a fixed number of sequential calls
(c=1) of each kind, empty ServerLive calls (the transport alone) and small_mlp ModelInfer
calls, twice: ``--calls`` and ``2 * --calls``. Instructions per call is the difference of the
two counts over ``--calls``, so what each run pays once (h2load's connection, its SETTINGS,
the first call's caches) drops out. A third segment counts the idle server for as long as the
longer run took: timers that tick whatever the load, shown so that they can be seen to be
negligible. Each dump is kept, for ``callgrind_annotate`` by function.

    python benchmarks/count_grpc.py --tree A=/tmp/a/src --tree B=src --calls 400

Writes JSON under benchmarks/out/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_grpc import INFER, LIVE, WIDTHS, grpc_request
from h2load import GRPC_HEADERS, grpc_frame
from machine import stamp as machine_stamp

from ortserve.demo import write_demo_repository
from ortserve.testing import ServerProcess, free_port

OUT = Path(__file__).parent / "out"
MODEL = "small_mlp"


def h2load_calls(url: str, body: bytes, calls: int, concurrency: int = 1) -> float:
    """Send ``calls`` calls over ``concurrency`` streams of one connection (1: sequential);
    returns the seconds they took."""
    with tempfile.NamedTemporaryFile(prefix="count-grpc-", suffix=".bin") as file:
        file.write(body)
        file.flush()
        command = ["taskset", "-c", "1", "h2load", "-t1", "-c1", f"-m{concurrency}", f"-n{calls}"]
        command += ["-d", file.name, *(arg for header in GRPC_HEADERS for arg in ("-H", header))]
        started = time.monotonic()
        done = subprocess.run([*command, url], capture_output=True, text=True, check=True, timeout=1800)
        elapsed = time.monotonic() - started
    match = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", done.stdout)
    if match is None or int(match.group(2)) != calls:
        raise RuntimeError(f"h2load did not complete {calls} calls:\n{done.stdout}")
    return elapsed


def control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, check=True, timeout=300)


def counted(pid: int, out_dir: Path, name: str, work: Callable[[], None]) -> int:
    """Instructions the server executed while ``work()`` ran (callgrind dump ``name``)."""
    before = set(out_dir.glob(f"callgrind.out.{pid}*"))
    control(pid, "-z")
    control(pid, "-i", "on")
    work()
    control(pid, "-i", "off")
    control(pid, "-d", name)
    for _ in range(600):
        new = set(out_dir.glob(f"callgrind.out.{pid}*")) - before
        if new:
            path = new.pop()
            time.sleep(0.5)  # the dump is written in one go, but let it finish
            target = out_dir / f"{name}.callgrind"
            path.rename(target)
            return _total_ir(target)
        time.sleep(0.1)
    raise TimeoutError(f"no callgrind dump for {name}")


def _total_ir(path: Path) -> int:
    for line in reversed(path.read_text(errors="replace").splitlines()):
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def count_kind(pid: int, out_dir: Path, name: str, url: str, body: bytes, calls: int) -> dict[str, float]:
    """Instructions of ``calls`` and ``2 * calls`` calls, their difference per call, and the
    idle server's over as long as the longer run took."""
    took: list[float] = []

    def send(n: int) -> None:
        took.append(h2load_calls(url, body, n))

    first = counted(pid, out_dir, f"{name}-{calls}", lambda: send(calls))
    second = counted(pid, out_dir, f"{name}-{2 * calls}", lambda: send(2 * calls))
    idle = counted(pid, out_dir, f"{name}-idle", lambda: time.sleep(max(took)))
    return {
        f"{name}_ir_per_call": (second - first) / calls,
        f"{name}_ir_{calls}": first,
        f"{name}_ir_{2 * calls}": second,
        f"{name}_idle_ir": idle,
        f"{name}_seconds_{2 * calls}": max(took),
    }


@contextlib.contextmanager
def callgrind_server(
    label: str, src: Path, repo: Path, out_dir: Path
) -> Iterator[tuple[subprocess.Popen[bytes], ServerProcess]]:
    """``ortserve serve`` from ``src`` under callgrind on CPU 0, instrumentation off until a
    count turns it on (``counted``); ready when yielded, stopped on exit."""
    http_port, grpc_port = free_port(), free_port()
    command = [
        *("taskset", "-c", "0", "valgrind", "--tool=callgrind", "--instr-atstart=no"),
        f"--callgrind-out-file={out_dir}/callgrind.out.%p",
        *(sys.executable, "-m", "ortserve", "serve", "--model-repository", str(repo)),
        *("--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", "-1"),
        *("--intra-op-threads", "1", "--log-level", "WARNING"),
    ]
    env = {**os.environ, "PYTHONPATH": str(src), "ORTSERVE_SHUTDOWN_DELAY": "0"}
    log_path = out_dir / f"{label}-server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        server = ServerProcess(process, "127.0.0.1", http_port, grpc_port, -1, log_path)
        try:
            server.wait_ready(900)
            yield process, server
        finally:
            process.terminate()
            try:
                process.wait(120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def measure_tree(label: str, src: Path, repo: Path, calls: int, out_dir: Path) -> dict[str, float]:
    with callgrind_server(label, src, repo, out_dir) as (process, server):
        result: dict[str, float] = {}
        for kind, path, body in (
            ("live", LIVE, grpc_frame(b"")),
            ("infer", INFER, grpc_request(MODEL, WIDTHS[MODEL])),
        ):
            url = f"http://{server.grpc_address}{path}"
            h2load_calls(url, body, 50)  # warm: first-call caches, the cost model's timings
            result |= count_kind(process.pid, out_dir, f"{label}-{kind}", url, body, calls)
            print(
                label,
                kind,
                f"{result[f'{label}-{kind}_ir_per_call']:,.0f} instructions per call",
                flush=True,
            )
        return result


def count_in_process(label: str, src: Path, calls: int, batch: int, out_dir: Path) -> float:
    """Instructions per ServerLive call of the transport alone (``grpc_inprocess.py``, no
    sockets and no event loop), from whole-process counts of ``calls`` and ``2 * calls``."""
    totals = []
    for n in (calls, 2 * calls):
        out = out_dir / f"{label}-inprocess-b{batch}-{n}.callgrind"
        command = [
            *("taskset", "-c", "0", "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"),
            *(sys.executable, str(Path(__file__).parent / "grpc_inprocess.py")),
            *(f"--calls={n}", f"--batch={batch}", "--repeat=1"),
        ]
        env = {**os.environ, "PYTHONPATH": str(src)}
        subprocess.run(command, capture_output=True, check=True, env=env, timeout=1800)
        totals.append(_total_ir(out))
    per_call = (totals[1] - totals[0]) / calls
    print(label, f"in process, {batch} per read: {per_call:,.0f} instructions per call", flush=True)
    return per_call


def write_report(path: Path, args: argparse.Namespace, trees: object, results: dict[str, Any]) -> None:
    """The counts with the machine and the command that made them, beside the callgrind dumps."""
    report = {"machine": machine_stamp(), "args": vars(args), "trees": trees, "results": results}
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps(results, indent=2))
    print(f"wrote {path} (callgrind dumps beside it)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="LABEL=PATH of a src/ folder")
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument(
        "--in-process", type=int, default=0, help="also count grpc_inprocess.py with this many calls"
    )
    parser.add_argument("--no-server", action="store_true", help="only the in-process counts")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    demo = OUT / "count-grpc-demo"
    write_demo_repository(demo)
    repo = OUT / "count-grpc-models"  # the one model measured: a shorter start under valgrind
    if not (repo / MODEL).exists():
        shutil.copytree(demo / MODEL, repo / MODEL)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out_dir = OUT / f"count_grpc-{stamp}"
    out_dir.mkdir()
    trees = dict(item.split("=", 1) for item in args.tree)
    results: dict[str, dict[str, float]] = {label: {} for label in trees}
    for label, src in trees.items():
        if args.in_process:
            for batch in (1, 64):
                key = f"inprocess_b{batch}_ir_per_call"
                results[label][key] = count_in_process(
                    label, Path(src).resolve(), args.in_process, batch, out_dir
                )
        if not args.no_server:
            results[label] |= measure_tree(label, Path(src).resolve(), repo, args.calls, out_dir)
    write_report(out_dir / "count_grpc.json", args, trees, results)


if __name__ == "__main__":
    main()
