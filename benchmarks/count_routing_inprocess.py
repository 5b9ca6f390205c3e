"""Instructions per ``DataPlane.refusal`` + ``DataPlane.submit`` that routing adds, in process.

The transports' two routing calls, nothing else: a real :class:`ModelRegistry` and
:class:`RoutingTable`, versions that only create the answer's future (no decode, no queue, no
ONNX Runtime), so the difference between a model with a policy and one without is the
decision and its accounting alone. With ``--count`` it runs itself
under callgrind, instrumentation off except while each model serves ``--calls N`` and then ``2N``
requests; instructions per request are the difference of the two counts over ``N``, so what a
segment pays once (the controls themselves) drops out.

    PYTHONPATH=src python benchmarks/count_routing_inprocess.py --count --calls 5000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ortserve.config.model import ModelConfig
from ortserve.config.routing import RoutingConfig
from ortserve.core.dataplane import DataPlane
from ortserve.core.model import ModelState, VersionInfo
from ortserve.core.types import InferInput, InferRequest, ServerMetadata
from ortserve.repository.registry import ModelRegistry
from ortserve.routing.table import RoutingTable
from ortserve.server.http.messages import HttpRequest

POLICIES = {
    "plain": None,
    "one": {"split": {"1": 100}, "sticky": {"parameter": "user_id"}},
    "routed": {"split": {"1": 70, "2": 30}, "sticky": {"parameter": "user_id"}},
}


class _Instant:
    """A served version that admits everything and only creates the answer's future."""

    def __init__(self, version: str) -> None:
        self.info = VersionInfo("m", version, (), (), 8, ("cpu",))
        self.state = ModelState.READY
        self.ready = True

    def refusal(self, priority: int = 0) -> None:
        return None

    def submit(self, request: object) -> asyncio.Future[object]:
        return asyncio.get_running_loop().create_future()


def build() -> DataPlane:
    registry = ModelRegistry()
    for name, policy in POLICIES.items():
        for version in ("1", "2") if name == "routed" else ("1",):
            registry.publish(name, int(version), _Instant(version), 0.0)  # type: ignore[arg-type]
        if policy is not None:
            registry.entry(name).config = ModelConfig(routing=RoutingConfig.model_validate(policy))
    table = RoutingTable(registry, time.monotonic)
    table.sync()
    plane = DataPlane(registry, ServerMetadata("b", "0", ()))
    plane.routers = table.routers
    return plane


async def run(plane: DataPlane, model: str, calls: int) -> None:
    x = np.zeros((1, 64), dtype=np.float32)
    parameters = [{"user_id": f"user-{i}"} for i in range(1000)]
    # The HTTP transport's header lookup, over the headers h2load sends: the policy reads two.
    received = {b"host": b"127.0.0.1", b"user-agent": b"h2load", b"content-type": b"application/json"}
    headers = HttpRequest("POST", f"/v2/models/{model}/infer", "", received, b"").text_header
    for i in range(calls):
        plane.refusal(model, None, priority=1)
        request = InferRequest(
            model,
            [InferInput("input", "FP32", (1, 64), x)],
            parameters=parameters[i % 1000],
            headers=headers,
        )
        plane.submit(request).set_result(None)
        if i % 64 == 63:
            await asyncio.sleep(0)  # the done callbacks run, as between the loop's reads
    await asyncio.sleep(0)


def _control(*args: str) -> None:
    command = ["callgrind_control", *args, str(os.getpid())]
    subprocess.run(command, check=True, capture_output=True, timeout=300)


def _segment(plane: DataPlane, model: str, calls: int, out: Path) -> int:
    """Instructions of ``calls`` requests: callgrind counts only between the two controls."""
    before = set(out.parent.glob(f"{out.name}.*"))
    _control("-z")
    _control("-i", "on")
    asyncio.run(run(plane, model, calls))
    _control("-i", "off")
    _control("-d", f"{model}-{calls}")
    for _ in range(600):
        new = set(out.parent.glob(f"{out.name}.*")) - before
        if new:
            time.sleep(0.5)
            text = new.pop().read_text(errors="replace")
            return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("totals:"))
        time.sleep(0.1)
    raise TimeoutError("no callgrind dump")


def counted(calls: int, models: list[str], out: Path) -> dict[str, float]:
    """Inside callgrind: each model's instructions per request (``2N`` minus ``N``, over ``N``)."""
    plane = build()
    figures: dict[str, float] = {}
    for model in models:
        asyncio.run(run(plane, model, 500))  # warm: first-call caches
        first, second = _segment(plane, model, calls, out), _segment(plane, model, 2 * calls, out)
        figures[model] = (second - first) / calls
    for model in models:
        if model != "plain" and "plain" in figures:
            figures[f"{model} - plain"] = figures[model] - figures["plain"]
    return figures


def count(calls: int, models: list[str]) -> dict[str, float]:
    """Run this script under callgrind (instrumentation off until each timed segment)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "callgrind.out"
        command = ["taskset", "-c", os.environ.get("COUNT_CPU", "0"), "valgrind", "--tool=callgrind"]
        command += ["--instr-atstart=no", f"--callgrind-out-file={out}", sys.executable, __file__]
        command += ["--inside", str(out), "--calls", str(calls), "--models", ",".join(models)]
        done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=1800)
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=tuple(POLICIES))
    parser.add_argument("--calls", type=int, default=5_000)
    parser.add_argument("--count", action="store_true", help="count every model under callgrind")
    parser.add_argument("--models", default=",".join(POLICIES))
    parser.add_argument("--inside", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside is not None:
        print(json.dumps(counted(args.calls, args.models.split(","), args.inside)))
    elif args.count:
        figures = count(args.calls, args.models.split(","))
        for name, value in figures.items():
            print(f"{name:<16} {value:>10,.0f} instructions per request")
    elif args.model is not None:
        asyncio.run(run(build(), args.model, args.calls))
    else:
        parser.error("--model, or --count")


if __name__ == "__main__":
    main()
