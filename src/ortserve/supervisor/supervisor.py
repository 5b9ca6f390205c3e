"""The supervisor of ``--workers N``: reserve the ports, start the workers, keep them running,
pass signals on, and serve what must see all of them (metrics, statistics, model control).

``ortserve serve --workers N`` execs a fresh interpreter for it (``python -m
ortserve.supervisor RUN_DIR``): the command line's process has imported far more than the
supervisor needs, and has threads (NumPy's BLAS), while the supervisor must fork the zygote
before it starts any thread or event loop, so that every process shares one interpreter heap.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import secrets
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

from ortserve.logs import configure_logging
from ortserve.server.connections import ConnectionLimit
from ortserve.server.http.connection import ConnectionLimits
from ortserve.server.http.listener import HttpListener
from ortserve.server.startup import StartupError
from ortserve.settings import ServerSettings
from ortserve.supervisor.gateway import Gateway
from ortserve.supervisor.plan import WorkerLaunch, reserve_port, worker_settings
from ortserve.supervisor.slots import STARTUP_FAILED, WorkerSlot
from ortserve.supervisor.spawner import Spawner, become_subreaper
from ortserve.supervisor.zygote import BLAS_THREADS

__all__ = ["Supervisor", "exec_supervisor", "supervisor_main"]

logger = logging.getLogger(__name__)

_LIMITS = ConnectionLimits(max_body_bytes=64 * 1024 * 1024, keepalive_timeout_s=75.0)
_STOP_MARGIN_S = 15.0
"""Past the shutdown delay and grace, how long workers may take to exit before being killed."""


class Supervisor:
    """Runs ``workers`` copies of the server on the ports of ``settings``.

    Args:
        settings: the server settings as given; each worker gets ``worker_settings`` of them.
        workers: how many worker processes (>= 1).
        run_dir: a private folder (mode 0700), removed when the supervisor stops.
        spawner: forks the workers (its zygote may already be forked).
    """

    def __init__(self, settings: ServerSettings, workers: int, run_dir: Path, spawner: Spawner) -> None:
        self.settings = settings
        self.workers = workers
        self._run_dir = run_dir
        self._spawner = spawner
        self._signal: int | None = None
        self._stopping = asyncio.Event()

    def request_stop(self, number: int) -> None:
        """The first SIGTERM/SIGINT stops restarts and is passed on; a second one is passed on
        too (the workers then skip what is left of their shutdown delay)."""
        self._signal = number
        self._stopping.set()

    async def run(self) -> int:
        """Serve until a signal; returns the exit code (0 after a clean drain).

        Raises:
            StartupError: the repository is not a folder or a port cannot be bound.
        """
        s, run_dir, spawner = self.settings, self._run_dir, self._spawner
        try:
            if not s.model_repository.is_dir():
                raise StartupError(f"model repository {s.model_repository} is not a folder")
            reserved = [_reserve("HTTP", s.host, s.http_port)]
            if s.grpc_port >= 0:
                reserved.append(_reserve("gRPC", s.host, s.grpc_port))
        except StartupError:
            await spawner.close()
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        http_port = reserved[0].getsockname()[1]
        grpc_port = reserved[1].getsockname()[1] if s.grpc_port >= 0 else -1
        launch = WorkerLaunch(
            worker_settings(s, self.workers, http_port, grpc_port),
            run_dir,
            secrets.token_hex(16),
            self.workers,
        )
        _write_private(run_dir / "launch.pickle", pickle.dumps(launch))
        slots: list[WorkerSlot] = []
        gateway = Gateway(launch, slots)
        slots.extend(WorkerSlot(i, spawner) for i in range(self.workers))
        private = HttpListener(gateway.private, _LIMITS, ConnectionLimit(1024))
        public = HttpListener(gateway.public, _LIMITS, ConnectionLimit(64))
        try:
            await private.start_unix(str(launch.supervisor_socket))
            if s.metrics and s.metrics_port >= 0:
                port = await public.start(s.host, s.metrics_port)
                logger.info("Prometheus metrics (all workers) on http://%s:%d/metrics", s.host, port)
            logger.info(
                "supervisor pid %d: %d workers, %d ONNX Runtime intra-op threads each; HTTP port %d, gRPC port %d",
                os.getpid(),
                self.workers,
                launch.settings.intra_op_threads,
                http_port,
                grpc_port,
            )
            return await self._supervise(slots)
        finally:
            await spawner.close()
            for listener in (private, public):
                listener.stop_accepting()
                await listener.wait_closed(1.0)
            for sock in reserved:
                sock.close()
            shutil.rmtree(run_dir, ignore_errors=True)

    async def _supervise(self, slots: list[WorkerSlot]) -> int:
        loop = asyncio.get_running_loop()
        for number in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(number, self._on_signal, slots, number)
        loop.add_signal_handler(signal.SIGHUP, _pass_on, slots, signal.SIGHUP)
        tasks = [loop.create_task(slot.run()) for slot in slots]
        stopping = loop.create_task(self._stopping.wait())
        while not self._stopping.is_set():
            await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
            if any(slot.failed_start is not None for slot in slots) and not self._stopping.is_set():
                logger.error("a worker could not start: stopping the others")
                self._on_signal(slots, signal.SIGINT)
                await self._wait(slots, tasks)
                return STARTUP_FAILED
        await self._wait(slots, tasks)
        codes = [slot.process.returncode for slot in slots if slot.process is not None]
        logger.info("all workers stopped (exit codes %s)", codes)
        return 0 if all(code == 0 for code in codes) else 1

    def _on_signal(self, slots: list[WorkerSlot], number: int) -> None:
        first = not self._stopping.is_set()
        self.request_stop(number)
        if first:
            logger.info("%s: stopping %d workers", signal.Signals(number).name, len(slots))
        for slot in slots:
            slot.stop(number)

    async def _wait(self, slots: list[WorkerSlot], tasks: list[asyncio.Task[None]]) -> None:
        s = self.settings
        limit = s.shutdown_delay_s + s.shutdown_grace_s + _STOP_MARGIN_S
        _, pending = await asyncio.wait(tasks, timeout=limit)
        if pending:
            logger.error("workers still running %.0f s after the signal: killing them", limit)
            for slot in slots:
                slot.kill()
            await asyncio.wait(pending)


def _pass_on(slots: list[WorkerSlot], number: int) -> None:
    for slot in slots:
        slot.signal(number)


def _reserve(what: str, host: str, port: int) -> socket.socket:
    try:
        return reserve_port(host, port)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise StartupError(f"cannot listen for {what} on {host}:{port}: {reason}") from None


def _write_private(path: Path, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)


def exec_supervisor(settings: ServerSettings, workers: int) -> NoReturn:
    """Replace this process (same PID, so signals still reach it) with the supervisor.

    The settings go through a private folder; NumPy's BLAS gets one thread, so that the fresh
    interpreter has none besides its own when it forks the zygote.
    """
    run_dir = Path(tempfile.mkdtemp(prefix="ortserve-workers-"))
    _write_private(run_dir / "settings.pickle", pickle.dumps((settings, workers)))
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [sys.executable, "-m", "ortserve.supervisor", str(run_dir)]
    os.execve(sys.executable, argv, {**os.environ, **BLAS_THREADS})


def supervisor_main() -> None:
    """``python -m ortserve.supervisor RUN_DIR``: become the subreaper of the workers, fork the
    zygote, then supervise on an event loop (uvloop when installed); exits with its code."""
    run_dir = Path(sys.argv[1])
    settings, workers = pickle.loads((run_dir / "settings.pickle").read_bytes())
    configure_logging(settings.log_level, settings.log_format, onnxruntime=False)  # the zygote imports it
    adopts = become_subreaper()
    if not adopts:
        logger.warning("cannot become a child subreaper: the zygote is kept for the workers' lifetime")
    spawner = Spawner(run_dir, retire=adopts)
    spawner.fork_zygote()  # before the event loop and its threads exist
    supervisor = Supervisor(settings, workers, run_dir, spawner)
    try:
        try:
            import uvloop
        except ImportError:
            code = asyncio.run(supervisor.run())
        else:
            code = uvloop.run(supervisor.run())
    except StartupError as exc:  # an operator's to fix: one line, no traceback, as the CLI does
        logger.error("%s", exc)
        code = STARTUP_FAILED
    sys.exit(code)
