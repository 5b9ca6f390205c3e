"""What ``--capture-dir`` costs the server: the same closed-loop load with capture off, at 1% and at 100%.

Three servers of the demo small MLP share core 0 (only the one under load is busy);
``ortserve bench`` on core 1 loads each in turn, for several rounds; medians are printed
and a JSON stamped with versions and machine is written.

    .venv/bin/python benchmarks/capture_overhead.py --rounds 3 --seconds 4 --concurrency 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

from ortserve.demo import DEMO_MODELS, build_mlp
from ortserve.loadtest.report import environment_stamp
from ortserve.testing import ServerProcess, free_port

SETTINGS = {"off": [], "1%": ["--capture-rate", "0.01"], "100%": ["--capture-rate", "1.0"]}


def _serve(root: Path, name: str, extra: list[str]) -> ServerProcess:
    port = free_port()
    if extra:
        extra = [*extra, "--capture-dir", str(root / f"capture-{name.rstrip('%')}")]
    args = [
        "taskset", "-c", "0", sys.executable, "-m", "ortserve", "serve", "--model-repository",
        str(root / "models"), "--http-port", str(port), "--grpc-port", "-1", "--metrics-port", "-1",
        "--intra-op-threads", "1", "--log-level", "WARNING", *extra,
    ]  # fmt: skip
    log = root / f"server-{name.rstrip('%')}.log"
    process = subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    return ServerProcess(process, "127.0.0.1", port, -1, -1, log)


def _bench(url: str, concurrency: int, seconds: float, out: Path) -> dict[str, float]:
    args = [
        "taskset", "-c", "1", sys.executable, "-m", "ortserve", "bench", url, "-m", "small_mlp",
        "-c", str(concurrency), "-d", str(seconds), "--warmup", "1", "--no-progress", "-o", str(out),
    ]  # fmt: skip
    subprocess.run(args, check=True, capture_output=True)
    summary = json.loads(out.read_text())["levels"][0]["summary"]
    return {
        "rate": summary["achieved_rate"],
        "p50_ms": summary["latency_ms"]["p50"],
        "p99_ms": summary["latency_ms"]["p99"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/capture_overhead.json"))
    options = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        sizes, seed = DEMO_MODELS["small_mlp"]
        (root / "models" / "small_mlp" / "1").mkdir(parents=True)
        onnx.save(
            build_mlp(sizes, seed, "small_mlp"), str(root / "models" / "small_mlp" / "1" / "model.onnx")
        )
        servers = {name: _serve(root, name, extra) for name, extra in SETTINGS.items()}
        try:
            for server in servers.values():
                server.wait_ready()
            for round_index in range(options.rounds):
                names = list(SETTINGS)[round_index % 3 :] + list(SETTINGS)[: round_index % 3]
                for name in names:
                    run = _bench(
                        servers[name].http_url, options.concurrency, options.seconds, root / "b.json"
                    )
                    runs[name].append(run)
                    print(f"round {round_index + 1} capture {name:>4}: {run}", file=sys.stderr)
        finally:
            for server in servers.values():
                server.stop()
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    document = {
        "benchmark": "capture_overhead",
        "environment": environment_stamp(),
        "settings": vars(options) | {"out": str(options.out)},
        "runs": runs,
        "medians": medians,
    }
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(document, indent=2))
    print("| capture | requests/s | vs off | p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for name, m in medians.items():
        print(
            f"| {name} | {m['rate']:,.0f} | {m['rate'] / medians['off']['rate']:.2f} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} |"
        )


if __name__ == "__main__":
    main()
