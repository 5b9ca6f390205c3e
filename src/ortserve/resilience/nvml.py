"""GPU health from NVML: sampled thresholds that hold a device's levels open, and GPU gauges.

NVML comes from ``nvidia-ml-py`` (``import pynvml``; the ``gpu`` extra). Without it, or
without a driver, device health is off after one info line; tests pass a fake module.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = [
    "DeviceHealth",
    "DeviceSample",
    "GpuCollector",
    "HealthThresholds",
    "Holdable",
    "current_health",
    "load_nvml",
    "monitor",
    "set_current_health",
    "start_health",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HealthThresholds:
    """The seed's defaults: a device is unhealthy after ``samples`` consecutive bad samples."""

    utilization_pct: float = 95.0
    memory_pct: float = 92.0
    temperature_c: float = 85.0
    samples: int = 3
    interval_s: float = 5.0


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """One reading of one device."""

    utilization_pct: float
    memory_used: int
    memory_total: int
    temperature_c: float
    ecc_errors: int | None
    """Volatile uncorrected ECC errors; None where the device has no ECC."""


class Holdable(Protocol):
    """What a device's health is pushed to (a level's circuit breaker)."""

    def hold(self, reason: str | None) -> None: ...


@dataclass(slots=True)
class _Device:
    handle: object
    last: DeviceSample | None = None
    bad_in_a_row: int = 0
    problem: str = ""
    unhealthy: str | None = None
    ecc_seen: int | None = None
    samples: int = field(default=0)


class DeviceHealth:
    """Samples every device through NVML and says which are unhealthy, and why.

    A device is unhealthy while its last ``samples`` consecutive readings each broke a
    threshold (utilisation, memory, temperature) or showed a new uncorrected ECC error; one
    good reading makes it healthy again.

    Args:
        nvml: the ``pynvml`` module (initialised) or a fake with the same functions.
        thresholds: limits and the sampling period.
    """

    def __init__(self, nvml: ModuleType, thresholds: HealthThresholds | None = None) -> None:
        self._nvml = nvml
        self.thresholds = thresholds or HealthThresholds()
        self._lock = threading.Lock()
        count = int(nvml.nvmlDeviceGetCount())
        self._devices = {i: _Device(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)}
        self._watchers: dict[int, weakref.WeakSet[Holdable]] = {}

    def watch(self, device_id: int, watcher: Holdable) -> None:
        """Push ``device_id``'s health to ``watcher`` now and at every change, so levels read
        a flag per request instead of asking. Held weakly: an unloaded version's breakers go
        with it."""
        with self._lock:
            self._watchers.setdefault(device_id, weakref.WeakSet()).add(watcher)
            reason = self.reason(device_id)
        watcher.hold(reason)

    @property
    def device_ids(self) -> list[int]:
        return sorted(self._devices)

    def sample(self) -> None:
        """Read every device once (blocking: call it from a thread)."""
        for index, device in self._devices.items():
            try:
                reading = self._read(device.handle)
            except Exception as exc:  # NVMLError: a device that cannot be read is a bad sample
                self._judge(index, device, None, f"NVML cannot read GPU {index}: {exc}")
                continue
            self._judge(index, device, reading, self._problem(index, device, reading))

    def reason(self, device_id: int) -> str | None:
        """Why ``device_id`` is unhealthy, or None while it is healthy (or unknown)."""
        device = self._devices.get(device_id)
        return None if device is None else device.unhealthy

    def readings(self) -> dict[int, DeviceSample]:
        with self._lock:
            return {i: d.last for i, d in self._devices.items() if d.last is not None}

    def _read(self, handle: object) -> DeviceSample:
        nvml = self._nvml
        utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        temperature = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        try:
            ecc: int | None = int(
                nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                )
            )
        except Exception:  # no ECC on this device (NVML_ERROR_NOT_SUPPORTED)
            ecc = None
        return DeviceSample(
            float(utilization.gpu), int(memory.used), int(memory.total), float(temperature), ecc
        )

    def _problem(self, index: int, device: _Device, s: DeviceSample) -> str:
        t = self.thresholds
        problems = []
        if s.utilization_pct > t.utilization_pct:
            problems.append(f"utilisation {s.utilization_pct:g}% > {t.utilization_pct:g}%")
        if s.memory_total and 100.0 * s.memory_used / s.memory_total > t.memory_pct:
            problems.append(f"memory {100.0 * s.memory_used / s.memory_total:.1f}% > {t.memory_pct:g}%")
        if s.temperature_c > t.temperature_c:
            problems.append(f"temperature {s.temperature_c:g} C > {t.temperature_c:g} C")
        if s.ecc_errors is not None and device.ecc_seen is not None and s.ecc_errors > device.ecc_seen:
            problems.append(f"{s.ecc_errors - device.ecc_seen} new uncorrected ECC errors")
        return f"GPU {index}: " + ", ".join(problems) if problems else ""

    def _judge(self, index: int, device: _Device, reading: DeviceSample | None, problem: str) -> None:
        with self._lock:
            was = device.unhealthy
            self._update(index, device, reading, problem)
            now = device.unhealthy
            watchers = list(self._watchers.get(index, ())) if now != was else []
        for watcher in watchers:
            watcher.hold(now)

    def _update(self, index: int, device: _Device, reading: DeviceSample | None, problem: str) -> None:
        """Under the lock: count the sample and judge the device."""
        device.samples += 1
        if reading is not None:
            device.last = reading
            if reading.ecc_errors is not None:
                device.ecc_seen = reading.ecc_errors
        if not problem:
            if device.unhealthy is not None:
                logger.warning("GPU %d healthy again", index)
            device.bad_in_a_row, device.unhealthy = 0, None
            return
        device.bad_in_a_row += 1
        if device.bad_in_a_row >= self.thresholds.samples and device.unhealthy is None:
            device.unhealthy = f"{problem} ({device.bad_in_a_row} samples in a row)"
            logger.warning("%s: traffic moves off it", device.unhealthy)


