"""3,000 connections on small_mlp, two source trees side by side (issue 10): closed loop, 2 s
client timeout, the native generator, old and new server alternating each round.

Both servers run at once on CPU 0 (``--intra-op-threads 1``); the generator runs on CPU 1 and
loads one at a time. Per round and tree: answers/s, timeouts, 429s, server CPU per answer.
Medians over ``--rounds``. Writes benchmarks/out/ab_flood-<time>.json.

    .venv/bin/python benchmarks/ab_flood.py --old-src /tmp/base/src --seconds 8 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_overload import OUT, closed_native, repository
from machine import stamp

from ortserve.testing import run_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-src", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--connections", type=int, default=3000)
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    root = repository(OUT / "ab-flood-models")
    server_args = ["--intra-op-threads", "1", "--metrics-port", "-1", "--log-level", "WARNING"]
    rows: dict[str, list[dict]] = {"old": [], "new": []}
    with ExitStack() as stack:
        servers = {
            "old": stack.enter_context(
                run_server(
                    root, OUT / "ab-flood-old.log", server_args, {"PYTHONPATH": str(args.old_src)}, pin_cpu=0
                )
            ),
            "new": stack.enter_context(run_server(root, OUT / "ab-flood-new.log", server_args, pin_cpu=0)),
        }
        for _ in range(args.rounds):
            for label, server in servers.items():
                print(label, end=" ", flush=True)
                rows[label].append(
                    closed_native(server, "small_mlp", "http-json", args.connections, args.seconds)
                )
    keys = ("goodput", "timeouts", "server_cpu_us_per_answer", "admitted_p99_ms")
    medians = {
        label: {k: statistics.median(float(r[k] or 0.0) for r in found) for k in keys}
        for label, found in rows.items()
    }
    report = {"machine": stamp(), "args": vars(args) | {"old_src": str(args.old_src)}, "rounds": rows}
    report["medians"] = medians
    path = OUT / f"ab_flood-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps(medians, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
