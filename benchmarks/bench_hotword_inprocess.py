"""The hotword pipeline in process: parse, retrieval, features, the ranker (one ORT thread),
postprocess; microseconds per request, median of 5 rounds of 240 requests.

Run it once per source tree to compare (a before/after worktree on PYTHONPATH, each with its own
freshly written demo model), alternating, pinned to one core:

    PYTHONPATH=/tmp/before/src taskset -c 1 python benchmarks/bench_hotword_inprocess.py MODELS/hotword/1 before
    PYTHONPATH=src taskset -c 1 python benchmarks/bench_hotword_inprocess.py MODELS/hotword/1 after
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import onnxruntime as ort

from ortserve.apps.hotword.pipeline import HotwordPipeline
from ortserve.apps.hotword.training import OUTPUT
from ortserve.pipeline.contract import JsonObject, PipelineContext

QUERIES = [
    "国庆旅游攻略",
    "天气",
    "世界杯",
    "火锅",
    "房价",
    "高考",
    "春运火车票",
    "天气预报",
    "iphone",
    "机票",
    "北京天气",
    "演唱会",
]


def main(version_dir: Path, label: str) -> None:
    pipeline = HotwordPipeline(PipelineContext("hotword", "1", version_dir))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        str(version_dir / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )

    def one(query: str) -> JsonObject:
        prepared = pipeline.parse({"query": query, "region_id": 110000, "timestamp": 1759017600000})
        calls = pipeline.preprocess(prepared)
        outputs = [{OUTPUT: session.run(None, dict(call.inputs))[0]} for call in calls]
        return pipeline.postprocess(outputs, prepared)

    for query in QUERIES:
        one(query)
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(20):
            for query in QUERIES:
                one(query)
        rounds.append((time.perf_counter() - start) / (20 * len(QUERIES)) * 1e6)
    print(f"{label}: {statistics.median(rounds):.1f} us per request (rounds: {[round(r) for r in rounds]})")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "")
