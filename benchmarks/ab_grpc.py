"""gRPC A/B of two source trees in one run: ModelInfer (small_mlp or heavy_mlp) and empty
ServerLive calls at c=1 (p50) and c=64 (req/s).

Both servers run at once, pinned to CPU 0 with one intra-op thread; h2load runs on CPU 1 and
loads them alternately (old, new, old, new, ...), so the machine's noise hits both alike; the
server's CPU time per call is reported too, which a busy machine disturbs less than rates.
"old" is the ``--old-src`` tree (a ``src/`` folder, e.g. from ``git worktree add /tmp/base
main``), "new" the installed package. Cells are medians over ``--rounds``. Writes JSON under
benchmarks/out/.

    python benchmarks/ab_grpc.py --old-src /tmp/base/src --seconds 4 --rounds 5 [--model heavy_mlp]
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
from bench_grpc import INFER, LIVE, WIDTHS, grpc_request, server_cpu_s
from h2load import grpc_frame, run_h2load
from machine import stamp as machine_stamp
from side_by_side import old_and_new

from ortserve.demo import write_demo_repository

OUT = Path(__file__).parent / "out"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-src", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", choices=sorted(WIDTHS), default="small_mlp")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    repo = OUT / "ab-grpc-models"
    write_demo_repository(repo)
    payload = grpc_request(args.model, WIDTHS[args.model])
    server_args = ["--intra-op-threads", "1", "--metrics-port", "-1", "--log-level", "WARNING"]
    runs: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    with ExitStack() as stack:
        servers = old_and_new(stack, repo, OUT, "ab-grpc", server_args, args.old_src)
        for server in servers.values():  # warm both
            run_h2load(f"http://{server.grpc_address}{INFER}", payload, 16, 1.0)
        for _ in range(args.rounds):
            for label, server in servers.items():
                url = f"http://{server.grpc_address}{INFER}"
                pid = server.process.pid
                cpu = server_cpu_s(pid)
                c1 = run_h2load(url, payload, 1, args.seconds)
                cpu_c1 = server_cpu_s(pid) - cpu
                c64 = run_h2load(url, payload, 64, args.seconds)
                cpu_c64 = server_cpu_s(pid) - cpu - cpu_c1
                cells = runs[label]
                # Server CPU per call (warm-up included in both): steadier than rates on a busy machine.
                cells.setdefault("c1_cpu_us_per_call", []).append(1e6 * cpu_c1 / max(1, c1.completed))
                cells.setdefault("c64_cpu_us_per_call", []).append(1e6 * cpu_c64 / max(1, c64.completed))
                cells.setdefault("c1_p50_ms", []).append(c1.p50_ms)
                cells.setdefault("c1_req_s", []).append(c1.requests_per_s)
                cells.setdefault("c64_req_s", []).append(c64.requests_per_s)
                cells.setdefault("c64_p50_ms", []).append(c64.p50_ms)
                # ServerLive (no model): the transport alone, free of the runner's inline-or-thread
                # choice, which the cost model makes from timings a busy machine disturbs.
                live_url = f"http://{server.grpc_address}{LIVE}"
                cpu = server_cpu_s(pid)
                live1 = run_h2load(live_url, grpc_frame(b""), 1, args.seconds)
                cpu_live1 = server_cpu_s(pid) - cpu
                live64 = run_h2load(live_url, grpc_frame(b""), 64, args.seconds)
                cells.setdefault("live_c1_p50_ms", []).append(live1.p50_ms)
                cells.setdefault("live_c1_cpu_us_per_call", []).append(
                    1e6 * cpu_live1 / max(1, live1.completed)
                )
                cells.setdefault("live_c64_req_s", []).append(live64.requests_per_s)
                errors = c1.http_errors + c64.http_errors + live1.http_errors + live64.http_errors
                print(
                    label,
                    f"c1 p50 {c1.p50_ms:.3f} ms",
                    f"c64 {c64.requests_per_s:.0f} req/s",
                    f"cpu/call c1 {cells['c1_cpu_us_per_call'][-1]:.0f} us c64 {cells['c64_cpu_us_per_call'][-1]:.0f} us",
                    f"live c1 p50 {live1.p50_ms:.3f} ms cpu {cells['live_c1_cpu_us_per_call'][-1]:.0f} us",
                    f"live c64 {live64.requests_per_s:.0f} req/s",
                    f"errors {errors}",
                )
    medians = {label: {k: statistics.median(v) for k, v in cells.items()} for label, cells in runs.items()}
    ratios = {k: medians["new"][k] / medians["old"][k] for k in medians["old"]}
    report = {"machine": machine_stamp(), "args": vars(args) | {"old_src": str(args.old_src)}}
    report |= {"runs": runs, "medians": medians, "new_over_old": ratios}
    path = OUT / f"ab_grpc-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps({"medians": medians, "new_over_old": ratios}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
