"""Running h2load pinned to a core for gRPC unary calls, and reading its per-request log.

h2load (nghttp2) sees only the HTTP ``:status``; a gRPC failure arrives as ``:status 200`` with a
``grpc-status`` trailer, so callers must check the calls another way (the server's statistics,
or the response bytes when the answer's size is known).
"""

from __future__ import annotations

import re
import struct
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

GRPC_HEADERS = ("content-type: application/grpc", "te: trailers")


@dataclass(frozen=True)
class H2loadResult:
    """One h2load run.

    The rate and the latency percentiles (ms) cover the timed part, after the warm-up; the counts
    cover the whole run, warm-up included, so they can be set against the server's own counters.
    """

    requests_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    completed: int
    """Responses received, whatever their status."""
    started: int
    """Requests sent: ``completed`` plus those still in flight when h2load stopped."""
    http_errors: int
    """Responses whose ``:status`` was not 200, and failed streams."""
    data_bytes: int
    """DATA payload received: the gRPC messages with their 5-byte prefixes."""

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def grpc_frame(message: bytes) -> bytes:
    """One gRPC length-prefixed message: uncompressed flag, 4-byte big-endian length, the bytes."""
    return b"\0" + struct.pack(">I", len(message)) + message


def _percentile(sorted_ms: list[float], p: float) -> float:
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, int(p * len(sorted_ms)))]


def parse(log: str, output: str, warm_up_s: float) -> H2loadResult:
    """Read h2load's ``--log-file`` (start µs since epoch, status, µs to end) and its summary.

    Requests that start in the warm-up give no latency; the rate is the 200 responses that end
    after the warm-up, over the time from its end to the last response.
    """
    rows = [tuple(int(x) for x in line.split("\t")[:3]) for line in log.splitlines() if line]
    if not rows:
        raise RuntimeError(f"h2load logged no request:\n{output}")
    warm_end = min(start for start, _, _ in rows) + warm_up_s * 1e6
    ok = [(start, duration) for start, status, duration in rows if status == 200]
    latencies = sorted(d / 1e3 for start, d in ok if start >= warm_end)
    ends = [start + d for start, d in ok if start + d >= warm_end]
    window_s = (max(ends) - warm_end) / 1e6 if ends else 0.0
    started = re.search(r"requests: \d+ total, (\d+) started", output)
    data = re.search(r"traffic: .* \((\d+)\) data", output)
    if not started or not data:
        raise RuntimeError(f"unreadable h2load summary:\n{output}")
    return H2loadResult(
        requests_per_s=len(ends) / window_s if window_s > 0 else 0.0,
        p50_ms=_percentile(latencies, 0.50),
        p90_ms=_percentile(latencies, 0.90),
        p99_ms=_percentile(latencies, 0.99),
        completed=len(rows),
        started=int(started.group(1)),
        http_errors=len(rows) - len(ok),
        data_bytes=int(data.group(1)),
    )


def run_h2load(
    url: str,
    body: bytes,
    concurrency: int,
    seconds: float,
    warm_up_s: float = 0.5,
    streams_per_connection: int = 1,
    cpu: int = 1,
    headers: tuple[str, ...] = GRPC_HEADERS,
) -> H2loadResult:
    """POST ``body`` to ``url`` over cleartext HTTP/2 with one h2load thread on core ``cpu``.

    ``concurrency`` calls stay in flight: ``concurrency / streams_per_connection`` connections,
    each with at most ``streams_per_connection`` open streams (1 matches wrk's one connection
    per caller). h2load runs ``warm_up_s + seconds`` with no warm-up of its own, so its log
    holds every request the server saw; :func:`parse` leaves the warm-up out of the figures.

    Raises:
        ValueError: ``concurrency`` is not a multiple of ``streams_per_connection``.
        subprocess.CalledProcessError: h2load failed.
    """
    if concurrency % streams_per_connection:
        raise ValueError(f"concurrency {concurrency} is not a multiple of {streams_per_connection} streams")
    duration_ms = round((warm_up_s + seconds) * 1e3)
    with tempfile.TemporaryDirectory(prefix="h2load-") as tmp:
        body_path, log_path = Path(tmp) / "body.bin", Path(tmp) / "requests.tsv"
        body_path.write_bytes(body)
        command = [
            *("taskset", "-c", str(cpu), "h2load", "-t1"),
            *(f"-c{concurrency // streams_per_connection}", f"-m{streams_per_connection}"),
            *(f"-D{duration_ms}ms", "--log-file", str(log_path), "-d", str(body_path)),
            *(arg for header in headers for arg in ("-H", header)),
            url,
        ]
        done = subprocess.run(
            command, capture_output=True, text=True, check=True, timeout=duration_ms / 1e3 + 60
        )
        return parse(log_path.read_text(), done.stdout, warm_up_s)


def h2load_version() -> str:
    """``nghttp2/1.52.0``, say."""
    output = subprocess.run(["h2load", "--version"], capture_output=True, text=True).stdout
    return output.split()[-1] if output else "unknown"
