"""Server-side traffic capture: sampled requests into a bounded buffer, written to rotating files.

The request path only appends to a bounded deque (dropping and counting when it is full);
one background task owns the files and writes in a worker thread, so capture never blocks
the event loop and never changes a response. The record and file format, and the reader,
are capture_records.py.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from ortserve.capture_records import MAGIC, CapturedRequest
from ortserve.core.types import InferRequest
from ortserve.protocol.http_codec import encode_infer_request

__all__ = ["Capture", "CaptureCollector", "Sample"]

logger = logging.getLogger(__name__)

_KEPT_HEADERS = (b"content-type", b"inference-header-content-length")
_KEPT_NAMES = tuple(name.decode() for name in _KEPT_HEADERS)
_FIRST_PAUSE_S = 1.0
_MAX_PAUSE_S = 300.0


@dataclass(slots=True)
class Sample:
    """A request chosen for capture when it arrived, offered once it is answered.

    HTTP requests keep their path, body and the headers needed to send them again; a gRPC
    call has no HTTP form until it is decoded: ``request`` is set then, and the record is its
    HTTP binary-tensor equivalent.
    """

    wall_time: float
    arrival: float
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    request: InferRequest | None = None


@dataclass(slots=True)
class _Files:
    """The rotating files, touched only from the writer's worker thread.

    A file only ever ends on a whole record: ``written`` is the offset after the last record
    written whole, and a write that fails part way (a full disk) is cut back to it, so the
    next write after the disk has room appends a whole record to a whole file. When even the
    cut fails, the next write starts a new file (the reader skips a torn tail with a warning).
    """

    directory: Path
    max_file_bytes: int
    max_files: int
    prefix: str
    sequence: int = 0
    written: int = 0
    current: Path | None = None
    kept: collections.deque[Path] = field(default_factory=collections.deque)
    os_write: Callable[[int, memoryview], int] = os.write
    """``os.write`` (a test passes one that fails part way, as a full disk does)."""

    def write(self, chunks: list[bytes]) -> None:
        """Append whole records; on failure the file is cut back to its last whole record and
        the error, carrying ``records_written``, is raised."""
        if self.current is None or self.written >= self.max_file_bytes:
            self._rotate()
        assert self.current is not None
        whole = 0
        fd = os.open(self.current, os.O_WRONLY | os.O_APPEND)
        try:
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    view = view[self.os_write(fd, view) :]
                self.written += len(chunk)
                whole += 1
        except OSError as exc:
            self._cut(fd)
            exc.records_written = whole  # type: ignore[attr-defined]
            raise
        finally:
            os.close(fd)

    def _cut(self, fd: int) -> None:
        """Truncate the file back to its last whole record, or give it up."""
        try:
            os.ftruncate(fd, self.written)
        except OSError as exc:
            logger.warning(
                "capture: cannot cut %s back to its last whole record (%s); starting a new file",
                self.current,
                exc.strerror or exc,
            )
            self.current = None

    def _rotate(self) -> None:
        self.current = None
        self.sequence += 1
        path = self.directory / f"{self.prefix}-{self.sequence:05d}.ocap"
        try:
            path.write_bytes(MAGIC)
        except OSError:
            path.unlink(missing_ok=True)  # never a file without its whole magic line
            raise
        self.current, self.written = path, len(MAGIC)
        self.kept.append(path)
        while len(self.kept) > self.max_files:
            self.kept.popleft().unlink(missing_ok=True)


class Capture:
    """Samples infer requests and writes them in the background.

    Args:
        directory: where the capture files go (created if missing).
        rate: fraction of requests sampled (0 to 1).
        buffer_size: most records waiting to be written; more are dropped and counted.
        max_file_bytes: a file is rotated once it reaches this size.
        max_files: oldest files are deleted beyond this many.
        random_source: returns uniform floats in [0, 1) (injectable in tests).
        write: writes encoded records (injectable in tests; default: the rotating files).
        clock: monotonic seconds, for the pause after a failed write (injectable in tests).
        file_write: ``os.write`` for the rotating files (a test passes a full disk).

    A failed write (a full disk, a removed folder) pauses sampling: one error is logged, the
    buffered records are dropped and counted, and capture retries after a pause that doubles
    with each consecutive failure (1 s up to 5 min), so a broken disk costs a few log lines
    an hour instead of one traceback per request. The file is cut back to its last whole
    record first, so capture resumes on a file every reader can read to its end.
    """

    def __init__(
        self,
        directory: Path,
        rate: float,
        buffer_size: int = 4096,
        max_file_bytes: int = 64 * 1024 * 1024,
        max_files: int = 16,
        random_source: Callable[[], float] = random.random,
        write: Callable[[list[bytes]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        file_write: Callable[[int, memoryview], int] = os.write,
        redact: Callable[[CapturedRequest], CapturedRequest | None] | None = None,
    ) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError("capture rate must be between 0 and 1")
        self.rate = rate
        self.captured = 0
        self.dropped = 0
        self._random = random_source
        self._buffer: collections.deque[CapturedRequest] = collections.deque()
        self._buffer_size = buffer_size
        self._directory = directory
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self._files = _Files(
            directory, max_file_bytes, max_files, f"capture-{stamp}-{os.getpid()}", os_write=file_write
        )
        self._write = write or self._files.write
        self._redact = redact
        """``--capture-redact`` (capture_redaction.py): applied before a record is queued, so
        nothing it lists is held in memory for the writer or reaches the disk."""
        self._clock = clock
        self._resume_at: float | None = None
        self._pause_s = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def sampled(self) -> bool:
        """Whether to capture the request that just arrived (never while paused by a failed write)."""
        if self._resume_at is not None and self._clock() < self._resume_at:
            return False
        return self._random() < self.rate

    @property
    def paused(self) -> bool:
        """Sampling is off for now because the last write failed."""
        return self._resume_at is not None and self._clock() < self._resume_at

    def sample(self, path: str, header: Callable[[str], str | None] | None, body: bytes) -> Sample | None:
        """A request that just arrived, when it is sampled: what its record will hold."""
        if not self.sampled():
            return None
        kept: tuple[tuple[str, str], ...] = ()
        if header is not None:
            kept = tuple((name, value) for name in _KEPT_NAMES if (value := header(name)) is not None)
        return Sample(time.time(), time.monotonic(), path, kept, body)

    def offer_sample(self, sample: Sample, model: str, version: str | None, status: int) -> None:
        """Capture an answered request sampled at arrival (``status``: the HTTP status of the outcome)."""
        arrival = (sample.wall_time, sample.arrival)
        if sample.request is not None:
            self.offer_grpc(sample.request, arrival, status)
            return
        latency = time.monotonic() - sample.arrival
        self.offer(
            CapturedRequest(
                sample.wall_time,
                sample.arrival,
                sample.path,
                model,
                version,
                sample.headers,
                sample.body,
                status,
                latency,
            )
        )

    def offer_http(
        self,
        path: str,
        model: str,
        version: str | None,
        headers: dict[bytes, bytes],
        body: bytes,
        arrival: tuple[float, float],
        status: int,
    ) -> None:
        """Capture an answered HTTP infer request that arrived at ``(wall, monotonic)``."""
        kept = tuple(
            (name.decode("latin-1"), headers[name].decode("latin-1"))
            for name in _KEPT_HEADERS
            if name in headers
        )
        latency = time.monotonic() - arrival[1]
        self.offer(CapturedRequest(arrival[0], arrival[1], path, model, version, kept, body, status, latency))

    def offer_grpc(self, request: InferRequest, arrival: tuple[float, float], status: int) -> None:
        """Capture an answered gRPC ModelInfer as the equivalent HTTP binary-tensor request.

        The tensors, id, parameters and requested outputs are the same, so ``ortserve replay``
        sends it over HTTP; ``status`` is the HTTP status of the outcome (200, or the error's).
        """
        encoded = encode_infer_request(request)
        version = request.model_version or None
        path = f"/v2/models/{request.model_name}" + (f"/versions/{version}" if version else "") + "/infer"
        headers = (
            ("content-type", "application/json"),
            ("inference-header-content-length", str(encoded.header_length)),
        )
        body = b"".join(bytes(chunk) for chunk in encoded.chunks)
        latency = time.monotonic() - arrival[1]
        self.offer(
            CapturedRequest(
                arrival[0], arrival[1], path, request.model_name, version, headers, body, status, latency
            )
        )

    def offer(self, record: CapturedRequest) -> None:
        """Queue a record for writing, or drop and count it when the buffer is full."""
        if len(self._buffer) >= self._buffer_size:
            self.dropped += 1
            return
        if self._redact is not None:
            redacted = self._redact(record)
            if redacted is None:  # not readable, so not safely redactable: never written
                self.dropped += 1
                return
            record = redacted
        self._buffer.append(record)
        self.captured += 1
        self._wake.set()

    async def start(self) -> None:
        """Create the directory and start the writer task."""
        await asyncio.to_thread(self._directory.mkdir, parents=True, exist_ok=True)
        self._task = asyncio.create_task(self._write_forever(), name="capture-writer")

    async def stop(self) -> None:
        """Write what is buffered, then stop the writer.

        The writer finishes the write it is in rather than being cancelled: a cancelled
        ``to_thread`` write goes on in its thread, and the final flush would then write to the
        same file at the same time.
        """
        if self._task is not None:
            self._stopping = True
            self._wake.set()
            await self._task
            self._task = None
        await self._flush()
        logger.info("capture: %d requests recorded, %d dropped (buffer full)", self.captured, self.dropped)

    async def _write_forever(self) -> None:
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            await self._flush()

    async def _flush(self) -> None:
        if not self._buffer:
            return
        records = list(self._buffer)
        self._buffer.clear()
        chunks = [record.encode() for record in records]
        try:
            await asyncio.to_thread(self._write, chunks)
        except OSError as exc:
            lost = len(records) - int(getattr(exc, "records_written", 0))
            self.dropped += lost
            self._write_failed(exc, lost)
            return
        if self._resume_at is not None:
            logger.info("capture: writing to %s again", self._directory)
            self._resume_at, self._pause_s = None, 0.0

    def _write_failed(self, exc: OSError, lost: int) -> None:
        first = self._pause_s == 0.0
        self._pause_s = min(_MAX_PAUSE_S, self._pause_s * 2) if not first else _FIRST_PAUSE_S
        self._resume_at = self._clock() + self._pause_s
        logger.log(
            logging.ERROR if first else logging.WARNING,
            "capture: cannot write to %s (%s); %d records dropped, capture paused for %.0f s",
            self._directory,
            exc.strerror or exc,
            lost,
            self._pause_s,
        )


class CaptureCollector(Collector):
    """Exports the capture's counters to the server's Prometheus registry."""

    def __init__(self, capture: Capture) -> None:
        self._capture = capture

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "ortserve_capture_records",
            "Requests sampled into the capture buffer",
            value=self._capture.captured,
        )
        yield CounterMetricFamily(
            "ortserve_capture_dropped",
            "Sampled requests dropped because the capture buffer was full or a write failed",
            value=self._capture.dropped,
        )
