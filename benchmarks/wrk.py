"""Running wrk pinned to a core and reading its figures; shared by the benchmark scripts."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

POST_LUA = Path(__file__).with_name("post.lua")
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


@dataclass(frozen=True)
class WrkResult:
    """One wrk run: requests/s, latency percentiles in ms, and failed requests."""

    requests_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    errors: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    if not match:
        raise ValueError(f"unreadable wrk latency {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse(output: str) -> WrkResult:
    """Read wrk's ``--latency`` report."""
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    percentiles = {p: _ms(v) for p, v in re.findall(r"^\s+(50|90|99)%\s+(\S+)", output, re.M)}
    errors = 0
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    if non_2xx:
        errors += int(non_2xx.group(1))
    socket = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    if socket:
        errors += sum(int(x) for x in socket.groups())
    return WrkResult(rate, percentiles["50"], percentiles["90"], percentiles["99"], errors)


def run_wrk(
    url: str,
    path: str,
    body: bytes,
    concurrency: int,
    seconds: float,
    cpu: int = 1,
    header_length: int | None = None,
) -> WrkResult:
    """POST ``body`` to ``url + path`` with wrk on one core for ``seconds``."""
    with tempfile.NamedTemporaryFile(suffix=".body") as handle:
        handle.write(body)
        handle.flush()
        env = {
            **os.environ,
            "BODY": handle.name,
            "URL_PATH": path,
            "HEADER_LENGTH": "" if header_length is None else str(header_length),
        }
        command = [
            "taskset",
            "-c",
            str(cpu),
            "wrk",
            "-t1",
            f"-c{concurrency}",
            f"-d{max(1, round(seconds))}s",
            "--latency",
            "--timeout",
            "5s",
            "-s",
            str(POST_LUA),
            url,
        ]
        output = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return parse(output)
