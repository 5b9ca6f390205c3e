"""The ctypes layer's copies on real device memory: run by benchmarks/gpu/check.sh where a GPU is lent."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from ortserve.core.cuda_ipc import CudaUnavailable, cuda_runtime


def _runtime() -> object | None:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None
    try:
        return cuda_runtime()
    except CudaUnavailable:
        return None


pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        _runtime() is None, reason="needs onnxruntime-gpu and a usable CUDA runtime and device"
    ),
]


def test_copies_to_from_and_within_device_memory_round_trip() -> None:
    runtime = cuda_runtime()
    runtime.set_device(0)
    device = ort.OrtValue.ortvalue_from_shape_and_type([4, 16], np.float32, "cuda", 0)
    base = int(device.data_ptr())
    x = np.arange(64, dtype=np.float32).reshape(4, 16)
    runtime.copy_from_host(base, int(x.ctypes.data), x.nbytes)
    np.testing.assert_array_equal(device.numpy(), x)
    runtime.copy_2d(base + 8 * 4, 16 * 4, base, 16 * 4, 8 * 4, 4)  # each row's first half onto its second
    back = np.empty_like(x)
    runtime.copy_to_host(int(back.ctypes.data), base, x.nbytes)
    np.testing.assert_array_equal(back[:, 8:], x[:, :8])
    size = runtime.allocation_size(base)
    assert size is None or size >= x.nbytes
