"""What compressing an infer answer costs and saves, by size: the basis of COMPRESS_MIN_BYTES.

Compresses JSON infer answers of FP32 outputs (the shape ortserve writes) with the server's own
code path (server/http/encoding.py, gzip level 1), in process, and prints per size the bytes
saved and the microseconds spent (median of repeats).

    taskset -c 1 .venv/bin/python benchmarks/bench_compress.py
"""

from __future__ import annotations

import statistics
import time
import zlib

import numpy as np
import orjson

from ortserve.server.http.encoding import COMPRESS_MIN_BYTES


def answer(values: int) -> bytes:
    data = np.random.default_rng(0).standard_normal(values).astype(np.float32)
    output = {"name": "output", "datatype": "FP32", "shape": [1, values], "data": data.tolist()}
    return orjson.dumps({"model_name": "m", "model_version": "1", "outputs": [output]})


def gzip_level_1(body: bytes) -> bytes:
    """What encoding.py does to an answer it compresses (level 1, gzip wrapper)."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return compressor.compress(body) + compressor.flush()


def main() -> None:
    print("| answer bytes | gzip bytes | saved | us to compress (median) | compressed by the server |")
    print("|---|---|---|---|---|")
    for values in (4, 16, 64, 256, 4096, 65536):
        body = answer(values)
        times = []
        compressed = b""
        for _ in range(200 if values < 4096 else 30):
            start = time.perf_counter()
            compressed = gzip_level_1(body)
            times.append(time.perf_counter() - start)
        saved = len(body) - len(compressed)
        served = "yes" if len(body) >= COMPRESS_MIN_BYTES else "no"
        median_us = statistics.median(times) * 1e6
        print(f"| {len(body)} | {len(compressed)} | {saved} | {median_us:.1f} | {served} |")


if __name__ == "__main__":
    main()
