"""What each worker of ``--workers N`` gets: its settings, its share of the CPUs, the ports."""

from __future__ import annotations

import dataclasses
import logging
import pickle
import socket
from dataclasses import dataclass
from pathlib import Path

from ortserve.core.cpus import usable_cpus
from ortserve.settings import ServerSettings

__all__ = ["WorkerLaunch", "parse_workers", "reserve_port", "thread_budget", "worker_settings"]

logger = logging.getLogger(__name__)

ControlCall = tuple[int, str, bytes, dict[bytes, bytes]]
"""A repository call (generation, path, body, headers) to replay on a restarted worker; the
generation numbers the calls the supervisor recorded, 1, 2, ..."""

TOKEN_HEADER = b"x-ortserve-worker-token"
"""Marks a request from the supervisor to one worker: answer with this worker's own view."""


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """What the supervisor hands every worker (pickled into its private run folder).

    Attributes:
        settings: the worker's server settings (ports resolved, SO_REUSEPORT on).
        run_dir: the private folder (mode 0700) holding the Unix sockets.
        token: a secret the supervisor puts on requests meant for one worker's own view.
        workers: how many workers there are (indices 0 .. workers - 1).
    """

    settings: ServerSettings
    run_dir: Path
    token: str
    workers: int = 1

    def worker_socket(self, index: int) -> Path:
        return self.run_dir / f"worker-{index}.sock"

    @property
    def supervisor_socket(self) -> Path:
        return self.run_dir / "supervisor.sock"

    def save_control_log(self, calls: list[ControlCall]) -> None:
        """The repository calls every worker accepted, in order (latest per model), for restarts."""
        temporary = self.run_dir / "control.pickle.new"
        temporary.write_bytes(pickle.dumps(calls))
        temporary.replace(self.run_dir / "control.pickle")

    def control_log(self) -> list[ControlCall]:
        try:
            calls: list[ControlCall] = pickle.loads((self.run_dir / "control.pickle").read_bytes())
        except FileNotFoundError:
            return []
        return calls

    def save_generation(self, index: int, generation: int) -> None:
        """Worker ``index`` has applied every recorded call up to ``generation``."""
        temporary = self.run_dir / f"worker-{index}.generation.new"
        temporary.write_text(str(generation))
        temporary.replace(self.run_dir / f"worker-{index}.generation")

    def generation(self, index: int) -> int:
        """The last recorded call worker ``index`` is known to have applied (0: none)."""
        try:
            return int((self.run_dir / f"worker-{index}.generation").read_text())
        except (FileNotFoundError, ValueError):
            return 0


def parse_workers(text: str) -> int:
    """``auto`` (one per usable CPU: affinity and cgroup quota) or a positive integer.

    Raises:
        ValueError: anything else.
    """
    if text.strip().lower() == "auto":
        return usable_cpus()
    try:
        count = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither a positive integer nor 'auto'") from None
    if count < 1:
        raise ValueError(f"{count} workers: at least 1")
    return count


def thread_budget(requested: int | None, workers: int, cpus: int) -> int:
    """ONNX Runtime intra-op threads per worker, so that all workers together fit ``cpus``.

    An explicit request that would oversubscribe is lowered (with a warning): N workers each
    sized to the whole machine would run N times as many compute threads as cores, and
    threads waiting for a core ruin tail latency.
    """
    share = max(1, cpus // workers)
    if requested is None:
        return share
    if requested * workers > cpus and requested > share:
        logger.warning(
            "--intra-op-threads %d x %d workers exceeds the %d usable CPUs: using %d per worker",
            requested,
            workers,
            cpus,
            share,
        )
        return share
    return requested


def worker_settings(settings: ServerSettings, workers: int, http_port: int, grpc_port: int) -> ServerSettings:
    """The settings every worker runs with: the supervisor's ports, SO_REUSEPORT, its thread share,
    and no metrics listener of its own (the supervisor serves the aggregated one)."""
    return dataclasses.replace(
        settings,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=-1,
        reuse_port=True,
        intra_op_threads=thread_budget(settings.intra_op_threads, workers, usable_cpus()),
    )


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind (without listening) ``host:port`` with SO_REUSEPORT, and keep it bound.

    Port 0 picks a free port once for all workers; and since a worker's listeners come and go
    with restarts, the bound socket keeps the port ours meanwhile. A socket that does not
    listen receives no connections, so the kernel spreads them over the workers only.

    Raises:
        OSError: the address cannot be bound (in use by a process not sharing it).
    """
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock
