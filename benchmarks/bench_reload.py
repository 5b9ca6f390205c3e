"""Reloads under load: 50 cycles of "a new version appears, the policy drops the old one".

The server (pinned to CPU 0) serves one model in poll mode with ``version_policy: latest``;
a closed-loop load of 16 connections (a process pinned to CPU 1) posts requests the whole
time. Each cycle writes version N+1 (model file, then the ``ortserve.complete`` marker: the
moment the version folder is complete), waits until the repository index shows N+1 READY and
N gone and the server's thread and fd counts are back to their baseline, then lets the load
run steady for a while. Reported per model:

- failed requests (any non-200 or transport error);
- p99 latency inside reload windows (marker written -> old version unloaded) vs outside;
- RSS after cycle 1 and after the last cycle; threads and fds after each cycle vs their
  baseline (read under the same load before the first reload);
- time from "version folder complete" to "serving" (p50 / max), including the poll wait.

Usage: ``python benchmarks/bench_reload.py [--cycles 50] [--models small_mlp heavy_mlp]``
Writes benchmarks/out/reload.json.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from multiprocessing.synchronize import Event
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp

from ortserve.demo import DEMO_MODELS, build_mlp
from ortserve.repository.snapshot import COMPLETE_MARKER
from ortserve.testing import ServerProcess, run_server

OUT = Path(__file__).parent / "out"
POLL_S = 0.2


def proc_counts(pid: int) -> tuple[float, int, int]:
    """RSS in MiB, threads, open fds of a process."""
    rss, threads = 0.0, 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, threads, len(os.listdir(f"/proc/{pid}/fd"))


Records = list[tuple[float, float, int]]


def load_worker(
    host: str, port: int, model: str, width: int, stop: Event, out: mp.Queue[tuple[Records, dict[int, str]]]
) -> None:
    """16 keep-alive connections in threads, closed loop; sends back (sent, latency, status)
    per request and the first answer's text for every status other than 200."""
    os.sched_setaffinity(0, {1})
    rng = np.random.default_rng(0)
    body = json.dumps(
        {
            "inputs": [
                {"name": "input", "shape": [1, width], "datatype": "FP32", "data": rng.random(width).tolist()}
            ]
        }
    ).encode()
    records: Records = []
    examples: dict[int, str] = {}
    lock = threading.Lock()

    def run() -> None:
        mine: Records = []
        connection = http.client.HTTPConnection(host, port, timeout=30)
        while not stop.is_set():
            sent = time.monotonic()
            try:
                connection.request(
                    "POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"}
                )
                reply = connection.getresponse()
                text = reply.read()
                status = reply.status
                if status != 200:
                    examples.setdefault(status, text[:300].decode(errors="replace"))
            except (OSError, http.client.HTTPException) as exc:
                status = 0
                examples.setdefault(0, repr(exc))
                connection.close()
                connection = http.client.HTTPConnection(host, port, timeout=30)
            mine.append((sent, time.monotonic() - sent, status))
        with lock:
            records.extend(mine)

    threads = [threading.Thread(target=run) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put((records, examples))


def index(server: ServerProcess, model: str) -> dict[str, str]:
    request = urllib.request.Request(f"{server.http_url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        rows = json.loads(reply.read())
    return {row["version"]: row["state"] for row in rows if row["name"] == model}


def wait_until(condition: object, timeout_s: float = 60.0) -> float:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("reload did not finish")
        time.sleep(0.01)
    return time.monotonic()


def run_model(model: str, cycles: int, steady_s: float) -> dict[str, object]:
    sizes, seed = DEMO_MODELS[model]
    files = [build_mlp(sizes, seed + k, model).SerializeToString() for k in range(2)]  # two weight sets
    root = Path(tempfile.mkdtemp(prefix="reload-"))
    (root / model).mkdir()
    (root / model / "config.yaml").write_text("version_policy: latest\nbatching:\n  max_batch_size: 32\n")
    (root / model / "1").mkdir()
    (root / model / "1" / "model.onnx").write_bytes(files[0])
    args = ["--model-control-mode", "poll", "--repository-poll-secs", str(POLL_S), "--grpc-port", "-1"]
    result: dict[str, object] = {"model": model}
    try:
        with run_server(root, root / "server.log", args, pin_cpu=0) as server:
            pid = _server_pid(server)
            stop = mp.Event()
            queue: mp.Queue[tuple[Records, dict[int, str]]] = mp.Queue()
            worker = mp.Process(
                target=load_worker, args=(server.host, server.http_port, model, sizes[0], stop, queue)
            )
            worker.start()
            time.sleep(steady_s)
            windows: list[tuple[float, float]] = []
            to_serving: list[float] = []
            after: list[tuple[float, int, int]] = []
            # Before any reload: version 1 serving under the same load. (Taken after cycle 1
            # instead, a count still settling then would make every later cycle "not back".)
            baseline = proc_counts(pid)
            try:
                for cycle in range(1, cycles + 1):
                    new = cycle + 1
                    folder = root / model / str(new)
                    folder.mkdir()
                    (folder / "model.onnx").write_bytes(files[cycle % 2])
                    (folder / COMPLETE_MARKER).touch()
                    complete = time.monotonic()
                    serving = wait_until(lambda n=new: index(server, model).get(str(n)) == "READY")
                    wait_until(lambda n=new: set(index(server, model)) == {str(n)})
                    shutil.rmtree(root / model / str(new - 1))
                    time.sleep(0.5)  # the same settle before every reading: the heap trim runs after a drain
                    with contextlib.suppress(TimeoutError):  # counted below, not fatal
                        wait_until(lambda b=baseline: proc_counts(pid)[1:] == b[1:], 10.0)
                    windows.append((complete, time.monotonic()))
                    to_serving.append(serving - complete)
                    after.append(proc_counts(pid))
                    time.sleep(steady_s)
            except BaseException:
                worker.terminate()  # never leave the load running behind a failed run
                raise
            finally:
                stop.set()
            records, examples = queue.get(timeout=120)
            worker.join(30)
            result.update(_summary(records, windows, to_serving, after, baseline))
            result["failure_examples"] = {str(code): text for code, text in sorted(examples.items())}
            result["failed_load_lines"] = server.log().count("failed to load")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return result


def _server_pid(server: ServerProcess) -> int:
    """The python process under taskset (taskset execs, so it is the same pid)."""
    return server.process.pid


def _summary(
    records: Records,
    windows: list[tuple[float, float]],
    to_serving: list[float],
    after: list[tuple[float, int, int]],
    baseline: tuple[float, int, int],
) -> dict[str, object]:
    starts = np.array([w[0] for w in windows])
    ends = np.array([w[1] for w in windows])
    sent = np.array([r[0] for r in records])
    latency = np.array([r[1] for r in records]) * 1e3
    status = np.array([r[2] for r in records])
    slot = np.searchsorted(starts, sent, side="right") - 1
    inside = (slot >= 0) & (sent <= ends[np.clip(slot, 0, None)])
    p99_in = float(np.percentile(latency[inside], 99)) if inside.any() else float("nan")
    p99_out = float(np.percentile(latency[~inside], 99))
    return {
        "requests": len(records),
        "failed": int((status != 200).sum()),
        "failed_in_reload_windows": int(((status != 200) & inside).sum()),
        "failed_by_status": {
            str(code): int((status == code).sum()) for code in sorted(set(status.tolist()) - {200})
        },
        "requests_in_reload_windows": int(inside.sum()),
        "p50_ms_steady": float(np.percentile(latency[~inside], 50)),
        "p99_ms_steady": p99_out,
        "p99_ms_reload": p99_in,
        "p99_ratio": p99_in / p99_out,
        "rss_mib_after_cycle_1": after[0][0],
        "rss_mib_after_last": after[-1][0],
        "rss_ratio": after[-1][0] / after[0][0],
        "rss_mib_before_cycle_1": baseline[0],
        "threads_baseline": baseline[1],
        "fds_baseline": baseline[2],
        "cycles_back_to_baseline": sum(1 for a in after if a[1:] == baseline[1:]),
        "cycles": len(after),
        "threads_fds_after_each_cycle": [list(a[1:]) for a in after],
        "time_to_serving_ms_p50": statistics.median(to_serving) * 1e3,
        "time_to_serving_ms_max": max(to_serving) * 1e3,
        "reload_window_ms_p50": statistics.median(ends - starts) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--steady", type=float, default=1.0, help="seconds of steady load between cycles")
    parser.add_argument("--models", nargs="+", default=["small_mlp", "heavy_mlp"])
    args = parser.parse_args()
    results = [run_model(model, args.cycles, args.steady) for model in args.models]
    for item in results:
        print(json.dumps(item), flush=True)
    OUT.mkdir(exist_ok=True)
    document = {**machine_stamp(), "args": vars(args), "poll_s": POLL_S, "results": results}
    (OUT / "reload.json").write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
