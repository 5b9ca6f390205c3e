"""Pinned host staging of the binding path's inputs (core/binding.py), on the CPU: which memory
is chosen (the allocation injected: this ONNX Runtime has no ``cuda_pinned``), the log line that
says so, and runs through the staging tensors equal to session.run with the arena bounded."""

from __future__ import annotations

import logging

import numpy as np
import onnxruntime as ort
import pytest

from binding_models import TYPES, every_type_feeds, every_type_model
from model_builders import serialized
from ortserve.core.binding import PINNED, BindingRun, DeviceSpec, staging_memory


class PinnedStandIn:
    """Allocates ``cuda_pinned`` tensors as host tensors (what pinned memory is to the CPU) and
    records every allocation's device name."""

    def __init__(self, available: bool = True) -> None:
        self.available = available
        self.kinds: list[str] = []

    def __call__(self, shape: list[int], dtype: np.dtype[np.generic], kind: str, index: int) -> ort.OrtValue:
        self.kinds.append(kind)
        if kind == PINNED and not self.available:
            raise Exception("Unsupported device type: cuda_pinned")  # what a CPU build raises
        return ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, "cpu" if kind == PINNED else kind, 0)


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    return ort.InferenceSession(serialized(every_type_model()), providers=["CPUExecutionProvider"])


def test_cuda_stages_inputs_in_pinned_memory_where_it_can_be_allocated() -> None:
    stand_in = PinnedStandIn()
    staging, why = staging_memory(DeviceSpec("cuda", 2), stand_in)
    assert staging == DeviceSpec(PINNED, 2) and "pinned" in why
    assert stand_in.kinds == [PINNED]


def test_without_pinned_memory_inputs_go_straight_to_the_device_and_the_log_says_why() -> None:
    staging, why = staging_memory(DeviceSpec("cuda", 0), PinnedStandIn(available=False))
    assert staging is None and "pinned host memory unavailable (Unsupported device type" in why


def test_the_real_cpu_build_has_no_pinned_memory_and_a_host_session_asks_for_none() -> None:
    assert staging_memory(DeviceSpec("cuda", 0))[0] is None  # this onnxruntime: CPU only
    stand_in = PinnedStandIn()
    assert staging_memory(DeviceSpec("cpu"), stand_in)[0] is None and stand_in.kinds == []


def test_the_load_log_line_names_the_staging_memory(
    session: ort.InferenceSession, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="ortserve.core.binding"):
        BindingRun(
            session,
            ["mm"],
            DeviceSpec("cpu"),
            staging=DeviceSpec(PINNED),
            allocate=PinnedStandIn(),
            label="m/1",
        )
        BindingRun(session, ["mm"], DeviceSpec("cuda"), allocate=PinnedStandIn(available=False), label="m/2")
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0] == "m/1: IOBinding data path on cpu:0, inputs staged in cuda_pinned memory"
    assert lines[1].startswith("m/2: IOBinding data path on cuda:0, pinned host memory unavailable")


def test_staged_runs_equal_session_run_and_reuse_a_bounded_arena(session: ort.InferenceSession) -> None:
    names = [arg.name for arg in session.get_outputs()]
    stand_in = PinnedStandIn()
    bound = BindingRun(
        session, names, DeviceSpec("cpu"), arena_shapes=8, staging=DeviceSpec(PINNED), allocate=stand_in
    )
    kept = []
    for index in range(60):
        feeds = every_type_feeds(1 + index % 5, index)
        got, want = bound(feeds), session.run(names, feeds)
        kept.append((got, want))
        for name, g, w in zip(names, got, want):
            assert g.dtype == w.dtype and g.shape == w.shape, name
            np.testing.assert_array_equal(g, w, err_msg=name)
        assert bound.arena_size() <= 8
    for got, want in kept:  # what a caller was handed stays its own
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    pinned = stand_in.kinds.count(PINNED)
    assert pinned >= len(TYPES) and stand_in.kinds.count("cpu") > 0  # inputs pinned, outputs on the device


def test_a_shape_seen_before_reuses_its_staging_tensors(session: ort.InferenceSession) -> None:
    names = [arg.name for arg in session.get_outputs()]
    stand_in = PinnedStandIn()
    bound = BindingRun(
        session, names, DeviceSpec("cpu"), arena_shapes=32, staging=DeviceSpec(PINNED), allocate=stand_in
    )
    bound(every_type_feeds(4, 0))
    allocations = len(stand_in.kinds)
    for seed in range(1, 20):
        got = bound(every_type_feeds(4, seed))
        for g, w in zip(got, session.run(names, every_type_feeds(4, seed))):
            np.testing.assert_array_equal(g, w)
    assert len(stand_in.kinds) == allocations


def test_pinned_tensors_come_from_the_cuda_providers_host_accessible_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ONNX Runtime 1.32's Python API names no ``cuda_pinned`` device: pinned memory is the CUDA
    provider's host-accessible memory info (``OrtEpDevice.memory_info(HOST_ACCESSIBLE)``)."""
    from ortserve.core import binding

    asked: list[object] = []
    pinned = object()

    class CudaDevice:
        ep_name = "CUDAExecutionProvider"

        def memory_info(self, kind: object) -> object:
            asked.append(kind)
            return pinned

    class CpuDevice:
        ep_name = "CPUExecutionProvider"

    made: list[dict[str, object]] = []
    real = ort.OrtValue.ortvalue_from_shape_and_type

    def from_shape_and_type(
        shape: list[int], dtype: np.dtype[np.generic], *args: object, **kwargs: object
    ) -> ort.OrtValue:
        made.append(kwargs)
        return real(shape, dtype)  # host memory standing for the pinned allocator's

    monkeypatch.setattr(ort, "get_ep_devices", lambda: [CpuDevice(), CudaDevice()])
    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_shape_and_type", staticmethod(from_shape_and_type))
    binding._pinned_memory.cache_clear()
    try:
        staging, why = staging_memory(DeviceSpec("cuda", 0))
    finally:
        binding._pinned_memory.cache_clear()
    assert staging == DeviceSpec(PINNED, 0) and "pinned" in why
    assert asked == [ort.OrtDeviceMemoryType.HOST_ACCESSIBLE]
    assert made == [{"memory_info": pinned}]
