"""What open status pages cost a loaded server: throughput at c=64 with and without N pages
polling /v2/status.json once a second, alternated A/B/A/B, plus the document's own CPU cost.

Run from the repo root (two cores: the server on CPU 0, load and pollers on CPU 1):
    .venv/bin/python benchmarks/bench_status_page.py --rounds 3 --duration 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from ortserve.demo import write_demo_repository
from ortserve.testing import run_server


def pollers(url: str, pages: int, stop: threading.Event) -> list[threading.Thread]:
    def poll() -> None:
        while not stop.wait(1.0):
            with urllib.request.urlopen(url, timeout=10) as reply:
                reply.read()

    threads = [threading.Thread(target=poll, daemon=True) for _ in range(pages)]
    for thread in threads:
        thread.start()
    return threads


def bench(base: str, duration: float, out: Path) -> float:
    command = [sys.executable, "-m", "ortserve", "bench", base, "-m", "small_mlp", "-c", "64"]
    command += ["-d", str(duration), "--warmup", "1", "-o", str(out), "--no-progress"]
    subprocess.run(["taskset", "-c", "1", *command], check=True, capture_output=True)
    level = json.loads(out.read_text())["levels"][0]
    return float(level["summary"]["achieved_rate"])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--pages", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_demo_repository(root / "models")
        with run_server(
            root / "models", root / "server.log", ["--intra-op-threads", "1"], pin_cpu=0
        ) as server:
            status_url = f"{server.http_url}/v2/status.json"
            results: dict[str, list[float]] = {"off": [], "on": []}
            for _ in range(args.rounds):
                for mode in ("off", "on"):
                    stop = threading.Event()
                    threads = pollers(status_url, args.pages, stop) if mode == "on" else []
                    results[mode].append(bench(server.http_url, args.duration, root / "bench.json"))
                    stop.set()
                    for thread in threads:
                        thread.join()
            before, started = cpu_seconds(server.process.pid), time.monotonic()
            time.sleep(10)  # idle, no page open: the baseline
            baseline = (cpu_seconds(server.process.pid) - before) / (time.monotonic() - started)
            before, started = cpu_seconds(server.process.pid), time.monotonic()
            documents = 0
            while time.monotonic() - started < 10:  # idle server, 10 pages polling once a second
                with urllib.request.urlopen(status_url, timeout=10) as reply:
                    reply.read()
                documents += 1
                time.sleep(0.1)
            idle_cpu = (cpu_seconds(server.process.pid) - before) / (time.monotonic() - started)
    off, on = statistics.median(results["off"]), statistics.median(results["on"])
    print(
        json.dumps(
            {
                "throughput_rps": results,
                "median_off": off,
                "median_on": on,
                "lost_percent": round(100 * (off - on) / off, 2),
                "idle_server_cpu_share_no_page": round(baseline, 4),
                "idle_server_cpu_share_10_pages": round(idle_cpu, 4),
                "documents_requested": documents,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
