"""How long gzip bombs on the gRPC port stall the shared event loop, old tree against new.

``--bombs`` ModelInfer calls (default 50), each one gzip message of about 64 KiB that inflates
to 64 MiB (zeros), go out at once on one connection to a server pinned to CPU 0; meanwhile
(this process, CPU 1) an HTTP health probe is sent every 2 ms, and the probes' latencies during
the bombs are the stall. Two servers run side by side, A from ``--old-src`` and B from the
installed package, bombed alternately ``--repeats`` times; medians are printed and written as
JSON under benchmarks/out/.

    python benchmarks/bench_grpc_bomb.py --old-src /tmp/base/src --repeats 3
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import socket
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import h2.config
import h2.connection
import h2.events

sys.path.insert(0, str(Path(__file__).parent))
from bench_flood import probe_http
from side_by_side import old_and_new, write_medians

from ortserve.demo import write_demo_repository

OUT = Path(__file__).parent / "out"
INFER = "/inference.GRPCInferenceService/ModelInfer"


def bombard(port: int, bomb: bytes, count: int) -> tuple[float, dict[str, int]]:
    """Send ``count`` bomb calls; returns the seconds until all were answered, and their statuses."""
    config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    conn = h2.connection.H2Connection(config)
    message = b"\x01" + len(bomb).to_bytes(4, "big") + bomb
    statuses: dict[str, int] = {}
    with socket.create_connection(("127.0.0.1", port)) as sock:
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        started = time.perf_counter()
        pending: set[int] = set()
        queued: list[int] = []
        for _ in range(count):
            stream_id = conn.get_next_available_stream_id()
            head = [(":method", "POST"), (":scheme", "http"), (":path", INFER), (":authority", "x")]
            head += [("content-type", "application/grpc"), ("te", "trailers"), ("grpc-encoding", "gzip")]
            conn.send_headers(stream_id, head)
            pending.add(stream_id)
            queued.append(stream_id)
        sent: dict[int, int] = dict.fromkeys(queued, 0)
        while pending:
            for stream_id in queued:  # send what the windows allow
                offset = sent[stream_id]
                if offset >= len(message):
                    continue
                room = min(conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size)
                chunk = message[offset : offset + room]
                if chunk:
                    sent[stream_id] = offset + len(chunk)
                    conn.send_data(stream_id, chunk, end_stream=sent[stream_id] == len(message))
            sock.sendall(conn.data_to_send())
            data = sock.recv(1 << 16)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                    status = dict(event.headers or []).get("grpc-status")
                    if status is not None:
                        statuses[status] = statuses.get(status, 0) + 1
                if isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                    pending.discard(event.stream_id or 0)
            sock.sendall(conn.data_to_send())
        return time.perf_counter() - started, statuses


def one_run(http_port: int, grpc_port: int, bomb: bytes, count: int) -> dict[str, object]:
    latencies: list[float] = []
    stop = threading.Event()
    prober = threading.Thread(target=probe_http, args=(http_port, stop, latencies))
    prober.start()
    time.sleep(0.2)
    before = len(latencies)
    seconds, statuses = bombard(grpc_port, bomb, count)
    time.sleep(0.1)
    stop.set()
    prober.join()
    during = sorted(latencies[before:])
    return {
        "bombs_answered_s": seconds,
        "probe_max_ms": during[-1] * 1e3,
        "probe_p99_ms": during[int(0.99 * (len(during) - 1))] * 1e3,
        "probes": len(during),
        "statuses": statuses,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-src", type=Path, required=True)
    parser.add_argument("--bombs", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    OUT.mkdir(exist_ok=True)
    repository = OUT / "bomb-models"
    write_demo_repository(repository)
    bomb = gzip.compress(bytes(64 << 20), compresslevel=9)
    runs: dict[str, list[dict[str, object]]] = {"old": [], "new": []}
    with ExitStack() as stack:
        servers = old_and_new(stack, repository, OUT, "bomb", None, args.old_src)
        for _ in range(args.repeats):
            for label, server in servers.items():
                run = one_run(server.http_port, server.grpc_port, bomb, args.bombs)
                runs[label].append(run)
                print(label, json.dumps(run))
    keys = ("bombs_answered_s", "probe_max_ms", "probe_p99_ms")
    write_medians(OUT, "grpc_bomb", runs, keys, bomb_bytes=len(bomb), bombs=args.bombs)


if __name__ == "__main__":
    main()
