"""The capture record and its file format, apart from the sampler that writes them.

Replay, calibration and redaction read captures offline; this keeps them to the format alone,
without the server side's asyncio writer, Prometheus collector or HTTP codec (capture.py).

File format (``capture-<start>-<pid>-<seq>.ocap``): the magic line ``ORTCAP1\\n``, then records,
each ``<u32 meta length><u32 body length><meta JSON><body>``; the meta holds the arrival
times (wall and monotonic), path, model, version, body headers, status and latency.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

__all__ = ["MAGIC", "CapturedRequest", "TornTail", "read_capture"]

logger = logging.getLogger("ortserve.capture")
"""Named for the capture feature, not this module: the torn-tail warning keeps the logger it
had before the split, so log filters on ``ortserve.capture`` still see it."""

MAGIC = b"ORTCAP1\n"
_SIZES = struct.Struct("<II")


@dataclass(frozen=True, slots=True)
class CapturedRequest:
    """One sampled infer request as it arrived, and how it was answered."""

    wall_time: float
    arrival: float
    path: str
    model: str
    version: str | None
    headers: tuple[tuple[str, str], ...]
    body: bytes
    status: int = 0
    latency_s: float = 0.0

    def encode(self) -> bytes:
        meta = orjson.dumps(
            {
                "wall_time": self.wall_time,
                "arrival": self.arrival,
                "path": self.path,
                "model": self.model,
                "version": self.version,
                "headers": [list(h) for h in self.headers],
                "status": self.status,
                "latency_s": self.latency_s,
            }
        )
        return _SIZES.pack(len(meta), len(self.body)) + meta + self.body

    @classmethod
    def decode(cls, meta: bytes, body: bytes) -> CapturedRequest:
        fields = orjson.loads(meta)
        return cls(
            fields["wall_time"],
            fields["arrival"],
            fields["path"],
            fields["model"],
            fields["version"],
            tuple((str(n), str(v)) for n, v in fields["headers"]),
            body,
            fields["status"],
            fields["latency_s"],
        )


TornTail = Callable[[Path, int, int], None]
"""Told of a file whose last record is cut short: the file, where the torn record starts, and
how many bytes are skipped."""


def _warn_torn(file: Path, offset: int, skipped: int) -> None:
    logger.warning("capture: %s ends in a torn record at byte %d (%d bytes skipped)", file, offset, skipped)


def read_capture(paths: list[Path], on_torn: TornTail = _warn_torn) -> Iterator[CapturedRequest]:
    """Every record of capture files (or folders of them), in file-name order.

    A file cut short inside its last record (a full disk, a crash while writing) gives its
    whole records; the torn tail is skipped and reported to ``on_torn``.

    Raises:
        ValueError: a file is not a capture file, or a record is unreadable.
    """
    files: list[Path] = []
    for path in paths:
        files.extend(sorted(path.glob("*.ocap")) if path.is_dir() else [path])
    for file in sorted(files):
        yield from _read_file(file, on_torn)


def _read_file(file: Path, on_torn: TornTail) -> Iterator[CapturedRequest]:
    data = memoryview(file.read_bytes())
    if bytes(data[: len(MAGIC)]) != MAGIC:
        raise ValueError(f"{file} is not an ortserve capture file")
    offset = len(MAGIC)
    while offset < len(data):
        end = len(data) + 1
        if offset + _SIZES.size <= len(data):
            meta_length, body_length = _SIZES.unpack_from(data, offset)
            start = offset + _SIZES.size
            end = start + meta_length + body_length
        if end > len(data):
            on_torn(file, offset, len(data) - offset)
            return
        try:
            record = CapturedRequest.decode(
                bytes(data[start : start + meta_length]), bytes(data[start + meta_length : end])
            )
        except (ValueError, KeyError, TypeError) as exc:  # orjson's JSONDecodeError is a ValueError
            raise ValueError(f"{file}: unreadable record at byte {offset}: {exc}") from None
        yield record
        offset = end
