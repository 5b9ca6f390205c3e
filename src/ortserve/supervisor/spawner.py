"""The supervisor's side of the zygote: start it, have it fork workers, learn when they exit.

The zygote (``zygote.py``) is this process's child and the workers are its children: while it
lives, it reaps them and reports each exit here, and a worker is signalled through it (it
knows whether that PID is still its own child). Once no more workers are waiting to be
forked, it is retired: it exits, and its workers, orphaned, become this process's children
(it is a child subreaper, :func:`become_subreaper`), watched and signalled through pidfds. The
zygote's own copy of every page its workers have written is then freed (see ``zygote.py``).

The first zygote is forked from the supervisor before its event loop starts
(:meth:`Spawner.fork_zygote`), so the interpreter and the modules both import are shared by
all the processes. The next ones (a worker to restart) are fresh interpreters (``python -m
ortserve.supervisor.zygote``): a process with an event loop and threads must not fork.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ortserve.supervisor.zygote import BLAS_THREADS, run_zygote, thread_count

__all__ = ["Spawner", "WorkerProcess", "ZygoteError", "become_subreaper"]

logger = logging.getLogger(__name__)

EXIT_UNKNOWN = -int(signal.SIGKILL)
"""A worker's exit code when nobody could learn it (a zygote killed between reaping the worker
and reporting it, or this process no subreaper): counted as a death, so it is restarted."""
_PR_SET_CHILD_SUBREAPER = 36
_READY_TIMEOUT_S = 120.0
_EXIT_TIMEOUT_S = 5.0


def become_subreaper() -> bool:
    """Make this process the parent of its descendants that are orphaned (``prctl``).

    Returns:
        False if the kernel refused: zygotes are then never retired.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


class ZygoteError(Exception):
    """The zygote could not be started, or died before answering."""


