"""heavy_mlp at c=16: tensors through system shared memory vs binary HTTP, in the same run.

The server runs pinned to CPU 0 (``--intra-op-threads 1``); this process is the load generator,
pinned to CPU 1: ``c`` keep-alive HTTP/1.1 connections on uvloop, closed loop, each sending
one pre-built request over and over. Both modes use this same generator, so its own cost is
alike for both:

- ``http_binary``: the input rows in the body (binary tensor extension), the output answered
  in binary after the JSON header;
- ``shared_memory``: a JSON header only; each connection has its own registered region whose
  first part holds the input and whose second part receives the output.

Each repeat runs the modes back to back (alternating which goes first), so noise hits both;
cells are medians of the repeats. Before measuring, one answer per mode is checked against
the other. Writes a JSON stamped with machine, versions and git revision under
benchmarks/out/ and prints a Markdown table.

    taskset -c 1 python benchmarks/bench_shared_memory.py --seconds 5 --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import timeit
import uuid
from contextlib import ExitStack
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_grpc import server_cpu_s
from machine import stamp as machine_stamp

from ortserve.core.shared_memory import SharedMemoryRegistry, write_output
from ortserve.core.types import InferOutput, InferResponse
from ortserve.demo import write_demo_repository
from ortserve.protocol.http_codec import decode_infer_request, encode_infer_response
from ortserve.protocol.tensors import TensorLimits
from ortserve.testing import ServerProcess, run_server

OUT = Path(__file__).parent / "out"
MODEL = "heavy_mlp"
IN_WIDTH, OUT_WIDTH = 512, 128
MODES = ("http_binary", "shared_memory")


def _http(path: str, body: bytes, header_length: int | None = None) -> bytes:
    extra = "" if header_length is None else f"Inference-Header-Content-Length: {header_length}\r\n"
    head = f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


def binary_body(rows: np.ndarray) -> tuple[bytes, int]:
    """The infer body with the rows in binary, and the length of its JSON header."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": list(rows.shape),
                    "parameters": {"binary_data_size": rows.nbytes},
                }
            ],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return header + rows.tobytes(), len(header)


def binary_request(rows: np.ndarray) -> bytes:
    return _http(f"/v2/models/{MODEL}/infer", *binary_body(rows))


def shared_memory_request(region: str, rows: np.ndarray) -> bytes:
    out_bytes = rows.shape[0] * OUT_WIDTH * 4
    document = {
        "inputs": [
            {
                "name": "input",
                "datatype": "FP32",
                "shape": list(rows.shape),
                "parameters": {"shared_memory_region": region, "shared_memory_byte_size": rows.nbytes},
            }
        ],
        "outputs": [
            {
                "name": "output",
                "parameters": {
                    "shared_memory_region": region,
                    "shared_memory_byte_size": out_bytes,
                    "shared_memory_offset": rows.nbytes,
                },
            }
        ],
    }
    return _http(f"/v2/models/{MODEL}/infer", json.dumps(document).encode())


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, bytes]:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return status, await reader.readexactly(length)


async def _client(
    server: ServerProcess, request: bytes, stop_at: float, latencies: list[float], errors: list[int]
) -> None:
    reader, writer = await asyncio.open_connection(server.host, server.http_port)
    clock = time.perf_counter
    try:
        while (start := clock()) < stop_at:
            status, _ = await _exchange(reader, writer, request)
            latencies.append(clock() - start)
            if status != 200:
                errors.append(status)
    finally:
        writer.close()


async def run_load(server: ServerProcess, requests: list[bytes], seconds: float) -> dict[str, float]:
    """One closed-loop run, one connection per request; req/s, latency percentiles, server CPU."""
    latencies: list[float] = []
    errors: list[int] = []
    cpu_before = server_cpu_s(server.process.pid)
    started = time.perf_counter()
    stop_at = started + seconds
    await asyncio.gather(*(_client(server, r, stop_at, latencies, errors) for r in requests))
    elapsed = time.perf_counter() - started
    cpu = server_cpu_s(server.process.pid) - cpu_before
    ms = np.percentile(np.array(latencies) * 1e3, [50, 90, 99])
    return {
        "requests_per_s": len(latencies) / elapsed,
        "p50_ms": float(ms[0]),
        "p90_ms": float(ms[1]),
        "p99_ms": float(ms[2]),
        "errors": float(len(errors)),
        "server_cpu_ms": 1e3 * cpu / max(1, len(latencies)),
    }


