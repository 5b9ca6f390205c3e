"""Device health from a fake NVML module: thresholds over consecutive samples, ECC, gauges,
traffic held off an unhealthy device, and a clean skip without NVML."""

from __future__ import annotations

import gc
import logging
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from ortserve.core.marks import unmark
from ortserve.resilience.breaker import Breaker, BreakerPolicy
from ortserve.resilience.chain import FallbackChain
from ortserve.resilience.levels import Level
from ortserve.resilience.nvml import (
    DeviceHealth,
    current_health,
    load_nvml,
    set_current_health,
    start_health,
)
from ortserve.testing import FakeClock


@dataclass
class Gpu:
    utilization: float = 30.0
    used: int = 1 << 30
    total: int = 16 << 30
    temperature: float = 60.0
    ecc: int | None = 0


class NVMLError(Exception):
    pass


def fake_nvml(gpus: list[Gpu]) -> types.ModuleType:
    """The functions of pynvml that ortserve calls, over ``gpus``."""
    module = types.ModuleType("fake_pynvml")
    module.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    module.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1  # type: ignore[attr-defined]
    module.NVML_VOLATILE_ECC = 0  # type: ignore[attr-defined]

    def ecc(gpu: Gpu, kind: int, counter: int) -> int:
        if gpu.ecc is None:
            raise NVMLError("Not Supported")
        return gpu.ecc

    functions = {
        "nvmlInit": lambda: None,
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": lambda i: gpus[i],
        "nvmlDeviceGetUtilizationRates": lambda g: types.SimpleNamespace(gpu=g.utilization, memory=0),
        "nvmlDeviceGetMemoryInfo": lambda g: types.SimpleNamespace(
            used=g.used, total=g.total, free=g.total - g.used
        ),
        "nvmlDeviceGetTemperature": lambda g, sensor: g.temperature,
        "nvmlDeviceGetTotalEccErrors": ecc,
    }
    for name, function in functions.items():
        setattr(module, name, function)
    return module


@pytest.fixture(autouse=True)
def no_current_health() -> Iterator[None]:
    yield
    set_current_health(None)


def test_a_device_is_unhealthy_after_three_bad_samples_and_healthy_after_one_good() -> None:
    gpus = [Gpu(), Gpu()]
    health = DeviceHealth(fake_nvml(gpus))
    gpus[1].temperature = 90
    health.sample()
    health.sample()
    assert health.reason(1) is None  # two samples are not enough
    health.sample()
    assert health.reason(1) == "GPU 1: temperature 90 C > 85 C (3 samples in a row)"
    assert health.reason(0) is None
    gpus[1].temperature = 70
    health.sample()
    assert health.reason(1) is None


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"utilization": 97.0}, "utilisation 97% > 95%"),
        ({"used": 15 << 30}, "memory 93.8% > 92%"),
        ({"temperature": 86.0}, "temperature 86 C > 85 C"),
    ],
)
def test_each_threshold_counts(change: dict[str, float], problem: str) -> None:
    gpu = Gpu()
    health = DeviceHealth(fake_nvml([gpu]))
    for key, value in change.items():
        setattr(gpu, key, value)
    for _ in range(3):
        health.sample()
    reason = health.reason(0)
    assert reason is not None and problem in reason


def test_new_ecc_errors_count_and_devices_without_ecc_are_fine() -> None:
    gpus = [Gpu(ecc=5), Gpu(ecc=None)]
    health = DeviceHealth(fake_nvml(gpus))
    health.sample()  # 5 already there at start: not new
    assert health.reason(0) is None
    for _ in range(3):
        gpus[0].ecc = (gpus[0].ecc or 0) + 1
        health.sample()
    assert "1 new uncorrected ECC errors" in (health.reason(0) or "")
    assert health.reason(1) is None


def test_gpu_gauges_are_exported(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [Gpu(utilization=42.0, temperature=70.0, ecc=3)]
    monkeypatch.setitem(sys.modules, "fake_pynvml", fake_nvml(gpus))
    registry = CollectorRegistry()
    health = start_health(registry, "fake_pynvml")
    assert health is not None and current_health() is health
    text = generate_latest(registry).decode()
    assert 'ortserve_gpu_utilization_percent{device="0"} 42.0' in text
    assert 'ortserve_gpu_temperature_celsius{device="0"} 70.0' in text
    assert 'ortserve_gpu_memory_total_bytes{device="0"} 1.7179869184e+10' in text
    assert 'ortserve_gpu_ecc_errors{device="0"} 3.0' in text
    assert 'ortserve_gpu_unhealthy{device="0"} 0.0' in text


def test_without_nvml_installed_health_is_skipped_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """A CPU start logs nothing about NVML at INFO (issue 31); DEBUG says why it is off."""
    with caplog.at_level(logging.INFO, logger="ortserve.resilience.nvml"):
        assert load_nvml("ortserve_no_such_nvml_module") is None
        assert start_health(CollectorRegistry(), "ortserve_no_such_nvml_module") is None
    assert caplog.text == ""
    assert current_health() is None
    with caplog.at_level(logging.DEBUG, logger="ortserve.resilience.nvml"):
        load_nvml("ortserve_no_such_nvml_module")
    assert "GPU health checks off: NVML not installed" in caplog.text


class Constant:
    """A level answering a constant (the levels' sessions are not what this test is about)."""

    def __init__(self, index: int, value: float) -> None:
        self.index, self.name, self.value = index, f"L{index}", value

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [np.full((1, 1), self.value, dtype=np.float32)]

    def probe(self) -> None:
        return None


def test_an_unhealthy_device_moves_traffic_to_the_next_level_and_back() -> None:
    gpus = [Gpu(), Gpu()]
    health = DeviceHealth(fake_nvml(gpus))
    set_current_health(health)
    clock = FakeClock()
    levels: list[Level] = [Constant(0, 0.0), Constant(1, 1.0)]
    breakers = [Breaker(BreakerPolicy(), clock.now) for _ in (0, 1)]
    for device, breaker in enumerate(breakers):
        health.watch(device, breaker)
    chain = FallbackChain("m", None, levels, breakers)
    chain.armed = True
    gpus[0].utilization = 99
    for _ in range(3):
        health.sample()
    outputs, degraded = unmark(chain.run([], {}))
    assert degraded is not None and degraded.level == 1 and "GPU 0: utilisation 99% > 95%" in degraded.reason
    gpus[0].utilization = 10
    health.sample()
    outputs, degraded = unmark(chain.run([], {}))
    assert degraded is None and outputs[0][0, 0] == 0.0


def test_a_breaker_watching_an_unhealthy_device_is_held_at_once_and_dropped_with_its_version() -> None:
    gpus = [Gpu(temperature=90.0)]
    health = DeviceHealth(fake_nvml(gpus))
    for _ in range(3):
        health.sample()
    breaker = Breaker(BreakerPolicy(), FakeClock().now)
    health.watch(0, breaker)  # a version loaded while its GPU is already unhealthy
    assert not breaker.allows and breaker.reason.startswith("GPU 0: temperature 90 C > 85 C")
    gpus[0].temperature = 60.0
    health.sample()
    assert breaker.allows
    del breaker  # unloaded: the health monitor keeps no version alive
    gc.collect()
    assert not list(health._watchers[0])
