"""A load request's configuration, parsed in a process of its own so the server's loop never waits.

A load request may carry a Triton JSON configuration with YAML documents in its ``ortserve.*``
parameters. Measured and parsed in a worker thread (``config/bounded.py`` bounds it), the
largest one accepted still stalled the event loop 9-28 ms: the parse holds the GIL (libyaml
events, protobuf, pydantic's validation in one call), and the loop waits for it at every
switch interval. Here a small persistent child process (``python -m`` this module, started
on the first load that carries a configuration) parses it and sends back the
:class:`ModelSource` pickled, with the log lines it wrote; the server only unpickles the
answer (benchmarks/RESULTS.md, "Control plane stall"). Every bound, refusal and message is
the same as in a thread: :func:`parse_override` is what the child runs.

The child reads requests on its stdin and exits when that closes (the server stopped or
died); one that dies or takes longer than ``timeout_s`` is killed and started again for the
next call. If no child can be started, the parse falls back to a worker thread.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

import orjson
from google.protobuf import json_format

from ortserve.config.bounded import bounded_text, check_json
from ortserve.errors import ConfigError
from ortserve.protocol.grpc import model_config_pb2 as mc
from ortserve.repository.config_source import ModelSource
from ortserve.repository.triton_config import to_model_config

__all__ = ["OverrideParser", "ParserFailed", "parse_override", "shared_parser"]

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("!I")
_MAX_FRAME = 64 << 20
_TIMEOUT_S = 30.0
_LOG_LINE = 2000
_MAX_LOG_LINES = 20
_FILE_WORDS = ("path", "dir", "file")
_LONG_STRING = 4096
_NICE = 10
_CHILD = f"import os; os.nice({_NICE}); from {__name__} import main; main()"
"""The child's program: on the server's CPU (it inherits the server's affinity) a parse must
yield to the event loop, and so must the child's start-up (its imports), hence nice first."""
_REFUSAL_CHARS = 2000
"""A refusal lists every invalid value (pydantic): 5,000 of them made a 100 KB message."""

LogLine = tuple[str, int, str]
"""A log record the child wrote: the logger's name, the level, the message (bounded)."""


class ParserFailed(RuntimeError):
    """The parse process died, hung, or failed in a way a configuration cannot cause (a 500)."""


def parse_override(config_json: str, name: str) -> ModelSource:
    """A load request's configuration, measured before it is parsed.

    Raises:
        ConfigError: past the limits, not a configuration, or a provider option naming a file.
    """
    check_json(config_json, "parameters.config")
    try:
        triton = to_model_config(_message(config_json), "parameters.config", name)
    except RecursionError:  # the limits keep nesting far below the interpreter's; never a 500
        raise ConfigError("parameters.config: nested too deeply") from None
    override = ModelSource.from_triton(triton, "parameters.config")
    _refuse_file_options(override)
    return override


def _message(config_json: str) -> mc.ModelConfig:
    """Triton JSON as a ModelConfig message, long string parameters (the YAML documents of
    ``ortserve.*``) set after the JSON parse: protobuf's JSON parser scans every string with a
    regular expression for lone surrogates (1 MB: 85 ms). orjson has already refused invalid
    UTF-8 and lone surrogates.

    Raises:
        ConfigError: not a JSON ModelConfig.
    """
    document = orjson.loads(config_json)  # measured by check_json: within the limits
    parameters = document.get("parameters") if isinstance(document, dict) else None
    long: dict[str, str] = {}
    if isinstance(parameters, dict):
        for key, value in list(parameters.items()):
            text = value.get("string_value") if isinstance(value, dict) and len(value) == 1 else None
            if isinstance(text, str) and len(text) > _LONG_STRING:
                long[key] = text
                del parameters[key]
    message = mc.ModelConfig()
    try:
        json_format.ParseDict(document, message)
        for key, text in long.items():
            message.parameters[key].string_value = text
    except (json_format.ParseError, ValueError, TypeError) as exc:
        problem = bounded_text(str(exc), 300)
        raise ConfigError(f"parameters.config: not a model configuration: {problem}") from None
    return message


def _refuse_file_options(source: ModelSource) -> None:
    """A load request's config may not name files for a provider to write (TensorRT's engine
    and timing caches, say): whoever reaches the control API would choose where the server
    writes. The repository's own config files may; they are the operator's.

    Raises:
        ConfigError: a provider option whose name says it is a path, directory or file.
    """
    for provider in source.config.providers or ():
        if isinstance(provider, str):
            continue
        for key in provider.options:
            if any(word in key.lower() for word in _FILE_WORDS):
                raise ConfigError(
                    f"parameters.config: provider {provider.name} option {key!r} names a file; "
                    "set it in the model's config file, not in a load request"
                )


class OverrideParser:
    """Parses load requests' configurations in a child process, one at a time.

    Args:
        timeout_s: the longest one parse may take before the child is killed (a 500).
        command: the child's command line (tests start other children).
    """

    def __init__(self, timeout_s: float = _TIMEOUT_S, command: list[str] | None = None) -> None:
        self.timeout_s = timeout_s
        self.command = command or [sys.executable, "-c", _CHILD]
        self.started = 0
        """Children started so far (a dead or hung one is replaced on the next call)."""
        self._process: subprocess.Popen[bytes] | None = None
        self._owner = os.getpid()
        self._calls = ThreadPoolExecutor(1, thread_name_prefix="override-parser")
        """One thread talks to the child: calls queue here, not in the loop's default executor."""
        self._fallback_logged = False

    @property
    def pid(self) -> int | None:
        """The child's process id (None: none running)."""
        process = self._process
        return None if process is None or process.poll() is not None else process.pid

    async def parse(self, config_json: str, name: str) -> ModelSource:
        """As :func:`parse_override`, in the child (in a thread if no child can be started).

        Raises:
            ConfigError: as :func:`parse_override`.
            ParserFailed: the child died, hung or failed unexpectedly.
        """
        request = pickle.dumps((config_json, name), protocol=pickle.HIGHEST_PROTOCOL)
        loop = asyncio.get_running_loop()
        try:
            answer = await loop.run_in_executor(self._calls, self._round_trip, request)
        except _NoChild as exc:
            if not self._fallback_logged:
                self._fallback_logged = True
                logger.warning("no configuration parse process (%s): parsing in a thread", exc)
            return await asyncio.to_thread(parse_override, config_json, name)
        # The one step on the loop: unpickling plain data (a few hundred microseconds).
        (status, value), lines = pickle.loads(answer)
        for logger_name, level, text in lines[:_MAX_LOG_LINES]:
            logging.getLogger(logger_name).log(level, "%s", bounded_text(text, _LOG_LINE))
        if status == "ok":
            assert isinstance(value, ModelSource)
            return value
        if status == "refused":
            raise ConfigError(str(value))
        raise ParserFailed(f"the configuration parse process failed: {value}")

    def close(self) -> None:
        """Stop the child (it exits when its stdin closes) and the thread talking to it."""
        self._discard()
        self._calls.shutdown(wait=False)

    def _round_trip(self, request: bytes) -> bytes:
        """In the parser's thread: send one request, wait for its answer."""
        process = self._child()
        deadline = time.monotonic() + self.timeout_s
        assert process.stdin is not None and process.stdout is not None
        try:
            _write(process.stdin.fileno(), _HEADER.pack(len(request)) + request, deadline)
            (length,) = _HEADER.unpack(_read(process.stdout.fileno(), _HEADER.size, deadline))
            if length > _MAX_FRAME:
                raise ParserFailed(f"an answer of {length} bytes")
            return _read(process.stdout.fileno(), length, deadline)
        except (OSError, ParserFailed) as exc:
            self._discard()
            raise ParserFailed(f"the configuration parse process: {exc}") from None

    def _child(self) -> subprocess.Popen[bytes]:
        if self._owner != os.getpid():  # a forked copy of the server: the child is its parent's
            self._process, self._owner = None, os.getpid()
        process = self._process
        if process is not None and process.poll() is None:
            return process
        self._discard()
        try:
            process = subprocess.Popen(
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                close_fds=True,
                start_new_session=True,  # a terminal's Ctrl-C goes to the server, which stops it
            )
        except OSError as exc:
            raise _NoChild(str(exc)) from None
        assert process.stdin is not None and process.stdout is not None
        os.set_blocking(process.stdin.fileno(), False)
        os.set_blocking(process.stdout.fileno(), False)
        self._process = process
        self.started += 1
        return process

    def _discard(self) -> None:
        process, self._process = self._process, None
        if process is None or self._owner != os.getpid():
            return
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        try:
            process.wait(1.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class _NoChild(Exception):
    """The child process could not be started."""


def _write(fd: int, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        _wait(fd, deadline, write=True)
        try:
            sent = os.write(fd, view)
        except BlockingIOError:
            continue
        view = view[sent:]


def _read(fd: int, size: int, deadline: float) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left:
        _wait(fd, deadline, write=False)
        try:
            chunk = os.read(fd, min(left, 1 << 20))
        except BlockingIOError:
            continue
        if not chunk:
            raise ParserFailed("it exited")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _wait(fd: int, deadline: float, write: bool) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise ParserFailed("no answer in time")
    ready = select.select([], [fd], [], left) if write else select.select([fd], [], [], left)
    if not any(ready):
        raise ParserFailed("no answer in time")


_shared: OverrideParser | None = None
_shared_lock = threading.Lock()


def shared_parser() -> OverrideParser:
    """The process's parser (one child for every server in it), stopped at exit."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = OverrideParser()
            atexit.register(_shared.close)
        return _shared


class _Lines(logging.Handler):
    """In the child: the records one parse wrote, sent back with its answer."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[LogLine] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.lines) < _MAX_LOG_LINES:
            self.lines.append((record.name, record.levelno, bounded_text(record.getMessage(), _LOG_LINE)))


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """The child: answer each request read from ``stdin`` until it closes."""
    lines = _Lines()
    root = logging.getLogger()
    root.handlers[:] = [lines]
    root.setLevel(logging.INFO)
    while True:
        header = stdin.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return
        (length,) = _HEADER.unpack(header)
        config_json, name = pickle.loads(stdin.read(length))
        lines.lines = []
        answer: tuple[str, object]
        try:
            answer = ("ok", parse_override(config_json, name))
        except ConfigError as exc:
            answer = ("refused", bounded_text(exc.message, _REFUSAL_CHARS))
        except Exception as exc:  # answered as a 500 by the server, which logs it
            answer = ("failed", bounded_text(f"{type(exc).__name__}: {exc}", 400))
        data = pickle.dumps((answer, lines.lines), protocol=pickle.HIGHEST_PROTOCOL)
        stdout.write(_HEADER.pack(len(data)) + data)
        stdout.flush()


def main() -> None:
    """The child's entry: answers go out on a private copy of stdout, and whatever else would
    be printed goes to stderr, so no stray print can break a frame."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
