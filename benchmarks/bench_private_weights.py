"""The cost of private weights: load time and RSS of a large external-data model, three ways.

- ``mmap``: ``InferenceSession(path)``: ONNX Runtime memory-maps the external-data file from the
  repository (what ortserve did before issue 27: a writer truncating the file killed the
  server with SIGBUS, an in-place write changed answers with ``prepack_weights: false``);
- ``copy``: the weights copied to a private file first (a folder only the server writes), and
  that copy memory-mapped;
- ``memory``: the bytes read once into memory and handed over with
  ``add_external_initializers_from_files_in_memory`` (ortserve now: ``core/model_files.py``;
  ONNX Runtime copies them into the session).

Each variant runs in a fresh process pinned to one CPU, ``--repeats`` times, with
``prepack_weights`` false (no kernel-layout copy: the case where mapping saved memory) and
then true. Reported per variant: median load seconds (session built, one run), peak RSS
(``VmHWM``) and RSS after load (``VmRSS``), and whether the file was still mapped.
Usage: ``python benchmarks/bench_private_weights.py --mib 1024 --repeats 3``; writes
benchmarks/out/private_weights.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp

OUT = Path(__file__).parent / "out"
_WIDTH = 4096


def build(folder: Path, mib: int) -> None:
    """A MatMul chain of 4096 x 4096 FP32 weights (64 MiB each), all in ``w.bin``."""
    layers = max(1, mib // 64)
    rng = np.random.default_rng(0)
    nodes, weights, current = [], [], "x"
    for index in range(layers):
        array = (rng.standard_normal((_WIDTH, _WIDTH), dtype=np.float32) * 0.01).astype(np.float32)
        weights.append(numpy_helper.from_array(array, f"w{index}"))
        out = "y" if index == layers - 1 else f"h{index}"
        nodes.append(helper.make_node("MatMul", [current, f"w{index}"], [out]))
        current = out
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", _WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", _WIDTH])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, location="w.bin")


_CHILD = r"""
import json, shutil, sys, tempfile, time
from pathlib import Path
import numpy as np
import onnxruntime as ort
mode, folder, prepack = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "1"
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
started = time.perf_counter()
options = ort.SessionOptions()
options.intra_op_num_threads = 1
if not prepack:
    options.add_session_config_entry("session.disable_prepacking", "1")
if mode == "mmap":
    session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
elif mode == "copy":
    private = Path(tempfile.mkdtemp(prefix="ortserve-weights-"))
    shutil.copyfile(folder / "w.bin", private / "w.bin")
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(private))
    graph = (folder / "model.onnx").read_bytes()
    session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
else:
    sys.path.insert(0, sys.argv[4])
    from ortserve.core.model_files import read_model_files
    files = read_model_files(folder / "model.onnx")
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    names = list(files.external)
    buffers = [files.external[n] for n in names]
    options.add_external_initializers_from_files_in_memory(names, buffers, [len(b) for b in buffers])
    session = ort.InferenceSession(files.graph, options, providers=["CPUExecutionProvider"])
    del files, buffers
session.run(None, {"x": np.ones((1, 4096), np.float32)})
seconds = time.perf_counter() - started
mapped = any("w.bin" in line for line in open("/proc/self/maps"))
print(json.dumps({"seconds": seconds, "peak_rss": status("VmHWM:"), "rss": status("VmRSS:"), "mapped": mapped}))
"""


def run(mode: str, folder: Path, prepack: bool, cpu: str) -> dict[str, float]:
    source = str(Path(__file__).parent.parent / "src")
    command = [
        "taskset",
        "-c",
        cpu,
        sys.executable,
        "-c",
        _CHILD,
        mode,
        str(folder),
        "1" if prepack else "0",
        source,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu", default="1")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-private-weights-"))
    try:
        build(root / "m" / "1", args.mib)
        folder = root / "m" / "1"
        size = (folder / "w.bin").stat().st_size
        rows = []
        for prepack in (False, True):
            for mode in ("mmap", "copy", "memory"):
                runs = [run(mode, folder, prepack, args.cpu) for _ in range(args.repeats)]
                row = {
                    "mode": mode,
                    "prepack": prepack,
                    "seconds": statistics.median(r["seconds"] for r in runs),
                    "peak_rss_mib": statistics.median(r["peak_rss"] for r in runs) / 2**20,
                    "rss_mib": statistics.median(r["rss"] for r in runs) / 2**20,
                    "mapped": all(bool(r["mapped"]) for r in runs),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
        OUT.mkdir(exist_ok=True)
        report = {"machine": machine_stamp(), "weights_bytes": size, "repeats": args.repeats, "rows": rows}
        (OUT / "private_weights.json").write_text(json.dumps(report, indent=2))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
