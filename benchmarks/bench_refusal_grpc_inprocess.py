"""A gRPC refusal's CPU inside the server process, without sockets (issue 30, item 4): what one
HTTP/2 connection spends on one refused unary ModelInfer call, beside a floor.

One :class:`~ortserve.server.grpc.connection.Http2Connection` with a transport that only
counts writes, the real :class:`~ortserve.server.grpc.service.InferenceService` over a data
plane that refuses every request (the kept verdict of an overloaded model), and
``data_received`` fed reads of ``--per-read`` whole calls (HEADERS + DATA, as
``benchmarks/openloop`` sends them: literal header fields, a small_mlp-sized message); CPU time
of the thread per call. Arms:

- ``connection``: the connection as it is (whatever path its refusals take);
- ``engine``: the floor: the sans-IO engine alone parses the same frames and answers each
  stream with one canned trailers-only block (no call, no verdict).

A third figure, ``reset``: each call's RST_STREAM follows it in the same read (a client that
gave up while the call sat unread, as at 1,600 connections behind a 5 s deadline). And two
served arms, a model that answers at once (no ONNX Runtime): ``served`` with the loop's run
queue (admitted calls run after the reads), ``served-inline`` without one (run inside the
read, as before): what deferring an admitted call costs.

Run it against another source tree with PYTHONPATH=<tree>/src. Syscalls and the loop are not in
these figures.

    taskset -c 1 .venv/bin/python benchmarks/bench_refusal_grpc_inprocess.py --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).parent))

import machine

from ortserve.core.dataplane import DataPlane
from ortserve.core.model import ModelState, VersionInfo
from ortserve.core.types import InferOutput, InferRequest, InferResponse, ServerMetadata, TensorSpec
from ortserve.errors import Overloaded
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.protocol.tensors import TensorLimits
from ortserve.server.connections import ByteBudget, ConnectionSet
from ortserve.server.grpc.connection import Http2Connection
from ortserve.server.grpc.errors import StatusCode
from ortserve.server.grpc.headers import request_head, trailers_only
from ortserve.server.grpc.inflate import Inflater
from ortserve.server.grpc.options import GrpcOptions
from ortserve.server.grpc.service import InferenceService
from ortserve.server.http.run_queue import RunQueue
from ortserve.server.http2.engine import Http2Engine
from ortserve.server.http2.events import RequestReceived
from ortserve.statistics import ServerStatistics
from ortserve.telemetry import Telemetry

OUT = Path(__file__).parent / "out"
PATH = b"/inference.GRPCInferenceService/ModelInfer"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream_id) + payload


def _literal(index: int, value: bytes, prefix: int = 4) -> bytes:
    """A literal field without indexing whose name is static entry ``index``."""
    head = bytes((index,)) if index < (1 << prefix) - 1 else bytes(((1 << prefix) - 1, index - 15))
    return head + bytes((len(value),)) + value


BLOCK = (
    b"\x83\x86"  # :method POST, :scheme http
    + _literal(4, PATH)
    + _literal(1, b"127.0.0.1:8001")
    + _literal(31, b"application/grpc")
    + b"\x00\x02te\x08trailers"
)
MESSAGE = pb.ModelInferRequest(
    model_name="small_mlp",
    inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[1, 64])],
    raw_input_contents=[bytes(256)],
).SerializeToString()
FRAMED = b"\x00" + struct.pack(">I", len(MESSAGE)) + MESSAGE


OPENING = (
    PREFACE
    + _frame(4, 0, 0, struct.pack(">HI", 4, 0x7FFF_FFFF))  # SETTINGS: stream windows wide open
    + _frame(8, 0, 0, struct.pack(">I", 0x7FFF_FFFF - 65535))  # and the connection's
)
"""What a client sends first: its windows wide open, so answers never wait for a window."""


def calls(first: int, count: int, reset: bool) -> bytes:
    """``count`` whole unary calls on streams ``first``, ``first + 2``, ...; each followed by
    its RST_STREAM (CANCEL) when ``reset``."""
    out = []
    for n in range(count):
        stream_id = first + 2 * n
        out.append(_frame(1, 0x4, stream_id, BLOCK))
        out.append(_frame(0, 0x1, stream_id, FRAMED))
        if reset:
            out.append(_frame(3, 0, stream_id, struct.pack(">I", 8)))
    return b"".join(out)


class Plane:
    """Refuses every request (the kept verdict of an overloaded model)."""

    error = Overloaded(
        "about 9.0 ms of waiting ahead, more than the 0.2 ms queue-wait target", retry_after_s=1
    )

    def refusal(self, name: str, version: str | None, priority: int, tenant_of: Any = None) -> Overloaded:
        return self.error


SPEC = TensorSpec("input", "FP32", (-1, 64))


class Answering:
    """A model that answers every request at once with its input (the serving path's Python
    work without ONNX Runtime)."""

    info = VersionInfo("small_mlp", "1", (SPEC,), (SPEC,), 32, ("CPUExecutionProvider",))
    state = ModelState.READY
    ready = True

    def refusal(self, priority: int = 0) -> None:
        return None

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        data = request.inputs[0].data
        answer: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
        answer.set_result(
            InferResponse("small_mlp", "1", [InferOutput("input", "FP32", data.shape, data)], request.id)
        )
        return answer


class OneModel:
    def __init__(self) -> None:
        self.model = Answering()

    def resolve(self, name: str, version: str | None) -> Any:
        return self.model

    def served_versions(self, name: str) -> tuple[str, ...]:
        return ("1",)

    @property
    def all_ready(self) -> bool:
        return True


class Counting:
    """A transport that counts writes."""

    def __init__(self) -> None:
        self.writes = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes += 1

    def writelines(self, pieces: list[bytes]) -> None:
        self.writes += 1

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


class EngineFloor:
    """The engine alone, one canned trailers-only block per stream."""

    def __init__(self) -> None:
        self.engine: Http2Engine[Any] = Http2Engine(OPTIONS.engine(), request_head, time.monotonic)
        self.engine.initiate()
        self.block = trailers_only(StatusCode.RESOURCE_EXHAUSTED, "overloaded")
        self.writes = 0

    def data_received(self, data: bytes) -> None:
        engine = self.engine
        for event in engine.receive_data(data):
            if isinstance(event, RequestReceived):
                engine.send_headers(event.stream_id, self.block, True)
        if engine.data_to_send():
            self.writes += 1


OPTIONS = GrpcOptions(
    max_message_bytes=4 << 20, keepalive_time_s=7200, keepalive_timeout_s=20, max_concurrent_streams=100
)


def protocol(arm: str, loop: asyncio.AbstractEventLoop) -> tuple[Any, Any]:
    if arm == "engine":
        floor = EngineFloor()
        return floor, floor
    served = arm.startswith("served")
    plane = DataPlane(OneModel(), ServerMetadata("ortserve", "0", ())) if served else cast(DataPlane, Plane())
    service = InferenceService(plane, TensorLimits(), Telemetry(ServerStatistics()))
    wire = Counting()
    extra: tuple[Any, ...] = (RunQueue(loop),) if arm == "served" else ()
    made = Http2Connection(
        service.routes(), OPTIONS, ConnectionSet(), loop, Inflater(loop), ByteBudget(1 << 40), *extra
    )
    made.connection_made(cast(asyncio.Transport, wire))
    return made, wire


PER_CONNECTION = 1000
"""Calls per connection: under the engine's stream-reset budget (a burst of 2,000), so the
``reset`` arm measures resets a real client's deadlines make, not a rapid-reset flood."""


