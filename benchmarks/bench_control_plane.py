"""Event-loop stall while the control plane parses the largest configuration it accepts.

A load request's configuration (Triton JSON, with YAML in its ``ortserve.*`` parameters) is
measured and parsed in a child process (``repository/override_parser.py``; before, in a worker
thread). This drives the parse and ``ModelControl.load`` in-process on a real lifecycle manager
while a ticker on the same loop sleeps 1 ms at a time, and reports the longest gap past 1 ms
(the stall every client would see): for the parse alone, in a worker thread and in the child
process, interleaved (thread, process, thread, ...), and for the whole load request (the parse
in the child, then a load the manager refuses: the inputs are not the graph's), next to the
idle loop's own overruns on this machine and the first parse (which starts the child). Two
configurations at the limits of ``config/bounded.py``: the most values (5,000 nodes of
``ortserve.inputs``), and the most bytes (256 KiB, long scalars). For comparison, the same
parse run directly on the loop (what the server did before issue 27).
Usage: ``python benchmarks/bench_control_plane.py --repeats 5``; writes
benchmarks/out/control_plane.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from machine import stamp as machine_stamp

from model_builders import scaled_model
from ortserve.config.bounded import DEFAULT_LIMITS, check_json, check_yaml
from ortserve.errors import OrtServeError
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.override_parser import OverrideParser, parse_override
from ortserve.repository.registry import ModelRegistry
from ortserve.repository.triton_config import parse_json_config
from ortserve.server.collector import freeze_startup_heap
from ortserve.server.model_control import ModelControl
from ortserve.settings import ServerSettings

OUT = Path(__file__).parent / "out"


def most_values() -> str:
    """``ortserve.inputs`` with as many entries as the node limit takes."""
    entries = []
    for index in range(10_000):
        entries.append(f"x{index:05d}: {{min: 0, max: 1}}")
        try:
            check_yaml("\n".join(entries), "probe")
        except OrtServeError:
            entries.pop()
            break
    return json.dumps({"parameters": {"ortserve.inputs": {"string_value": "\n".join(entries)}}})


def most_bytes() -> str:
    """``ortserve.inputs`` of long scalars, as close to the byte limit as the JSON allows."""
    scalar = "a" * (DEFAULT_LIMITS.max_scalar_chars - 16)
    lines = [f"k{i}: {{doc: {scalar}}}" for i in range(DEFAULT_LIMITS.max_bytes // len(scalar))]
    while lines:
        text = json.dumps({"parameters": {"ortserve.inputs": {"string_value": "\n".join(lines)}}})
        try:
            check_json(text, "probe")
            check_yaml("\n".join(lines), "probe")
            return text
        except OrtServeError:
            lines.pop()
    raise AssertionError("no configuration fits")


async def stall_during(work: Callable[[], Awaitable[object]]) -> float:
    """The longest a 1 ms sleep overran while ``work`` ran on the same loop (seconds)."""
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        while not done:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - before - 0.001)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    with contextlib.suppress(OrtServeError):  # inputs the graph lacks: refused after the parse
        await work()
    done = True
    await task
    return worst


async def measure(repeats: int) -> list[dict[str, object]]:
    root = Path(tempfile.mkdtemp(prefix="bench-control-"))
    (root / "m" / "1").mkdir(parents=True)
    onnx.save(scaled_model(1.0), str(root / "m" / "1" / "model.onnx"))
    manager = LifecycleManager(ModelRegistry(), ServerSettings(root, intra_op_threads=1))
    await manager.start()
    freeze_startup_heap()  # as the server does once started (server/collector.py)
    parser = OverrideParser()
    control = ModelControl(manager, "explicit", parser)
    rows: list[dict[str, object]] = []
    try:
        first = await stall_during(lambda: parser.parse(json.dumps({"max_batch_size": 4}), "m"))
        rows.append({"config": "first parse: the child process starts", "stall_ms": first * 1e3})
        print(json.dumps(rows[-1]), flush=True)
        idle = [await stall_during(lambda: asyncio.sleep(0.2)) for _ in range(repeats)]
        rows.append(
            {
                "config": "none (idle loop: the machine's noise floor)",
                "stall_ms": statistics.median(idle) * 1e3,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
        for name, text in (("most values", most_values()), ("most bytes", most_bytes())):
            # Interleaved, so both see the same machine: thread, process, thread, process, ...
            thread: list[float] = []
            process: list[float] = []
            for _ in range(repeats):
                thread.append(await stall_during(lambda t=text: asyncio.to_thread(parse_override, t, "m")))
                process.append(await stall_during(lambda t=text: parser.parse(t, "m")))
            whole = [await stall_during(lambda t=text: control.load("m", t)) for _ in range(repeats)]

            async def on_loop(t: str = text) -> None:
                check_json(t, "parameters.config")
                parse_json_config(t, "m")

            inline = [await stall_during(on_loop) for _ in range(repeats)]
            row = {
                "config": name,
                "bytes": len(text.encode()),
                "stall_ms_parse_in_thread": statistics.median(thread) * 1e3,
                "stall_ms_parse_in_thread_max": max(thread) * 1e3,
                "stall_ms_parse_in_process": statistics.median(process) * 1e3,
                "stall_ms_parse_in_process_max": max(process) * 1e3,
                "stall_ms_whole_load": statistics.median(whole) * 1e3,
                "stall_ms_whole_load_max": max(whole) * 1e3,
                "stall_ms_on_loop": statistics.median(inline) * 1e3,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        parser.close()
        await manager.close(5.0)
    return rows


def main() -> None:
    logging.disable(logging.CRITICAL)  # the refusals' log lines are not what is measured
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = asyncio.run(measure(args.repeats))
    OUT.mkdir(exist_ok=True)
    report = {"machine": machine_stamp(), "repeats": args.repeats, "rows": rows}
    (OUT / "control_plane.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