async def _one(server: ServerProcess, request: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection(server.host, server.http_port)
    try:
        return await _exchange(reader, writer, request)
    finally:
        writer.close()


async def check_modes_agree(
    server: ServerProcess, binary: bytes, shared: bytes, block: shared_memory.SharedMemory, rows: np.ndarray
) -> None:
    """The output written into shared memory equals the binary HTTP answer."""
    status, body = await _one(server, binary)
    assert status == 200, body
    header = json.loads(body[: body.index(b"}]}") + 3])
    wire = np.frombuffer(body[-rows.shape[0] * OUT_WIDTH * 4 :], np.float32)
    assert header["outputs"][0]["parameters"]["binary_data_size"] == wire.nbytes
    status, body = await _one(server, shared)
    assert status == 200, body
    written = np.frombuffer(block.buf[rows.nbytes : rows.nbytes + wire.nbytes], np.float32)
    assert np.array_equal(written, wire), "shared-memory output differs from the binary answer"


async def register(server: ServerProcess, name: str, key: str, size: int) -> None:
    body = json.dumps({"key": key, "offset": 0, "byte_size": size}).encode()
    status, answer = await _one(server, _http(f"/v2/systemsharedmemory/region/{name}/register", body))
    assert status == 200, answer


async def measure(server: ServerProcess, args: argparse.Namespace, rows_count: int) -> dict[str, object]:
    rows = np.random.default_rng(1).standard_normal((rows_count, IN_WIDTH)).astype(np.float32)
    size = rows.nbytes + rows_count * OUT_WIDTH * 4
    with ExitStack() as stack:
        blocks = []
        for index in range(args.concurrency):
            block = shared_memory.SharedMemory(f"ortserve-bench-{uuid.uuid4().hex}", create=True, size=size)
            stack.callback(block.unlink)
            stack.callback(block.close)
            np.ndarray(rows.shape, np.float32, block.buf)[:] = rows
            await register(server, f"c{rows_count}-{index}", "/" + block.name.lstrip("/"), size)
            blocks.append(block)
        loads = {
            "http_binary": [binary_request(rows)] * args.concurrency,
            "shared_memory": [
                shared_memory_request(f"c{rows_count}-{i}", rows) for i in range(args.concurrency)
            ],
        }
        await check_modes_agree(server, loads["http_binary"][0], loads["shared_memory"][0], blocks[0], rows)
        await run_load(server, loads["http_binary"], 1.0)  # warm-up
        runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for repeat in range(args.repeats):
            order = MODES if repeat % 2 == 0 else MODES[::-1]
            for mode in order:
                runs[mode].append(await run_load(server, loads[mode], args.seconds))
        await _one(server, _http("/v2/systemsharedmemory/unregister", b""))
    ratios = [
        s["requests_per_s"] / b["requests_per_s"] for s, b in zip(runs["shared_memory"], runs["http_binary"])
    ]
    return {
        "rows": rows_count,
        "ratio_median": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "request_body_bytes": {mode: len(loads[mode][0]) for mode in MODES},
        "median": {
            mode: {k: statistics.median(r[k] for r in runs[mode]) for k in runs[mode][0]} for mode in MODES
        },
        "runs": runs,
    }


def codec_costs(rows: np.ndarray, repeats: int = 7, number: int = 2000) -> dict[str, float]:
    """Server-side wire work per request, in-process (microseconds, best of ``repeats``).

    Decode the request, find (shared memory) the output's window and write the output there,
    and encode an answer of the heavy MLP's output size: the part of a request that differs
    between the modes (the model run and the socket are the rest; the future that chains the
    write to the answer, a few microseconds, is left out).
    """
    out = np.zeros((rows.shape[0], OUT_WIDTH), np.float32)
    limits = TensorLimits()
    block = shared_memory.SharedMemory(f"ortserve-codec-{uuid.uuid4().hex}", create=True, size=1 << 20)
    registry = SharedMemoryRegistry(1)
    try:
        registry.register("r", "/" + block.name.lstrip("/"), 0, 1 << 20)
        np.ndarray(rows.shape, np.float32, block.buf)[:] = rows
        binary, header = binary_body(rows)
        shared = shared_memory_request("r", rows).split(b"\r\n\r\n", 1)[1]

        def binary_path() -> None:
            request = decode_infer_request(binary, header, MODEL, None, limits)
            output = InferOutput("output", "FP32", out.shape, out, request.outputs[0].parameters)  # type: ignore[index]
            encode_infer_response(InferResponse(MODEL, "1", [output]), True)

        def shared_path() -> None:
            request = decode_infer_request(shared, None, MODEL, None, limits, registry)
            targets = registry.output_targets(request.outputs or [])
            assert targets is not None
            output = InferOutput("output", "FP32", out.shape, out, request.outputs[0].parameters)  # type: ignore[index]
            output.parameters = write_output(output, targets["output"])
            encode_infer_response(InferResponse(MODEL, "1", [output]), False)

        costs = {}
        for name, path in (
            ("http_binary", binary_path),
            ("shared_memory", shared_path),
        ):
            costs[name] = 1e6 * min(timeit.repeat(path, number=number, repeat=repeats)) / number
        return costs
    finally:
        registry.close()
        block.close()
        block.unlink()


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    report: dict[str, object] = {
        **machine_stamp(),
        "model": MODEL,
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "repeats": args.repeats,
        "server_cpu": 0,
        "load_cpu": sorted(os.sched_getaffinity(0)),
        "intra_op_threads": 1,
    }
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        write_demo_repository(repo)
        server_args = ["--intra-op-threads", "1", "--metrics-port", "-1", "--grpc-port", "-1"]
        server_args += ["--shared-memory-regions", str(2 * args.concurrency)]
        with run_server(repo, OUT / "server-shm.log", server_args, pin_cpu=0) as server:
            report["cells"] = [await measure(server, args, rows) for rows in args.rows]
    return report


def print_table(report: dict[str, object]) -> None:
    print(f"\n{report['date']} | {report['cpu']} | ORT {report['onnxruntime']} | git {report['git']}")
    print(
        "\n| rows | mode | body bytes | req/s | x binary: median of pairs (range) | p50 ms | p90 ms "
        "| p99 ms | server CPU ms/req | codec us/req | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for cell in report["cells"]:  # type: ignore[attr-defined]
        low, high = cell["ratio_range"]
        for mode in MODES:
            m = cell["median"][mode]
            ratio = "1.00" if mode == "http_binary" else f"{cell['ratio_median']:.2f} ({low:.2f}-{high:.2f})"
            print(
                f"| {cell['rows']} | {mode} | {cell['request_body_bytes'][mode]} | {m['requests_per_s']:.0f} "
                f"| {ratio} | {m['p50_ms']:.2f} | {m['p90_ms']:.2f} | {m['p99_ms']:.2f} "
                f"| {m['server_cpu_ms']:.3f} | {cell['codec_us'][mode]:.1f} | {m['errors']:.0f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    try:
        import uvloop

        report = uvloop.run(main_async(args))
    except ImportError:
        report = asyncio.run(main_async(args))
    for cell in report["cells"]:  # type: ignore[attr-defined]
        rows = np.zeros((cell["rows"], IN_WIDTH), np.float32)
        cell["codec_us"] = codec_costs(rows)
    (OUT / f"shared-memory-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(report, indent=1))
    print_table(report)


if __name__ == "__main__":
    main()
