"""The device data path on the CPU: session.run against ortserve's IOBinding path, side by side.

Per demo model and batch size, the median over N calls (three interleaved rounds, the median
round reported) of ``session.run``, ``BindingRun`` (arena inputs and preallocated outputs, one
copy back) and a bare IOBinding whose outputs ONNX Runtime allocates. One ORT thread.

``--runner``: the server's own call instead, ``OrtRunner.run_blocking`` as a CPU session runs
it today (``session.run``) against the same runner forced onto the binding path
(``bind_on=DeviceSpec("cpu")``), at batch 1 (what c=1 gives the scheduler) and batch 64 (what
c=64 gives it with max_batch_size 64), interleaved A/B/A'.

    taskset -c 1 python benchmarks/bench_binding.py
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ortserve.core.binding import BindingRun, DeviceSpec
from ortserve.core.runner import OrtRunner
from ortserve.demo import write_demo_repository


def _median_us(call: Callable[[], object], n: int) -> float:
    call()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _bare_binding(session: ort.InferenceSession, name: str, x: np.ndarray, out: str) -> object:
    binding = session.io_binding()
    binding.bind_cpu_input(name, x)
    binding.bind_output(out, "cpu")
    session.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()


def runner_rows() -> None:
    """Today's server call against the binding path, A/B/A' per round, three rounds."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_demo_repository(root)
        for name, batches, n in (("small_mlp", (1, 64), 3000), ("heavy_mlp", (1, 64), 100)):
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.inter_op_num_threads = 1
            path = next((root / name).glob("*/model.onnx"))
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            today = OrtRunner(session, 1, "today")
            bound = OrtRunner(session, 1, "bound", bind_on=DeviceSpec("cpu"))
            arg = session.get_inputs()[0]
            try:
                for rows in batches:
                    x = np.random.default_rng(rows).random((rows, int(arg.shape[1])), dtype=np.float32)
                    feeds = {arg.name: x}
                    rounds = [
                        (
                            _median_us(partial(today.run_blocking, feeds), n),
                            _median_us(partial(bound.run_blocking, feeds), n),
                            _median_us(partial(today.run_blocking, feeds), n),
                        )
                        for _ in range(3)
                    ]
                    a, b, a2 = (statistics.median(r[i] for r in rounds) for i in range(3))
                    print(
                        f"runner {name} batch {rows}: session.run A {a:.1f} us, A' {a2:.1f} us "
                        f"(A/A' {a2 / a:.3f}), bound {b:.1f} us ({b / ((a + a2) / 2):.3f}x)"
                    )
            finally:
                today.close()
                bound.close()


def main() -> None:
    import sys

    if "--runner" in sys.argv:
        runner_rows()
        return
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_demo_repository(root)
        for name, batches, n in (("small_mlp", (1, 8, 64), 3000), ("heavy_mlp", (1, 32), 150)):
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.inter_op_num_threads = 1
            path = next((root / name).glob("*/model.onnx"))
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            arg, out = session.get_inputs()[0], session.get_outputs()[0].name
            bound = BindingRun(session, [out], DeviceSpec("cpu"))
            for rows in batches:
                x = np.random.default_rng(rows).random((rows, int(arg.shape[1])), dtype=np.float32)
                feeds = {arg.name: x}

                plain = partial(session.run, [out], feeds)
                arena_run = partial(bound, feeds)
                fresh_run = partial(_bare_binding, session, arg.name, x, out)
                rounds = [
                    (_median_us(plain, n), _median_us(arena_run, n), _median_us(fresh_run, n))
                    for _ in range(3)
                ]
                run, arena, fresh = (statistics.median(r[i] for r in rounds) for i in range(3))
                print(
                    f"{name} batch {rows}: session.run {run:.1f} us, BindingRun {arena:.1f} us "
                    f"({arena / run:.3f}x), IOBinding with ORT-allocated outputs {fresh:.1f} us ({fresh / run:.3f}x)"
                )


if __name__ == "__main__":
    main()
