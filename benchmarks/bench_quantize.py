"""``ortserve quantize`` tables for heavy_mlp and the hotword model.

heavy_mlp: FP16 and dynamic INT8 measured on random normal inputs, static INT8 calibrated on
256 of them (an .npz). hotword: the server's own traffic is captured first (a real server with
``--capture-dir``, 300 ``/v1/predict`` queries drawn from the corpus, each a word or a prefix
of one), then every method is measured, and static INT8 calibrated, on the feeds the pipeline
sends the model for those captured requests.

Usage: ``python benchmarks/bench_quantize.py``; writes benchmarks/out/quantize.json and prints
the tables.
"""

from __future__ import annotations

import csv
import json
import random
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from machine import stamp as machine_stamp

from ortserve.demo import write_demo_repository
from ortserve.quantization.convert import Method
from ortserve.quantization.quantizer import QuantizeJob, quantize
from ortserve.quantization.report import Measurement, format_table
from ortserve.testing import run_server

OUT = Path(__file__).parent / "out"
CORPUS = Path(__file__).parents[1] / "src" / "ortserve" / "apps" / "hotword" / "data" / "corpus.tsv"
NOW = 1_759_017_600_000
METHODS = (Method.FP16, Method.DYNAMIC_INT8, Method.STATIC_INT8)


def capture_hotword_traffic(root: Path, capture: Path, log: Path, count: int = 300) -> None:
    with CORPUS.open(encoding="utf-8") as handle:
        words = [row["word"] for row in csv.DictReader(handle, delimiter="\t")]
    rng = random.Random(0)
    args = ["--capture-dir", str(capture), "--capture-rate", "1.0", "--intra-op-threads", "1"]
    with run_server(root, log, args) as server:
        for _ in range(count):
            word = rng.choice(words)
            query = word[: rng.randint(2, len(word))] if len(word) > 2 else word
            body = json.dumps({"query": query, "timestamp": NOW}).encode()
            request = urllib.request.Request(f"{server.http_url}/v1/predict", body, method="POST")
            request.add_header("Content-Type", "application/json")
            with urllib.request.urlopen(request, timeout=10) as reply:
                reply.read()


def main() -> None:
    OUT.mkdir(exist_ok=True)
    results: dict[str, list[Measurement]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "models"
        write_demo_repository(root)
        for name in ("dispatch", "small_mlp"):
            shutil.rmtree(root / name)
        calibration = Path(scratch) / "heavy.npz"
        inputs = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)
        np.savez(calibration, input=inputs)
        results["heavy_mlp"] = quantize(QuantizeJob(root, "heavy_mlp", METHODS, calibration=calibration))
        capture = Path(scratch) / "capture"
        capture_hotword_traffic(root, capture, Path(scratch) / "server.log")
        results["hotword"] = quantize(QuantizeJob(root, "hotword", METHODS, calibration=capture))
    document = {**machine_stamp(), "models": {m: [r.as_dict() for r in rows] for m, rows in results.items()}}
    (OUT / "quantize.json").write_text(json.dumps(document, indent=2))
    for model, rows in results.items():
        print(f"\n{model}\n{format_table(rows)}")


if __name__ == "__main__":
    main()
