"""Triton's statistics extension: per-version request and execution totals, as JSON or values."""

from __future__ import annotations

import time
from dataclasses import dataclass

import orjson

from ortserve.core.observer import BatchRecord
from ortserve.errors import ModelNotFound, OrtServeError

__all__ = ["Duration", "ServerStatistics", "StatisticsSnapshot", "VersionStatistics", "encode_statistics"]


@dataclass(frozen=True, slots=True)
class Duration:
    """A count and the total nanoseconds of what was counted."""

    count: int = 0
    ns: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(frozen=True, slots=True)
class BatchSizeSnapshot:
    """Executions of one batch size (rows) and their compute phases."""

    batch_size: int
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration


@dataclass(frozen=True, slots=True)
class StatisticsSnapshot:
    """One version's statistics (Triton's ``ModelStatistics``), for JSON or protobuf encoders."""

    name: str
    version: str
    last_inference_ms: int
    inference_count: int
    execution_count: int
    success: Duration
    fail: Duration
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration
    batch_stats: tuple[BatchSizeSnapshot, ...]

    def as_dict(self) -> dict[str, object]:
        """Triton's JSON shape of one ``model_stats`` entry."""
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(),
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(),
                "cache_hit": {"count": 0, "ns": 0},
                "cache_miss": {"count": 0, "ns": 0},
            },
            "batch_stats": [
                {
                    "batch_size": b.batch_size,
                    "compute_input": b.compute_input.as_dict(),
                    "compute_infer": b.compute_infer.as_dict(),
                    "compute_output": b.compute_output.as_dict(),
                }
                for b in self.batch_stats
            ],
        }


class VersionStatistics:
    """Totals of one served version; its scheduler's observer and the transports' recorder.

    As in Triton, ``success``/``fail`` count requests with their end-to-end time, ``queue``
    and ``compute_*`` count each request of a successful execution with that execution's
    phase times, and ``batch_stats`` count executions per batch size.
    """

    __slots__ = (
        "batches",
        "execution_count",
        "fail_count",
        "fail_s",
        "infer_s",
        "inference_count",
        "input_s",
        "last_inference_s",
        "name",
        "output_s",
        "queue_s",
        "request_count",
        "success_count",
        "success_s",
        "version",
    )  # fmt: skip

    def __init__(self, name: str, version: str) -> None:
        self.name = name
        self.version = version
        # Plain floats on the hot path; nanoseconds only when a snapshot is taken.
        self.success_count = 0
        self.success_s = 0.0
        self.fail_count = 0
        self.fail_s = 0.0
        self.request_count = 0
        """Requests in successful executions: the count of queue and compute_* alike."""
        self.queue_s = 0.0
        self.input_s = 0.0
        self.infer_s = 0.0
        self.output_s = 0.0
        self.batches: dict[int, list[float]] = {}
        """rows -> [executions, input s, infer s, output s]."""
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_s = 0.0

    def record_request(self, ok: bool, seconds: float) -> None:
        """One request answered (ok) or failed after it reached this version."""
        if ok:
            self.success_count += 1
            self.success_s += seconds
        else:
            self.fail_count += 1
            self.fail_s += seconds

    def on_batch(self, record: BatchRecord) -> None:
        if record.failed:
            return
        requests = record.requests
        self.execution_count += 1
        self.inference_count += record.rows
        self.last_inference_s = time.time()
        self.request_count += requests
        waits = record.queue_waits_s
        self.queue_s += waits[0] if requests == 1 else sum(waits)
        assemble, run, split = record.assemble_s, record.run_s, record.split_s
        self.input_s += assemble * requests
        self.infer_s += run * requests
        self.output_s += split * requests
        per_size = self.batches.get(record.rows)
        if per_size is None:
            per_size = self.batches[record.rows] = [0, 0.0, 0.0, 0.0]
        per_size[0] += 1
        per_size[1] += assemble
        per_size[2] += run
        per_size[3] += split

    def on_rejected(self, error: OrtServeError) -> None:
        """Refused requests are counted as failures by the transport that answered them."""

    def snapshot(self) -> StatisticsSnapshot:
        count = self.request_count
        return StatisticsSnapshot(
            self.name,
            self.version,
            round(self.last_inference_s * 1e3),
            self.inference_count,
            self.execution_count,
            _duration(self.success_count, self.success_s),
            _duration(self.fail_count, self.fail_s),
            _duration(count, self.queue_s),
            _duration(count, self.input_s),
            _duration(count, self.infer_s),
            _duration(count, self.output_s),
            tuple(_batch_snapshot(size, self.batches[size]) for size in sorted(self.batches)),
        )


class ServerStatistics:
    """The statistics of every version the server has loaded."""

    def __init__(self) -> None:
        self.versions: dict[tuple[str, str], VersionStatistics] = {}

    def version(self, name: str, version: str) -> VersionStatistics:
        """The totals of one version, created at load (and kept across reloads)."""
        found = self.versions.get((name, version))
        if found is None:
            found = self.versions[(name, version)] = VersionStatistics(name, version)
        return found

    def snapshot(self, name: str | None = None, version: str | None = None) -> list[StatisticsSnapshot]:
        """Every version, every version of ``name``, or one version.

        Raises:
            ModelNotFound: ``name`` (or its ``version``) has no statistics.
        """
        keys = sorted(self.versions, key=lambda k: (k[0], _version_order(k[1])))
        if name is not None:
            keys = [k for k in keys if k[0] == name and (version is None or k[1] == version)]
            if not keys:
                which = f"model {name!r}" if version is None else f"model {name!r} version {version!r}"
                raise ModelNotFound(f"no statistics for {which}")
        return [self.versions[k].snapshot() for k in keys]


def _duration(count: float, seconds: float) -> Duration:
    return Duration(int(count), round(seconds * 1e9))


def _batch_snapshot(size: int, totals: list[float]) -> BatchSizeSnapshot:
    executions = totals[0]
    return BatchSizeSnapshot(
        size,
        _duration(executions, totals[1]),
        _duration(executions, totals[2]),
        _duration(executions, totals[3]),
    )


def _version_order(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isascii() and version.isdigit() else (-1, version)


def encode_statistics(snapshots: list[StatisticsSnapshot]) -> bytes:
    """``{"model_stats": [...]}`` as Triton's HTTP statistics extension returns it."""
    return orjson.dumps({"model_stats": [s.as_dict() for s in snapshots]})
