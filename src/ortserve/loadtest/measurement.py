"""What one load level measured: latency histograms, statuses, per-second windows; mergeable."""

from __future__ import annotations

from dataclasses import dataclass, field

from ortserve.loadtest.histogram import Histogram

__all__ = ["Measurement", "Window"]


@dataclass(slots=True)
class Window:
    """One second of a run: latencies of successes and the number of failures."""

    latency: Histogram = field(default_factory=lambda: Histogram(2))
    errors: int = 0

    def to_dict(self) -> dict[str, object]:
        return {"latency": self.latency.to_dict(), "errors": self.errors}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Window:
        latency = data["latency"]
        assert isinstance(latency, dict)
        return cls(Histogram.from_dict(latency), int(str(data["errors"])))


@dataclass(slots=True)
class Measurement:
    """Everything measured at one level (a concurrency or a rate), in microseconds.

    ``latency`` holds successful (2xx) requests only, ``refused`` the other answers (how fast
    the server says no under overload); ``statuses`` counts every answer, ``0`` meaning a
    connection error and ``1`` a client-side timeout.
    ``send_lag`` (open loop) is how late the generator sent requests after their intended
    time: large values mean the generator, not the server, limited the run.
    """

    latency: Histogram = field(default_factory=Histogram)
    send_lag: Histogram = field(default_factory=Histogram)
    refused: Histogram = field(default_factory=Histogram)
    statuses: dict[int, int] = field(default_factory=dict)
    windows: dict[int, Window] = field(default_factory=dict)
    elapsed_s: float = 0.0
    interrupted: bool = False
    cpu_s: float = 0.0
    """CPU time the generator process(es) spent on this level, warm-up included."""
    wall_s: float = 0.0
    """Wall time of the whole level, warm-up included (with ``cpu_s``: cores used)."""

    @property
    def generator_cores(self) -> float:
        """CPU cores the generator kept busy (near 1 per process: it may be the bottleneck)."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    @property
    def errors(self) -> int:
        return sum(count for status, count in self.statuses.items() if not 200 <= status < 300)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def achieved_rate(self) -> float:
        return self.requests / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def record(self, second: int, status: int, latency_us: int) -> None:
        """Count one answered request that was sent ``second`` seconds into the measurement."""
        self.statuses[status] = self.statuses.get(status, 0) + 1
        window = self.windows.get(second)
        if window is None:
            window = self.windows[second] = Window()
        if 200 <= status < 300:
            self.latency.record(latency_us)
            window.latency.record(latency_us)
        else:
            window.errors += 1
            if status > 1:
                self.refused.record(latency_us)

    def merge(self, other: Measurement) -> None:
        """Add another process's measurement of the same level (elapsed: the longest)."""
        self.latency.merge(other.latency)
        self.send_lag.merge(other.send_lag)
        self.refused.merge(other.refused)
        for status, count in other.statuses.items():
            self.statuses[status] = self.statuses.get(status, 0) + count
        for second, window in other.windows.items():
            mine = self.windows.setdefault(second, Window())
            mine.latency.merge(window.latency)
            mine.errors += window.errors
        self.elapsed_s = max(self.elapsed_s, other.elapsed_s)
        self.cpu_s += other.cpu_s
        self.wall_s = max(self.wall_s, other.wall_s)
        self.interrupted = self.interrupted or other.interrupted

    def to_dict(self) -> dict[str, object]:
        return {
            "latency": self.latency.to_dict(),
            "send_lag": self.send_lag.to_dict(),
            "refused": self.refused.to_dict(),
            "statuses": {str(k): v for k, v in self.statuses.items()},
            "windows": {str(k): w.to_dict() for k, w in self.windows.items()},
            "elapsed_s": self.elapsed_s,
            "interrupted": self.interrupted,
            "cpu_s": self.cpu_s,
            "wall_s": self.wall_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Measurement:
        latency, lag, statuses, windows = data["latency"], data["send_lag"], data["statuses"], data["windows"]
        assert isinstance(latency, dict) and isinstance(lag, dict)
        assert isinstance(statuses, dict) and isinstance(windows, dict)
        return cls(
            Histogram.from_dict(latency),
            Histogram.from_dict(lag),
            _histogram(data.get("refused")),
            {int(k): int(v) for k, v in statuses.items()},
            {int(k): Window.from_dict(w) for k, w in windows.items()},
            float(str(data["elapsed_s"])),
            bool(data["interrupted"]),
            float(str(data["cpu_s"])),
            float(str(data["wall_s"])),
        )


def _histogram(data: object) -> Histogram:
    """A histogram from its dict; an empty one for documents written before it existed."""
    return Histogram.from_dict(data) if isinstance(data, dict) else Histogram()
