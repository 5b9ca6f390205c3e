"""The ctypes layer over libcudart, against a stand-in library: the calls, their arguments and
how CUDA's error codes become errors. (The real library is exercised by benchmarks/gpu/check.sh.)"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ortserve.core import cuda_ipc
from ortserve.core.cuda_ipc import CudaError, CudaUnavailable, LibCudart


class _Function:
    """A C function as ctypes shows it: callable, with argtypes and restype to set."""

    def __init__(self, body: Callable[..., Any]) -> None:
        self.body = body
        self.argtypes: tuple[Any, ...] = ()
        self.restype: Any = ctypes.c_int

    def __call__(self, *args: Any) -> Any:
        return self.body(*args)


class _Library:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.handles: dict[bytes, int] = {}
        self.memory = np.arange(256, dtype=np.uint8)

        def record(name: str, body: Callable[..., int]) -> _Function:
            def call(*args: Any) -> Any:
                self.calls.append((name, args))
                return body(*args)

            return _Function(call)

        def open_handle(pointer: Any, handle: Any, flags: int) -> int:
            raw = ctypes.string_at(ctypes.addressof(handle), 64)  # all 64 bytes, NULs too
            if raw not in self.handles:
                return 400  # cudaErrorInvalidResourceHandle
            pointer._obj.value = self.handles[raw]
            return 0

        def count(result: Any) -> int:
            result._obj.value = 2
            return 0

        def memcpy(destination: Any, source: Any, size: int, kind: int) -> int:
            ctypes.memmove(destination.value, source.value, size)
            return 0

        def address_range(base: Any, size: Any, pointer: int) -> int:
            base._obj.value = int(self.memory.ctypes.data)
            size._obj.value = self.memory.nbytes
            return 0

        self.cudaGetErrorString = _Function(lambda code: {400: b"invalid resource handle"}.get(code, b"?"))
        self.cudaIpcOpenMemHandle = record("open", open_handle)
        self.cudaIpcCloseMemHandle = record("close", lambda pointer: 0)
        self.cudaMemcpy = record("memcpy", memcpy)
        self.cudaMemcpy2D = record("memcpy2d", lambda *args: 0)
        self.cudaSetDevice = record("set_device", lambda device: 0 if device < 2 else 101)
        self.cudaGetDeviceCount = record("count", count)
        self.cuMemGetAddressRange_v2 = record("range", address_range)


def test_the_ctypes_calls_carry_the_handle_the_pointers_and_map_errors() -> None:
    library = _Library()
    handle = bytes(range(64))
    library.handles[handle] = int(library.memory.ctypes.data) + 16
    runtime = LibCudart(library, library)  # type: ignore[arg-type]
    assert library.cudaIpcOpenMemHandle.argtypes[2] is ctypes.c_uint
    assert runtime.device_count() == 2
    runtime.set_device(1)
    pointer = runtime.open_ipc_handle(handle)
    assert pointer == library.memory.ctypes.data + 16
    assert runtime.allocation_size(pointer) == 256 - 16  # what lies after the pointer
    host = np.zeros(8, dtype=np.uint8)
    runtime.copy_to_host(int(host.ctypes.data), pointer, 8)
    assert host.tolist() == list(range(16, 24))
    assert library.calls[-1][1][3] == 2  # cudaMemcpyDeviceToHost
    runtime.copy_from_host(pointer, int(np.full(4, 9, np.uint8).ctypes.data), 4)
    assert library.calls[-1][1][3] == 1 and library.memory[16:20].tolist() == [9] * 4
    runtime.copy_within(pointer, pointer + 8, 0)
    assert library.calls[-1][1][3] == 3
    runtime.close_ipc_handle(pointer)
    assert library.calls[-1][0] == "close"
    with pytest.raises(CudaError, match=r"cudaIpcOpenMemHandle failed: invalid resource handle \(400\)"):
        runtime.open_ipc_handle(bytes(64))
    with pytest.raises(CudaError, match="64 bytes"):
        runtime.open_ipc_handle(b"short")
    with pytest.raises(CudaError, match="cudaSetDevice failed"):
        runtime.set_device(5)
    assert LibCudart(library, None).allocation_size(pointer) is None  # type: ignore[arg-type]


def test_without_a_loadable_library_the_reason_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_ipc, "_candidates", lambda: ["libcudart-that-does-not-exist.so"])
    cuda_ipc._load.cache_clear()
    try:
        with pytest.raises(CudaUnavailable, match="no CUDA runtime library"):
            cuda_ipc.cuda_runtime()
    finally:
        cuda_ipc._load.cache_clear()
