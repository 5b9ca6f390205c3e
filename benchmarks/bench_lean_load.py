"""Loading a >= 200 MB model whose weights live in an ONNX external-data file.

Each variant runs in a fresh process (pinned to one CPU) so peak RSS is its own:

- ``plain``: ``onnxruntime.InferenceSession(path)`` with default options (the baseline);
- ``ortserve``: ortserve's loader as it is (session + warm-up), default ``prepack_weights``;
- ``ortserve-lean``: the same with ``prepack_weights: false`` (weights stay the file's
  memory-mapped pages).

Reported: time from "version folder complete" to ready (session built and warmed up), peak
and steady RSS, and the median run time at 1 and 32 rows (what prepacking buys).
Usage: ``python benchmarks/bench_lean_load.py [--layers 4 --width 4096]``; writes
benchmarks/out/lean_load.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp

OUT = Path(__file__).parent / "out"


def build(folder: Path, layers: int, width: int) -> int:
    """A MatMul chain [-1, width] -> [-1, width], weights in one external file; returns bytes."""
    rng = np.random.default_rng(0)
    nodes, weights, current = [], [], "x"
    for index in range(layers):
        weights.append(
            numpy_helper.from_array(
                (rng.standard_normal((width, width)) * 0.01).astype(np.float32), f"w{index}"
            )
        )
        out = "y" if index == layers - 1 else f"h{index}"
        nodes.append(helper.make_node("MatMul", [current, f"w{index}"], [out]))
        current = out
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    version = folder / "big" / "1"
    version.mkdir(parents=True)
    onnx.save(
        model,
        str(version / "model.onnx"),
        save_as_external_data=True,
        location="weights.bin",
        size_threshold=1024,
    )
    return (version / "weights.bin").stat().st_size


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_variant(root: Path, variant: str, width: int) -> dict[str, float]:
    """In this (fresh) process: load, then time runs."""
    import onnxruntime as ort

    started = time.perf_counter()
    if variant == "plain":
        session = ort.InferenceSession(
            str(root / "big" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
        )
        run = lambda feeds: session.run(None, feeds)  # noqa: E731
    else:
        from ortserve.config.model import ModelConfig
        from ortserve.repository.loader import load_version
        from ortserve.settings import ServerSettings

        config = ModelConfig(prepack_weights=variant != "ortserve-lean", warmup_batch_sizes=[1])
        settings = ServerSettings(root, intra_op_threads=1)

        async def load() -> object:
            served = await load_version("big", 1, root / "big" / "1" / "model.onnx", config, settings)
            return served.runner

        runner = asyncio.run(load())
        run = lambda feeds: runner.run_blocking(feeds)  # type: ignore[attr-defined]  # noqa: E731
    ready_s = time.perf_counter() - started
    result = {"ready_s": ready_s, "rss_mib_after_load": rss_mib()}
    for rows in (1, 32):
        feeds = {"x": np.ones((rows, width), np.float32)}
        run(feeds)
        times = []
        for _ in range(7):
            begin = time.perf_counter()
            run(feeds)
            times.append(time.perf_counter() - begin)
        result[f"run_ms_{rows}_rows"] = sorted(times)[3] * 1e3
    result["rss_mib_steady"] = rss_mib()
    result["rss_mib_peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("ROOT", "VARIANT"), help=argparse.SUPPRESS)
    parser.add_argument("--build", metavar="ROOT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_variant(Path(args.child[0]), args.child[1], args.width)))
        return
    if args.build:
        print(build(Path(args.build), args.layers, args.width))
        return
    with tempfile.TemporaryDirectory() as tmp:
        # Built in a child: a child's peak RSS starts at its parent's, so the parent stays small.
        sizes = ["--layers", str(args.layers), "--width", str(args.width)]
        built = subprocess.run(
            [sys.executable, __file__, *sizes, "--build", tmp], check=True, capture_output=True
        )
        size = int(built.stdout.decode().split()[-1])
        results: dict[str, list[dict[str, float]]] = {}
        for _ in range(args.repeats):
            for variant in ("plain", "ortserve", "ortserve-lean"):
                command = [
                    "taskset",
                    "-c",
                    "0",
                    sys.executable,
                    __file__,
                    "--width",
                    str(args.width),
                    "--child",
                    tmp,
                    variant,
                ]
                output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
                results.setdefault(variant, []).append(json.loads(output.strip().splitlines()[-1]))
    medians = {v: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for v, rs in results.items()}
    for variant, figures in medians.items():
        print(variant, json.dumps({k: round(v, 3) for k, v in figures.items()}))
    OUT.mkdir(exist_ok=True)
    document = {
        **machine_stamp(),
        "weights_bytes": size,
        "args": vars(args),
        "medians": medians,
        "runs": results,
    }
    (OUT / "lean_load.json").write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