async def one_round(arms: list[str], count: int, per_read: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    result = {}
    for arm in arms:
        reset = arm.endswith("reset")
        made = []
        for _ in range(0, count, PER_CONNECTION):
            connection, wire = protocol(arm.removesuffix("+reset"), loop)
            connection.data_received(OPENING)
            made.append((connection, wire))
        reads = [calls(1 + 2 * n, per_read, reset) for n in range(0, PER_CONNECTION, per_read)]
        served = arm.startswith("served")
        started = time.thread_time()
        for connection, _ in made:
            for read in reads:
                connection.data_received(read)
                if served:  # the turn after the reads, then the answers' callbacks
                    await asyncio.sleep(0)
                    await asyncio.sleep(0)
                    await asyncio.sleep(0)
        result[arm] = (time.thread_time() - started) / (len(made) * PER_CONNECTION) * 1e6
        for _, wire in made:
            assert wire.writes >= (0 if reset else len(reads)), f"{arm}: every read answered"
            assert not getattr(wire, "closed", False), f"{arm}: the connection stayed open"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=50_000)
    parser.add_argument("--per-read", type=int, default=1, help="whole calls per read")
    parser.add_argument("--label", default="this checkout")
    args = parser.parse_args()
    arms = ["engine", "connection", "connection+reset", "served", "served-inline"]
    if "runs" not in inspect.signature(Http2Connection.__init__).parameters:
        arms.remove("served")  # an older tree: admitted calls always run inside the read
    cells: dict[str, list[float]] = {arm: [] for arm in arms}
    for _ in range(args.rounds):
        for arm, value in asyncio.run(one_round(arms, args.calls, args.per_read)).items():
            cells[arm].append(value)
    medians = {arm: round(statistics.median(values), 2) for arm, values in cells.items()}
    OUT.mkdir(exist_ok=True)
    report = {"machine": machine.stamp(), "args": vars(args), "us_per_refusal": cells, "medians": medians}
    (OUT / f"refusal_grpc_inprocess_{args.per_read}.json").write_text(
        json.dumps(report, indent=2, default=str)
    )
    print(
        args.label,
        f"CPU per refused gRPC call in process ({args.per_read} per read), medians (us):",
        medians,
        flush=True,
    )


if __name__ == "__main__":
    main()
