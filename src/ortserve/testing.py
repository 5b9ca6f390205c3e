"""Helpers for testing ortserve and code built on it: a fake clock and a real server process."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ortserve.pipeline_harness import PipelineHarness, pipeline_harness

__all__ = ["FakeClock", "PipelineHarness", "ServerProcess", "free_port", "pipeline_harness", "run_server"]


class _FakeTimer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class FakeClock:
    """A clock whose time moves only when a test calls :meth:`advance`; timers fire in order."""

    time: float = 1000.0
    _timers: list[tuple[float, int, _FakeTimer, Callable[[], None]]] = field(default_factory=list)
    _seq: Iterator[int] = field(default_factory=itertools.count)

    def now(self) -> float:
        return self.time

    def call_at(self, when: float, callback: Callable[[], None]) -> _FakeTimer:
        handle = _FakeTimer()
        heapq.heappush(self._timers, (when, next(self._seq), handle, callback))
        return handle

    def advance(self, seconds: float) -> None:
        """Move time forward, firing every timer that falls due, earliest first."""
        target = self.time + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, handle, callback = heapq.heappop(self._timers)
            self.time = max(self.time, when)
            if not handle.cancelled:
                callback()
        self.time = target


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    """A running ``ortserve serve`` child process and where to reach it."""

    process: subprocess.Popen[bytes]
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def http_address(self) -> str:
        """``host:port`` as tritonclient wants it."""
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Poll ``/v2/health/ready`` until 200, the process exits, or the deadline passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=1) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server not ready after {timeout_s} s:\n{self.log()}")

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then wait; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


@contextlib.contextmanager
def run_server(
    model_repository: Path,
    log_path: Path,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    ready_timeout_s: float = 90.0,
    wait: bool = True,
    pin_cpu: int | str | None = None,
) -> Iterator[ServerProcess]:
    """Start ``ortserve serve`` on free ports, wait until ready, stop it on exit.

    ``pin_cpu`` runs the server under ``taskset`` on that CPU, or CPU list such as ``"0-3"``
    (benchmarks).
    """
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    args = [
        sys.executable,
        "-m",
        "ortserve",
        "serve",
        "--model-repository",
        str(model_repository),
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--metrics-port",
        str(metrics_port),
        *(extra_args or []),
    ]
    if pin_cpu is not None:
        args = ["taskset", "-c", str(pin_cpu), *args]
    log = log_path.open("wb")
    # Tests stop servers with SIGTERM: no shutdown delay unless a test asks for one.
    environment = {**os.environ, "ORTSERVE_SHUTDOWN_DELAY": "0", **(env or {})}
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=environment)
    server = ServerProcess(process, "127.0.0.1", http_port, grpc_port, metrics_port, log_path)
    try:
        if wait:
            server.wait_ready(ready_timeout_s)
        yield server
    finally:
        server.stop()
        log.close()
