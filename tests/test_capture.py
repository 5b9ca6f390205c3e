"""Durable capture (issue 27 item 9): a write cut short by a full disk leaves the file ending on
a whole record, capture resumes on it, and replay reads every whole record; a file torn anyway
(a crash mid-write) is replayed up to its torn tail, with a warning."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from ortserve.capture import Capture
from ortserve.capture_records import MAGIC, CapturedRequest, read_capture
from ortserve.loadtest.replay import load_capture


def _request(index: int) -> CapturedRequest:
    return CapturedRequest(
        1_700_000_000.0 + index,
        float(index),
        "/v1/chat/completions",
        "m",
        None,
        (("content-type", "application/json"),),
        b'{"model": "m", "messages": []}' + bytes([index % 256]) * 300,
        200,
        0.001,
    )


class _FillingDisk:
    """``os.write`` on a disk with ``room`` bytes left: past it, part of a write lands and then
    ENOSPC, as a real full disk answers."""

    def __init__(self) -> None:
        self.room: int | None = None  # None: unlimited

    def write(self, fd: int, data: memoryview) -> int:
        if self.room is None:
            return os.write(fd, data)
        if self.room == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        written = os.write(fd, data[: self.room])
        self.room -= written
        return written


async def _capture(capture: Capture, first: int, count: int) -> None:
    await capture.start()
    for index in range(first, first + count):
        capture.offer(_request(index))
    await capture.stop()  # flushes


async def test_a_full_disk_leaves_whole_records_and_capture_resumes_on_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    disk = _FillingDisk()
    capture = Capture(tmp_path, rate=1.0, clock=lambda: now[0], file_write=disk.write)
    await _capture(capture, 0, 3)
    disk.room = len(_request(3).encode()) + 100  # one record fits whole, the next is cut part way
    with caplog.at_level(logging.WARNING, logger="ortserve.capture"):
        await _capture(capture, 3, 3)
    assert capture.paused and capture.dropped == 2  # the one written whole is kept
    assert len(list(read_capture([tmp_path], on_torn=_fail_on_torn))) == 4  # no torn tail

    disk.room = None  # room again; the pause is over
    now[0] = 10.0
    await _capture(capture, 6, 2)
    torn: list[tuple[Path, int, int]] = []
    replayed = load_capture([tmp_path])
    assert [r.arrival for r in replayed] == [0.0, 1.0, 2.0, 3.0, 6.0, 7.0]
    assert list(read_capture([tmp_path], on_torn=lambda *t: torn.append(t))) == replayed and not torn


def _fail_on_torn(file: Path, offset: int, skipped: int) -> None:
    raise AssertionError(f"{file} torn at {offset}")


def test_replay_reads_a_torn_file_up_to_its_tail_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    whole = [_request(i) for i in range(3)]
    torn = _request(3).encode()
    for cut in (3, len(torn) - 1):  # inside the sizes, inside the body
        file = tmp_path / f"capture-{cut}.ocap"
        file.write_bytes(MAGIC + b"".join(r.encode() for r in whole) + torn[:cut])
        with caplog.at_level(logging.WARNING, logger="ortserve.capture"):
            assert load_capture([file]) == whole
        assert f"{file.name} ends in a torn record" in caplog.text
        caplog.clear()


def test_a_file_that_is_not_a_capture_is_still_refused(tmp_path: Path) -> None:
    file = tmp_path / "x.ocap"
    file.write_bytes(b"not a capture")
    with pytest.raises(ValueError, match="not an ortserve capture file"):
        load_capture([file])
