"""3,000 connections on small_mlp, two source trees side by side (issue 10): closed loop, 2 s
client timeout, the native generator, old and new server alternating each round.

Both servers run at once on CPU 0 (``--intra-op-threads 1``); the generator runs on CPU 1 and
loads one at a time. Per round and tree: answers/s, timeouts, 429s, server CPU per answer.
Medians over ``--rounds``. Writes benchmarks/out/ab_flood-<time>.json.

    .venv/bin/python benchmarks/ab_flood.py --old-src /tmp/base/src --seconds 8 --rounds 4
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_overload import OUT, closed_native, repository
from side_by_side import old_and_new, write_medians


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
    rounds: dict[str, list[dict]] = {"old": [], "new": []}
    with ExitStack() as stack:
        servers = old_and_new(stack, root, OUT, "ab-flood", server_args, args.old_src)
        for _ in range(args.rounds):
            for label, server in servers.items():
                print(label, end=" ", flush=True)
                rounds[label].append(
                    closed_native(server, "small_mlp", "http-json", args.connections, args.seconds)
                )
    keys = ("goodput", "timeouts", "server_cpu_us_per_answer", "admitted_p99_ms")
    write_medians(OUT, "ab_flood", rounds, keys, args=vars(args) | {"old_src": str(args.old_src)})


if __name__ == "__main__":
    main()
