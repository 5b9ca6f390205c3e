"""Server-side capture: sampling, a bounded buffer that drops and counts, rotating readable files."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

from ortserve.capture import Capture
from ortserve.capture_records import CapturedRequest, read_capture
from ortserve.loadtest.replay import load_capture


def _request(index: int, body: bytes = b'{"inputs": []}') -> CapturedRequest:
    return CapturedRequest(
        1_700_000_000.0 + index,
        float(index),
        "/v2/models/m/infer",
        "m",
        None,
        (("content-type", "application/octet-stream"), ("inference-header-content-length", "14")),
        body + bytes([index % 256]),
        200,
        0.001,
    )


def _file_count(directory: Path) -> int:
    return len(list(directory.glob("*.ocap")))


async def test_captured_requests_read_back_byte_for_byte(tmp_path: Path) -> None:
    capture = Capture(tmp_path, rate=1.0)
    await capture.start()
    sent = [_request(i) for i in range(50)]
    for record in sent:
        capture.offer(record)
    await capture.stop()
    assert list(read_capture([tmp_path])) == sent
    assert (capture.captured, capture.dropped) == (50, 0)


async def test_a_full_buffer_drops_and_counts_instead_of_waiting(tmp_path: Path) -> None:
    capture = Capture(tmp_path, rate=1.0, buffer_size=10)
    await capture.start()
    for index in range(25):  # no await between offers: the writer cannot drain meanwhile
        capture.offer(_request(index))
    await capture.stop()
    assert (capture.captured, capture.dropped) == (10, 15)
    assert len(list(read_capture([tmp_path]))) == 10


async def test_files_rotate_by_size_and_the_oldest_are_deleted(tmp_path: Path) -> None:
    capture = Capture(tmp_path, rate=1.0, max_file_bytes=2_000, max_files=3, buffer_size=1)
    await capture.start()
    for index in range(60):
        capture.offer(_request(index, b"x" * 300))
        await capture.stop()  # flush each record (a buffer of one)
        await capture.start()
    await capture.stop()
    assert _file_count(tmp_path) == 3
    kept = list(read_capture([tmp_path]))
    assert kept[-1] == _request(59, b"x" * 300)
    assert [r.arrival for r in kept] == sorted(r.arrival for r in kept)


def test_sampling_follows_the_rate() -> None:
    draws = iter([0.004, 0.5, 0.009, 0.011])
    capture = Capture(Path("unused"), rate=0.01, random_source=lambda: next(draws))
    assert [capture.sampled() for _ in range(4)] == [True, False, True, False]


def test_a_file_that_is_not_a_capture_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.ocap").write_bytes(b"hello")
    with pytest.raises(ValueError, match="not an ortserve capture"):
        list(read_capture([tmp_path / "x.ocap"]))


def test_rates_outside_zero_to_one_are_refused() -> None:
    with pytest.raises(ValueError):
        Capture(Path("unused"), rate=1.5)


async def test_replay_reads_one_models_requests_in_arrival_order(tmp_path: Path) -> None:
    capture = Capture(tmp_path, rate=1.0)
    await capture.start()
    for index in (3, 1, 2):
        capture.offer(_request(index))
    capture.offer(CapturedRequest(0.0, 0.5, "/v2/models/other/infer", "other", None, (), b"{}"))
    await capture.stop()
    assert [r.arrival for r in load_capture([tmp_path], "m")] == [1.0, 2.0, 3.0]
    assert len(load_capture([tmp_path])) == 4
    with pytest.raises(ValueError, match="no request for model 'absent'"):
        load_capture([tmp_path], "absent")


class _Disk:
    """A writer that fails with ENOSPC while ``full``, and keeps what it is given otherwise."""

    def __init__(self) -> None:
        self.full = True
        self.written: list[bytes] = []

    def write(self, chunks: list[bytes]) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.written.extend(chunks)


async def _serve_requests(capture: Capture, count: int) -> None:
    """What the server does per request: sample, offer; then let the writer flush."""
    for index in range(count):
        if capture.sampled():
            capture.offer(_request(index))
    await capture.stop()


async def test_a_failing_disk_pauses_capture_with_one_error_and_retries_with_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    disk = _Disk()
    capture = Capture(Path("unused"), rate=1.0, write=disk.write, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="ortserve.capture"):
        await _serve_requests(capture, 5)
        await _serve_requests(capture, 1000)  # paused: nothing sampled, nothing logged
        assert capture.paused and (capture.captured, capture.dropped) == (5, 5)
        failures = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r.levelno for r in failures] == [logging.ERROR]
        assert failures[0].exc_info is None and "No space left" in failures[0].getMessage()

        now[0] = 1.0  # the first pause (1 s) is over: one retry, which fails and doubles the pause
        await _serve_requests(capture, 3)
        now[0] = 2.5
        assert capture.paused and not capture.sampled()
        disk.full = False
        now[0] = 3.0
        await _serve_requests(capture, 2)
    assert not capture.paused and len(disk.written) == 2
    levels = [r.levelno for r in caplog.records if "cannot write" in r.getMessage()]
    assert levels == [logging.ERROR, logging.WARNING]
    assert any("again" in r.getMessage() for r in caplog.records)
