"""Run the native open-loop generator (openloop.c) pinned to a CPU and read its summary.

Latency counts from each request's intended send time, so the wait for a free connection inside
the generator is charged to the server (no coordinated omission); the send lag is reported
apart. ``rate=0`` is a closed loop over ``connections`` (gRPC: ``connections * streams``).

    python benchmarks/openloop/run.py http://127.0.0.1:8000 --request req.http --rate 5000
    python benchmarks/openloop/run.py 127.0.0.1:8001 --grpc-path /inference.GRPCInferenceService/ModelInfer \\
        --request message.bin --rate 5000

The request file is the whole raw HTTP/1.1 request, or for gRPC the serialized message.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).parent))

from build import build


@dataclass(frozen=True)
class Latency:
    """Milliseconds."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    p999: float
    max: float


@dataclass(frozen=True)
class Summary:
    """One run. Counts cover the whole run (every offered request ends as exactly one of
    completed, timed out, failed or expired in the generator's queue); rates and latencies cover
    the measured window after the warm-up. ``ok``: 2xx or gRPC OK; ``refused``: 429/503 or gRPC
    RESOURCE_EXHAUSTED/UNAVAILABLE (gRPC statuses are recorded as 1000 + code)."""

    offered: int
    sent: int
    completed: int
    timeouts: int
    errors: int
    expired_in_queue: int
    statuses: dict[str, int]
    connect_failures: int
    connection_resets: int
    window_seconds: float
    offered_rate: float
    achieved_rate: float
    goodput: float
    refused_rate: float
    ok_latency_ms: Latency | None
    ok_service_ms: Latency | None
    refused_latency_ms: Latency | None
    send_lag_ms: Latency | None
    generator_cpu_s: float
    raw: dict

    @classmethod
    def parse(cls, document: dict) -> Summary:
        window = document["window"]

        def latency(name: str) -> Latency | None:
            value = window[name]
            return Latency(**value) if value else None

        return cls(
            offered=document["offered"],
            sent=document["sent"],
            completed=document["completed"],
            timeouts=document["timeouts"],
            errors=document["errors"],
            expired_in_queue=document["expired_in_queue"],
            statuses=document["statuses"],
            connect_failures=document["connect_failures"],
            connection_resets=document["connection_resets"],
            window_seconds=window["seconds"],
            offered_rate=window["offered_rate"],
            achieved_rate=window["achieved_rate"],
            goodput=window["goodput"],
            refused_rate=window["refused_rate"],
            ok_latency_ms=latency("ok_latency_ms"),
            ok_service_ms=latency("ok_service_ms"),
            refused_latency_ms=latency("refused_latency_ms"),
            send_lag_ms=latency("send_lag_ms"),
            generator_cpu_s=document["generator_cpu_s"],
            raw=document,
        )


def _host_port(target: str) -> tuple[str, int]:
    parts = urlsplit(target if "://" in target else f"tcp://{target}")
    if not parts.hostname or not parts.port:
        raise ValueError(f"need host:port or http://host:port, got {target!r}")
    return socket.gethostbyname(parts.hostname), parts.port


def run_openloop(
    target: str,
    request_bytes: bytes,
    rate: float,
    seconds: float,
    connections: int,
    cpu: int | None,
    timeout_s: float,
    *,
    grpc_path: str | None = None,
    streams: int = 100,
    warmup_s: float = 1.0,
    arrivals: str = "uniform",
    seed: int = 1,
    log_path: Path | None = None,
) -> Summary:
    """Offer ``rate`` requests/s (0: closed loop) for ``warmup_s + seconds``; measure ``seconds``.

    ``target`` is ``host:port`` or ``http://host:port``; with ``grpc_path`` the requests are
    unary gRPC calls of that method over HTTP/2 and ``request_bytes`` is the serialized message.
    ``cpu`` pins the generator with taskset. ``log_path`` keeps the per-request binary log
    (32-byte records: intended, sent, done ns as int64; status, connection as int32).

    Raises:
        build.BuildError: gcc is missing or the generator did not compile.
        subprocess.CalledProcessError: the generator failed (bad arguments, unreachable host).
    """
    host, port = _host_port(target)
    with tempfile.TemporaryDirectory(prefix="openloop-") as tmp:
        request = Path(tmp) / "request"
        request.write_bytes(request_bytes)
        summary = Path(tmp) / "summary.json"
        command = [str(build()), "--host", host, "--port", str(port), "--request", str(request)]
        command += ["--rate", str(rate), "--duration", str(warmup_s + seconds), "--warmup", str(warmup_s)]
        command += ["--connections", str(connections), "--timeout", str(timeout_s), "--arrivals", arrivals]
        command += ["--seed", str(seed), "--summary", str(summary)]
        if grpc_path is not None:
            command += ["--grpc", "--path", grpc_path, "--streams", str(streams)]
        if log_path is not None:
            command += ["--log", str(log_path)]
        if cpu is not None:
            command = ["taskset", "-c", str(cpu), *command]
        subprocess.run(command, check=True, capture_output=True)
        return Summary.parse(json.loads(summary.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="host:port or http://host:port")
    parser.add_argument("--request", type=Path, required=True, help="raw HTTP request, or gRPC message")
    parser.add_argument("--rate", type=float, required=True, help="requests/s; 0: closed loop")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--streams", type=int, default=100, help="gRPC: streams per connection")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds from the intended send")
    parser.add_argument("--arrivals", choices=("uniform", "poisson"), default="uniform")
    parser.add_argument("--grpc-path", help="gRPC method path; the request file is its message")
    parser.add_argument("--cpu", type=int, help="pin the generator to this CPU")
    parser.add_argument("--log", type=Path, help="keep the per-request binary log here")
    args = parser.parse_args()
    summary = run_openloop(
        args.target, args.request.read_bytes(), args.rate, args.seconds, args.connections, args.cpu,
        args.timeout, grpc_path=args.grpc_path, streams=args.streams, warmup_s=args.warmup,
        arrivals=args.arrivals, log_path=args.log,
    )  # fmt: skip
    print(json.dumps(summary.raw, indent=2))


if __name__ == "__main__":
    main()