class GpuCollector(Collector):
    """GPU gauges on ``/metrics``, from the last samples."""

    def __init__(self, health: DeviceHealth) -> None:
        self._health = health

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["device"]
        families = {
            "utilization": GaugeMetricFamily(
                "ortserve_gpu_utilization_percent", "GPU utilisation", labels=labels
            ),
            "used": GaugeMetricFamily("ortserve_gpu_memory_used_bytes", "GPU memory used", labels=labels),
            "total": GaugeMetricFamily("ortserve_gpu_memory_total_bytes", "GPU memory", labels=labels),
            "temperature": GaugeMetricFamily(
                "ortserve_gpu_temperature_celsius", "GPU temperature", labels=labels
            ),
            "ecc": GaugeMetricFamily(
                "ortserve_gpu_ecc_errors", "Volatile uncorrected ECC errors", labels=labels
            ),
            "unhealthy": GaugeMetricFamily(
                "ortserve_gpu_unhealthy", "1 while the device breaks a health threshold", labels=labels
            ),
        }
        for index, s in sorted(self._health.readings().items()):
            device = [str(index)]
            families["utilization"].add_metric(device, s.utilization_pct)
            families["used"].add_metric(device, s.memory_used)
            families["total"].add_metric(device, s.memory_total)
            families["temperature"].add_metric(device, s.temperature_c)
            if s.ecc_errors is not None:
                families["ecc"].add_metric(device, s.ecc_errors)
            families["unhealthy"].add_metric(device, 0.0 if self._health.reason(index) is None else 1.0)
        yield from families.values()


def load_nvml(module_name: str = "pynvml") -> ModuleType | None:
    """The initialised NVML module, or None without the package (a debug line: a CPU install
    has no reason to have it) or without a driver or GPU (one info line: the gpu extra is
    installed, so GPU health was expected)."""
    try:
        nvml = importlib.import_module(module_name)
    except ImportError as exc:
        logger.debug("GPU health checks off: NVML not installed (%s)", exc)
        return None
    try:
        nvml.nvmlInit()
        if int(nvml.nvmlDeviceGetCount()) == 0:
            raise RuntimeError("no GPU")
    except Exception as exc:
        logger.info("GPU health checks off: NVML not available (%s)", exc)
        return None
    return nvml


def start_health(registry: CollectorRegistry | None, module_name: str = "pynvml") -> DeviceHealth | None:
    """Device health for this server when NVML is available: first sample taken, GPU gauges
    registered on ``registry``, and made current for the levels loaded from now on."""
    nvml = load_nvml(module_name)
    if nvml is None:
        return None
    health = DeviceHealth(nvml)
    health.sample()
    if registry is not None:
        registry.register(GpuCollector(health))
    set_current_health(health)
    logger.info(
        "GPU health: sampling %d device(s) every %g s", len(health.device_ids), health.thresholds.interval_s
    )
    return health


async def monitor(health: DeviceHealth) -> None:
    """Sample every ``interval_s`` until cancelled (the server owns the task)."""
    while True:
        await asyncio.to_thread(health.sample)
        await asyncio.sleep(health.thresholds.interval_s)


_current: list[DeviceHealth] = []


def set_current_health(health: DeviceHealth | None) -> None:
    """The server's device health, read by levels on a device (None: off)."""
    _current.clear()
    if health is not None:
        _current.append(health)


def current_health() -> DeviceHealth | None:
    return _current[0] if _current else None
