"""What the step graph costs at load: the version's load time (graph recovery, the second
session, the agreement check, warm-up) and the process's resident memory, with ``fuse_steps``
on and off, each in a fresh process, on bench_llm.py's 30.6M decoder in the genai layout.

Usage: ``python benchmarks/bench_llm_fused_load.py [--rounds 3]``; prints JSON (medians).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _child(folder: Path, fuse: bool) -> None:
    from ortserve.config.model import ModelConfig
    from ortserve.llm.loader import load_llm_version
    from ortserve.settings import ServerSettings

    async def load() -> dict[str, float]:
        config = ModelConfig.model_validate(
            {"kind": "llm", "intra_op_threads": 1, "llm": {"fuse_steps": fuse}}
        )
        before = _rss_mb()
        started = time.perf_counter()
        served = await load_llm_version(
            "m", 1, folder / "model.onnx", config, ServerSettings(model_repository=folder.parent.parent)
        )
        seconds = time.perf_counter() - started
        fused = served.engine.decoder.fused is not None
        after = _rss_mb()
        await served.unload(1.0)
        return {"load_s": seconds, "rss_added_mb": after - before, "fused": float(fused)}

    print(json.dumps(asyncio.run(load())))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(Path(args.child[0]), args.child[1] == "1")
        return
    from bench_llm import SHAPE

    from ortserve.llm.demo import train_tokenizer, write_llm_version
    from ortserve.llm.weights import DecoderShape, random_weights

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = train_tokenizer(["the quick brown fox jumps over the lazy dog " * 4], 400)
        shape = DecoderShape(tokenizer.get_vocab_size(), **SHAPE)  # type: ignore[arg-type]
        folder = Path(tmp) / "m" / "1"
        write_llm_version(folder, random_weights(shape, seed=0), tokenizer, layout="genai")
        runs: dict[str, list[dict[str, float]]] = {"fused": [], "separate": []}
        for _ in range(args.rounds):
            for name, flag in (("fused", "1"), ("separate", "0")):
                out = subprocess.run(
                    [sys.executable, __file__, "--child", str(folder), flag],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                runs[name].append(json.loads(out.strip().splitlines()[-1]))
    result = {
        name: {key: statistics.median(r[key] for r in rows) for key in rows[0]} for name, rows in runs.items()
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
