"""The zygote of ``--workers N``: one process that imports the server once and forks every worker.

A worker started with ``exec`` builds its own interpreter heap (NumPy, the server's modules and
their dependencies: about 40 MB each). Forked from a process that has already imported them,
with the garbage collector frozen, workers keep those pages shared copy-on-write, as gunicorn's
``--preload`` does. A fork copies only the calling thread, so the zygote must have no other
thread, no event loop and no ONNX Runtime state when it forks: it imports ONNX Runtime only in
name (``DeferredModule``; the real import starts a thread), and runs a plain ``poll`` loop.

The supervisor forks it before starting its event loop (or, to replace one that died, starts
``python -m ortserve.supervisor.zygote RUN_DIR FD``); it takes one JSON line per command on
its end of a socket pair, and answers one per event:

- ``{"start": INDEX, "restarted": BOOL}`` -> ``{"started": INDEX, "pid": PID}``
- ``{"signal": PID, "number": N}`` (ignored once PID has exited)
- ``{"exited": PID, "code": CODE}`` (sent by the zygote; CODE < 0: killed by signal -CODE)
- ``{"retire": true}``: exit now, leaving the workers running

Its children are reaped here (pidfds), so a PID it signals is always its own child. Once the
workers asked for are forked, the supervisor retires it: every page a worker has written is a
copy, and the zygote would keep each original (12.7 MB with four workers) for nothing; its
workers, orphaned, become the supervisor's children (it is a child subreaper), and a worker
restarted later is forked from a fresh zygote, retired in turn. A worker stops when the
supervisor dies (a pidfd of it, inherited from here, becomes readable), not when the zygote
does. When the socket closes before a retirement, the zygote passes SIGTERM to the workers
left, waits for them and exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import sys
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DeferredModule", "main", "preload", "run_zygote", "thread_count"]

BLAS_THREADS = {"OPENBLAS_NUM_THREADS": "1"}
"""Set in the zygote's environment: OpenBLAS starts its threads when NumPy is imported."""
_PR_SET_PDEATHSIG = 1
_PRELOADED = (
    "ortserve.supervisor.worker",
    "ortserve.repository.loader",
    "uvloop",
    "numpy.random",  # warm-up samples
    "encodings.idna",  # host names
)
"""What every worker imports (found by listing a worker's modules after it served); those
imported later (a model's kind, say) are each worker's own."""


class DeferredModule(types.ModuleType):
    """A module that stands in for a real one until an attribute is asked of it.

    ``import onnxruntime as ort`` at the top of a module binds this object; ``ort.X`` (any
    attribute the placeholder lacks) imports the real module, copies its names in and answers.
    Unlike ``importlib.util.LazyLoader``, reading ``__spec__`` (which the import statement
    does) does not count as use.
    """

    def __getattr__(self, name: str) -> object:
        return getattr(self.load(), name)

    def load(self) -> types.ModuleType:
        """Import the real module (once) and give this placeholder its names."""
        name = self.__name__
        real = sys.modules.get(name)
        if real is None or real is self:
            sys.modules.pop(name, None)
            real = importlib.import_module(name)
        vars(self).update({k: v for k, v in vars(real).items() if k != "__class__"})
        return real

    @classmethod
    def install(cls, name: str) -> DeferredModule:
        """Put a placeholder for ``name`` in ``sys.modules`` (the real one must not be loaded)."""
        if name in sys.modules:
            raise RuntimeError(f"{name} is already imported")
        placeholder = cls(name)
        placeholder.__spec__ = importlib.util.find_spec(name)
        sys.modules[name] = placeholder
        return placeholder


def thread_count() -> int:
    """Threads of this process, native ones included (``threading`` sees Python's only)."""
    return len(os.listdir("/proc/self/task"))


def preload() -> DeferredModule:
    """Import what every worker runs, with ONNX Runtime deferred; returns its placeholder.

    Raises:
        RuntimeError: an import started a thread or used ONNX Runtime: forking is not safe.
    """
    onnxruntime = DeferredModule.install("onnxruntime")
    for name in _PRELOADED:
        with contextlib.suppress(ImportError):  # uvloop is optional
            importlib.import_module(name)
    if sys.modules.get("onnxruntime") is not onnxruntime:
        raise RuntimeError("a module used onnxruntime while being imported: cannot fork workers")
    if thread_count() != 1:
        raise RuntimeError(
            f"the zygote has {thread_count()} threads after its imports (a BLAS library other "
            f"than OpenBLAS, or a thread started at import): cannot fork workers"
        )
    return onnxruntime


@dataclass(frozen=True, slots=True)
class _Child:
    pid: int
    index: int


