"""The gRPC transport alone, in process: recorded client bytes fed to ``Http2Connection``.

No sockets, no event-loop turns: a fake transport records what the connection writes, and
the bytes of h2load-like ServerLive calls (HEADERS, then an empty message in DATA with
END_STREAM; the header block indexed after the first call) go straight into
``data_received``, ``--batch`` calls per read (1 as at c=1, 64 as a busy c=64 connection
delivers them). Whatever tree is first on ``PYTHONPATH`` is driven, so two trees compare
side by side:

    PYTHONPATH=/tmp/a/src python benchmarks/grpc_inprocess.py --calls 20000
    valgrind --tool=callgrind python benchmarks/grpc_inprocess.py --calls 2000 --repeat 1

It prints microseconds per call (the fastest of ``--repeat`` rounds). Under callgrind run it
twice with different ``--calls`` and divide the difference of the instruction totals by the
difference of the calls: what the interpreter's start and the imports cost drops out.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import time
from typing import Any

import hpack

from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.server.connections import ConnectionSet
from ortserve.server.grpc.call import GrpcCall
from ortserve.server.grpc.connection import Http2Connection
from ortserve.server.grpc.options import GrpcOptions
from ortserve.server.grpc.rpc import Rpc

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
LIVE = "/inference.GRPCInferenceService/ServerLive"


class RecordingTransport(asyncio.Transport):
    """Counts what the connection writes; never blocks, never closes by itself."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += len(data)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.written += len(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload


def client_reads(calls: int, batch: int) -> list[bytes]:
    """The client's bytes as reads: the preface and SETTINGS, then ``batch`` calls per read."""
    encoder = hpack.Encoder()
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", LIVE),
        (":authority", "127.0.0.1:8001"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("user-agent", "h2load nghttp2/1.52.0"),
    ]
    message = b"\x00\x00\x00\x00\x00"
    # The connection's window opened to the largest: the answers' DATA (7 bytes a call) would
    # otherwise fill the default 65,535 after ~9,300 calls, and the rest would never be answered.
    window = (2**31 - 1 - 65_535).to_bytes(4, "big")
    reads = [PREFACE + _frame(4, 0, 0, b"") + _frame(4, 1, 0, b"") + _frame(8, 0, 0, window)]
    stream_id = 1
    for start in range(0, calls, batch):
        chunk = []
        for _ in range(min(batch, calls - start)):
            chunk.append(_frame(1, 0x4, stream_id, encoder.encode(fields)))
            chunk.append(_frame(0, 0x1, stream_id, message))
            stream_id += 2
        reads.append(b"".join(chunk))
    return reads


def live(request: pb.ServerLiveRequest, call: GrpcCall) -> pb.ServerLiveResponse:
    return pb.ServerLiveResponse(live=True)


def make_connection(loop: asyncio.AbstractEventLoop) -> tuple[Http2Connection, RecordingTransport]:
    """The tree's connection, built with whatever its constructor takes."""
    routes = {LIVE: Rpc(pb.ServerLiveRequest, unary=live)}
    params = inspect.signature(Http2Connection).parameters
    args: list[Any] = [routes, GrpcOptions(64 << 20, 7200.0, 20.0, 100), ConnectionSet(), loop]
    if "inflater" in params:
        from ortserve.server.grpc.inflate import Inflater

        args.append(Inflater(loop))
    connection = Http2Connection(*args)
    transport = RecordingTransport()
    connection.connection_made(transport)
    return connection, transport


def run(loop: asyncio.AbstractEventLoop, calls: int, batch: int) -> float:
    """Seconds for ``calls`` ServerLive calls on a fresh connection (the first read excluded)."""
    reads = client_reads(calls, batch)
    connection, transport = make_connection(loop)
    connection.data_received(reads[0])
    started = time.perf_counter()
    for data in reads[1:]:
        connection.data_received(data)
    elapsed = time.perf_counter() - started
    if transport.closed or transport.written < 20 * calls:
        raise RuntimeError(f"the connection did not answer: {transport.written} bytes written")
    connection.connection_lost(None)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    loop = asyncio.new_event_loop()
    best = min(run(loop, args.calls, args.batch) for _ in range(args.repeat))
    print(f"{1e6 * best / args.calls:.2f} us per call ({args.calls} calls, {args.batch} per read)")
    loop.close()


if __name__ == "__main__":
    main()