class WorkerProcess:
    """One forked worker, as the supervisor sees it (the part of ``asyncio.subprocess.Process``
    the supervisor uses)."""

    def __init__(self, pid: int, spawner: Spawner) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._spawner = spawner
        self._pidfd: int | None = None
        """Once adopted (its zygote gone): this process watches and signals it through it."""
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, number: int) -> None:
        if self.returncode is not None:
            return
        if self._pidfd is None:
            self._spawner.signal(self.pid, number)
        else:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, number)

    def exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set_result(code)

    def adopt(self) -> None:
        """Its zygote has exited without reaping it: it is this process's child now (or, were
        this process no subreaper, init's: its exit code is then unknown)."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:  # reaped by the zygote, which died before reporting it
            self.exited(EXIT_UNKNOWN)
            return
        self._pidfd = pidfd
        loop = asyncio.get_running_loop()

        def reap() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                self.exited(EXIT_UNKNOWN)
            else:
                self.exited(os.waitstatus_to_exitcode(status))

        loop.add_reader(pidfd, reap)


@dataclass(slots=True)
class _Zygote:
    pid: int
    channel: socket.socket
    writer: asyncio.StreamWriter | None = None
    exited: asyncio.Future[int] | None = None
    reading: asyncio.Task[None] | None = None
    retiring: bool = False
    held: list[tuple[int, int]] = field(default_factory=list)
    """Signals (pid, number) for its workers, asked for once it was told to retire: sent when
    the workers are adopted."""


class Spawner:
    """Talks to the zygote; starts a fresh one when asked for a worker and none is alive.

    Args:
        run_dir: the supervisor's private folder (``launch.pickle``), passed to the zygote.
        retire: retire each zygote once no start is waiting (this process must be a child
            subreaper, or the orphaned workers would be init's).
    """

    def __init__(self, run_dir: Path, retire: bool = True) -> None:
        self._run_dir = run_dir
        self._retire = retire
        self._lock: asyncio.Lock | None = None
        self._waiting = 0
        """Starts waiting for the lock: the zygote is retired when none is left."""
        self._zygote: _Zygote | None = None
        self._started: dict[int, asyncio.Future[WorkerProcess]] = {}
        self._workers: dict[int, WorkerProcess] = {}
        """By pid: the zygote's workers, not yet reported exited."""
        self._adopted: list[WorkerProcess] = []

    def fork_zygote(self) -> bool:
        """Fork the zygote from this process, which must have no thread and no event loop yet.

        Returns:
            False (nothing done) if this process has other threads: a fresh zygote is then
            started when the first worker is asked for.
        """
        if thread_count() != 1:
            logger.info("the supervisor has %d threads: the zygote is a fresh process", thread_count())
            return False
        ours, theirs = socket.socketpair()
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()  # the supervisor's own collections leave the shared pages alone
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ours.close()
                os.setsid()  # as start_new_session: the terminal's Ctrl-C reaches workers once
                run_zygote(theirs, self._run_dir, parent)
                code = 0
            except BaseException as exc:
                print(f"ortserve zygote: {exc!r}", file=sys.stderr, flush=True)
            finally:
                os._exit(code)
        theirs.close()
        self._zygote = _Zygote(pid, ours)
        return True

    async def start(self, index: int, restarted: bool) -> WorkerProcess:
        """Fork worker ``index``.

        Raises:
            ZygoteError: the zygote cannot be started or died before answering.
        """
        if self._lock is None:
            self._lock = asyncio.Lock()
        self._waiting += 1
        try:
            await self._lock.acquire()  # one fork at a time
        finally:
            self._waiting -= 1
        try:
            writer = await self._ready_zygote()
            started: asyncio.Future[WorkerProcess] = asyncio.get_running_loop().create_future()
            self._started[index] = started
            writer.write(orjson.dumps({"start": index, "restarted": restarted}) + b"\n")
            worker = await started
            if self._retire and self._waiting == 0:
                self._retire_zygote()
            return worker
        finally:
            self._lock.release()

    def signal(self, pid: int, number: int) -> None:
        """Signal a worker of the zygote's (it must not have been adopted yet)."""
        zygote = self._zygote
        if zygote is None or zygote.writer is None or zygote.writer.is_closing():
            return
        if zygote.retiring:
            zygote.held.append((pid, number))
        else:
            zygote.writer.write(orjson.dumps({"signal": pid, "number": number}) + b"\n")

    def _retire_zygote(self) -> None:
        zygote = self._zygote
        if zygote is not None and zygote.writer is not None and not zygote.retiring:
            zygote.retiring = True
            zygote.writer.write(b'{"retire": true}\n')

    async def close(self) -> None:
        """Close the zygote's socket (it then exits, having no workers left) and wait for it."""
        zygote = self._zygote
        if zygote is None:
            return
        if zygote.writer is not None:
            zygote.writer.close()
        else:
            zygote.channel.close()
        exited = zygote.exited if zygote.exited is not None else _reaped(zygote.pid)
        try:
            await asyncio.wait_for(asyncio.shield(exited), _EXIT_TIMEOUT_S)
        except TimeoutError:
            logger.error("the zygote (pid %d) did not exit: killing it", zygote.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(zygote.pid, signal.SIGKILL)
            await exited
        if zygote.reading is not None:
            await zygote.reading

    async def _ready_zygote(self) -> asyncio.StreamWriter:
        zygote = self._zygote
        if zygote is not None and zygote.writer is not None:
            if not zygote.writer.is_closing() and not zygote.retiring:
                return zygote.writer
            if zygote.reading is not None:  # until its workers are adopted
                await zygote.reading
            zygote = None  # retired or dead: a fresh one
        if zygote is None:
            zygote = self._zygote = self._exec_zygote()
        zygote.exited = _reaped(zygote.pid)
        reader, writer = await asyncio.open_unix_connection(sock=zygote.channel, limit=1 << 16)
        zygote.writer = writer
        try:
            ready = await asyncio.wait_for(reader.readline(), _READY_TIMEOUT_S)
        except TimeoutError:
            ready = b""
        if not ready.startswith(b'{"ready"'):
            writer.close()
            with contextlib.suppress(ProcessLookupError):
                os.kill(zygote.pid, signal.SIGKILL)
            raise ZygoteError(f"the zygote did not start (exit code {await zygote.exited})")
        logger.info("zygote pid %d: the server imported once; workers are forked from it", zygote.pid)
        zygote.reading = asyncio.get_running_loop().create_task(self._read(reader, zygote))
        return writer

    def _exec_zygote(self) -> _Zygote:
        ours, theirs = socket.socketpair()
        os.set_inheritable(theirs.fileno(), True)
        try:
            argv = [
                sys.executable,
                "-m",
                "ortserve.supervisor.zygote",
                str(self._run_dir),
                str(theirs.fileno()),
            ]
            pid = os.posix_spawn(sys.executable, argv, {**os.environ, **BLAS_THREADS}, setsid=True)
        finally:
            theirs.close()
        return _Zygote(pid, ours)

    async def _read(self, reader: asyncio.StreamReader, zygote: _Zygote) -> None:
        while line := await reader.readline():
            self._event(orjson.loads(line))
        assert zygote.exited is not None
        code = await zygote.exited  # reaped: its orphans are this process's children now
        if zygote.retiring:
            logger.info("zygote pid %d retired: %d workers adopted", zygote.pid, len(self._workers))
        else:
            logger.error("the zygote exited (code %d): %d workers adopted", code, len(self._workers))
        for started in self._started.values():
            if not started.done():
                started.set_exception(ZygoteError(f"the zygote exited (code {code})"))
        self._started.clear()
        for worker in self._workers.values():
            worker.adopt()
        for pid, number in zygote.held:
            held = self._workers.get(pid)
            if held is not None:
                held.send_signal(number)
        self._adopted = [w for w in (*self._adopted, *self._workers.values()) if w.returncode is None]
        self._workers.clear()
        _stop_strays({worker.pid for worker in self._adopted})
        if zygote.writer is not None:
            zygote.writer.close()

    def _event(self, event: dict[str, Any]) -> None:
        if "started" in event:
            worker = WorkerProcess(int(event["pid"]), self)
            self._workers[worker.pid] = worker  # before its exit can be read
            self._started.pop(int(event["started"])).set_result(worker)
        elif "exited" in event:
            gone = self._workers.pop(int(event["exited"]), None)
            if gone is not None:
                gone.exited(int(event["code"]))


def _stop_strays(known: set[int]) -> None:
    """Kill and reap the children of this process that are none of ``known``: workers of a
    zygote that died between forking them and reporting them."""
    children: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            children.update(int(pid) for pid in (task / "children").read_text().split())
    for pid in children - known:
        logger.error("pid %d, forked by a zygote that died before reporting it: killed", pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _reaped(pid)


def _reaped(pid: int) -> asyncio.Future[int]:
    """The exit code of child ``pid``, once it has exited (reaped here, through a pidfd)."""
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[int] = loop.create_future()
    pidfd = os.pidfd_open(pid)

    def reap() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        exited.set_result(os.waitstatus_to_exitcode(status))

    loop.add_reader(pidfd, reap)
    return exited