class Zygote:
    """Forks workers on command and reports their exits, on one socket, in one thread."""

    def __init__(
        self, channel: socket.socket, run_dir: Path, onnxruntime: DeferredModule, supervisor: int
    ) -> None:
        self._channel = channel
        self._run_dir = run_dir
        self._onnxruntime = onnxruntime
        self._supervisor = supervisor
        """A pidfd of the supervisor, inherited by every worker."""
        self._poller = select.poll()
        self._children: dict[int, _Child] = {}
        """By pidfd: the workers not yet reaped."""
        self._open = True
        self._retired = False

    def serve(self) -> None:
        """Until retired, or until the socket closes and the last worker has exited."""
        self._poller.register(self._channel.fileno(), select.POLLIN)
        buffer = b""
        while (self._open or self._children) and not self._retired:
            for fd, _ in self._poller.poll():
                if fd != self._channel.fileno():
                    self._reap(fd)
                    continue
                data = self._channel.recv(1 << 16)
                if not data:
                    self._close()
                    continue
                buffer += data
                while b"\n" in buffer and not self._retired:
                    line, buffer = buffer.split(b"\n", 1)
                    self._command(json.loads(line))
        for pidfd in self._children:  # not reaped: the supervisor adopts them
            os.close(pidfd)

    def _command(self, command: dict[str, object]) -> None:
        if "start" in command:
            index = int(command["start"])  # type: ignore[call-overload]
            pid = self._fork(index, bool(command.get("restarted")))
            self._send({"started": index, "pid": pid})
        elif "signal" in command:
            pid = int(command["signal"])  # type: ignore[call-overload]
            if any(child.pid == pid for child in self._children.values()):
                os.kill(pid, int(command["number"]))  # type: ignore[call-overload]
        elif command.get("retire"):
            self._retired = True

    def _fork(self, index: int, restarted: bool) -> int:
        if thread_count() != 1:  # nothing here starts threads; if something did, do not fork
            raise RuntimeError(f"the zygote has {thread_count()} threads: refusing to fork")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._become_worker(index, restarted)
        pidfd = os.pidfd_open(pid)
        self._children[pidfd] = _Child(pid, index)
        self._poller.register(pidfd, select.POLLIN)
        return pid

    def _become_worker(self, index: int, restarted: bool) -> None:
        code = 1
        try:
            self._channel.close()
            for pidfd in self._children:
                os.close(pidfd)
            gc.enable()
            self._onnxruntime.load()
            from ortserve.supervisor.worker import run_worker

            code = run_worker(self._run_dir, index, restarted, self._supervisor)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _reap(self, pidfd: int) -> None:
        child = self._children.pop(pidfd)
        self._poller.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(child.pid, 0)
        if self._open:
            self._send({"exited": child.pid, "code": os.waitstatus_to_exitcode(status)})

    def _close(self) -> None:
        """The supervisor is gone or done: the workers left are asked to drain."""
        self._open = False
        self._poller.unregister(self._channel.fileno())
        for child in self._children.values():
            os.kill(child.pid, signal.SIGTERM)

    def _send(self, event: dict[str, object]) -> None:
        try:
            self._channel.sendall(json.dumps(event).encode() + b"\n")
        except OSError:
            self._close()


def _die_with_parent(parent: int) -> None:
    """If the parent dies (SIGKILL, OOM), this process gets SIGTERM instead of living on."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the prctl
        os.kill(os.getpid(), signal.SIGTERM)


def run_zygote(channel: socket.socket, run_dir: Path, parent: int) -> None:
    """Be the zygote: import the server, then fork workers until ``channel`` closes.

    Args:
        channel: this end of the socket pair shared with the supervisor.
        run_dir: the supervisor's private folder, passed to the workers.
        parent: the supervisor's PID (this process stops with it).
    """
    # Garbage collected during the imports would leave holes that later allocations fill,
    # writing to shared pages; frozen objects are never touched by the workers' collections.
    gc.disable()
    _die_with_parent(parent)
    try:
        supervisor = os.pidfd_open(parent)
    except ProcessLookupError:  # it stopped first
        return
    try:
        onnxruntime = preload()
    except RuntimeError as exc:
        print(f"ortserve zygote: {exc}", file=sys.stderr, flush=True)
        raise
    gc.freeze()
    try:
        channel.sendall(json.dumps({"ready": os.getpid()}).encode() + b"\n")
    except OSError:  # the supervisor stopped first (it could not start, say): nothing to do
        return
    Zygote(channel, run_dir, onnxruntime, supervisor).serve()


def main() -> None:
    """``python -m ortserve.supervisor.zygote RUN_DIR FD``: the zygote as a fresh process."""
    run_dir, fd = Path(sys.argv[1]), int(sys.argv[2])
    try:
        run_zygote(socket.socket(fileno=fd), run_dir, os.getppid())
    except RuntimeError:
        sys.exit(1)


if __name__ == "__main__":
    main()
