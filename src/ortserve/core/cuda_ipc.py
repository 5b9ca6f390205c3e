"""The few CUDA runtime calls ortserve makes itself, through ctypes, loaded only when asked.

CUDA shared memory (Triton's extension) hands the server a client's ``cudaIpcMemHandle_t``; the
server opens it with ``cudaIpcOpenMemHandle`` and copies between the region and host memory
with ``cudaMemcpy``; the LLM's keys and values on the device are moved within device memory
the same way. ortserve has no hard dependency on CUDA: :func:`cuda_runtime` dlopens
``libcudart`` (the one onnxruntime-gpu's CUDA provider already loaded, when it is) on first
use and raises :class:`CudaUnavailable` with the reason where there is none.

Everything above this module talks to the :class:`CudaRuntime` protocol, so tests drive the
registry and the binding path with a fake (``tests/core/fake_cuda.py``) on a machine without
a GPU; :class:`HostMemory` is the same face over host pointers (``memmove``), which lets the
device code paths run on the CPU with ``cpu`` OrtValues.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import sys
import threading
from typing import Final, Protocol

__all__ = [
    "IPC_HANDLE_SIZE",
    "CudaError",
    "CudaRuntime",
    "CudaUnavailable",
    "HostMemory",
    "LibCudart",
    "MemoryOps",
    "cuda_runtime",
]

IPC_HANDLE_SIZE: Final = 64
"""Bytes of a ``cudaIpcMemHandle_t`` (CUDA_IPC_HANDLE_SIZE)."""

_LAZY_ENABLE_PEER_ACCESS: Final = 1
_HOST_TO_DEVICE: Final = 1
_DEVICE_TO_HOST: Final = 2
_DEVICE_TO_DEVICE: Final = 3
_LIBRARY_NAMES: Final = (
    "libcudart.so",
    "libcudart.so.13",
    "libcudart.so.12",
    "libcudart.so.11.0",
)


class CudaUnavailable(RuntimeError):
    """No CUDA runtime can be loaded here (no libcudart, no driver, no device)."""


class CudaError(RuntimeError):
    """A CUDA runtime call failed; the message names the call and CUDA's own reason."""


class MemoryOps(Protocol):
    """Copies between pointers of one kind of memory and the host."""

    def copy_to_host(self, destination: int, source: int, size: int) -> None: ...

    def copy_from_host(self, destination: int, source: int, size: int) -> None: ...

    def copy_within(self, destination: int, source: int, size: int) -> None: ...

    def copy_2d(
        self, destination: int, destination_pitch: int, source: int, source_pitch: int, width: int, rows: int
    ) -> None:
        """``rows`` rows of ``width`` bytes each, rows ``*_pitch`` bytes apart (within the memory)."""


class CudaRuntime(MemoryOps, Protocol):
    """What ortserve asks of the CUDA runtime: IPC handles and copies on a chosen device."""

    def device_count(self) -> int: ...

    def set_device(self, device: int) -> None: ...

    def open_ipc_handle(self, handle: bytes) -> int:
        """The device pointer a client's IPC handle names in this process."""

    def close_ipc_handle(self, pointer: int) -> None: ...

    def allocation_size(self, pointer: int) -> int | None:
        """Bytes of the allocation starting at ``pointer``, or None when the driver cannot say."""


class HostMemory:
    """:class:`MemoryOps` over host pointers: the device code paths, run on the CPU."""

    def copy_to_host(self, destination: int, source: int, size: int) -> None:
        ctypes.memmove(destination, source, size)

    def copy_from_host(self, destination: int, source: int, size: int) -> None:
        ctypes.memmove(destination, source, size)

    def copy_within(self, destination: int, source: int, size: int) -> None:
        ctypes.memmove(destination, source, size)

    def copy_2d(
        self, destination: int, destination_pitch: int, source: int, source_pitch: int, width: int, rows: int
    ) -> None:
        for row in range(rows):
            ctypes.memmove(destination + row * destination_pitch, source + row * source_pitch, width)


class _IpcHandle(ctypes.Structure):
    _fields_ = (("reserved", ctypes.c_char * IPC_HANDLE_SIZE),)


class LibCudart:
    """:class:`CudaRuntime` over ``libcudart`` (and ``libcuda`` for allocation sizes)."""

    def __init__(self, library: ctypes.CDLL, driver: ctypes.CDLL | None) -> None:
        self._lib = library
        self._driver = driver
        library.cudaGetErrorString.restype = ctypes.c_char_p
        library.cudaGetErrorString.argtypes = (ctypes.c_int,)
        library.cudaIpcOpenMemHandle.argtypes = (ctypes.POINTER(ctypes.c_void_p), _IpcHandle, ctypes.c_uint)
        library.cudaIpcCloseMemHandle.argtypes = (ctypes.c_void_p,)
        library.cudaMemcpy.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        library.cudaMemcpy2D.argtypes = (
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_size_t,
            ctypes.c_size_t,
            ctypes.c_int,
        )
        library.cudaSetDevice.argtypes = (ctypes.c_int,)
        library.cudaGetDeviceCount.argtypes = (ctypes.POINTER(ctypes.c_int),)
        if driver is not None:
            driver.cuMemGetAddressRange_v2.argtypes = (
                ctypes.POINTER(ctypes.c_uint64),
                ctypes.POINTER(ctypes.c_size_t),
                ctypes.c_uint64,
            )

    def _check(self, call: str, code: int) -> None:
        if code != 0:
            reason = self._lib.cudaGetErrorString(code)
            text = reason.decode(errors="replace") if isinstance(reason, bytes) else str(code)
            raise CudaError(f"{call} failed: {text} ({code})")

    def device_count(self) -> int:
        count = ctypes.c_int(0)
        self._check("cudaGetDeviceCount", self._lib.cudaGetDeviceCount(ctypes.byref(count)))
        return int(count.value)

    def set_device(self, device: int) -> None:
        self._check("cudaSetDevice", self._lib.cudaSetDevice(device))

    def open_ipc_handle(self, handle: bytes) -> int:
        if len(handle) != IPC_HANDLE_SIZE:
            raise CudaError(f"an IPC handle holds {IPC_HANDLE_SIZE} bytes, not {len(handle)}")
        pointer = ctypes.c_void_p()
        structure = _IpcHandle.from_buffer_copy(handle)
        code = self._lib.cudaIpcOpenMemHandle(ctypes.byref(pointer), structure, _LAZY_ENABLE_PEER_ACCESS)
        self._check("cudaIpcOpenMemHandle", code)
        return int(pointer.value or 0)

    def close_ipc_handle(self, pointer: int) -> None:
        self._check("cudaIpcCloseMemHandle", self._lib.cudaIpcCloseMemHandle(ctypes.c_void_p(pointer)))

    def allocation_size(self, pointer: int) -> int | None:
        if self._driver is None:
            return None
        base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
        code = self._driver.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), pointer)
        if code != 0:
            return None
        return int(size.value) - (pointer - int(base.value))

    def _copy(self, destination: int, source: int, size: int, kind: int) -> None:
        code = self._lib.cudaMemcpy(ctypes.c_void_p(destination), ctypes.c_void_p(source), size, kind)
        self._check("cudaMemcpy", code)

    def copy_to_host(self, destination: int, source: int, size: int) -> None:
        self._copy(destination, source, size, _DEVICE_TO_HOST)

    def copy_from_host(self, destination: int, source: int, size: int) -> None:
        self._copy(destination, source, size, _HOST_TO_DEVICE)

    def copy_within(self, destination: int, source: int, size: int) -> None:
        self._copy(destination, source, size, _DEVICE_TO_DEVICE)

    def copy_2d(
        self, destination: int, destination_pitch: int, source: int, source_pitch: int, width: int, rows: int
    ) -> None:
        code = self._lib.cudaMemcpy2D(
            ctypes.c_void_p(destination),
            destination_pitch,
            ctypes.c_void_p(source),
            source_pitch,
            width,
            rows,
            _DEVICE_TO_DEVICE,
        )
        self._check("cudaMemcpy2D", code)


def _candidates() -> list[str]:
    """Library names and paths to try: the loader's, then the nvidia-*-cu* wheels' folders."""
    names = list(_LIBRARY_NAMES)
    found = ctypes.util.find_library("cudart")
    if found:
        names.insert(0, found)
    for entry in sys.path:
        names.extend(sorted(glob.glob(os.path.join(entry, "nvidia", "cuda_runtime", "lib", "libcudart.so*"))))
    return names


_lock = threading.Lock()


@functools.cache
def _load() -> LibCudart | str:
    errors = []
    for name in _candidates():
        try:
            library = ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
            continue
        try:
            driver: ctypes.CDLL | None = ctypes.CDLL("libcuda.so.1")
        except OSError:
            driver = None
        runtime = LibCudart(library, driver)
        try:
            if runtime.device_count() < 1:
                return "the CUDA runtime sees no device"
        except CudaError as exc:
            return f"the CUDA runtime is loaded but unusable: {exc}"
        return runtime
    return "no CUDA runtime library (libcudart) can be loaded" + (f": {errors[-1]}" if errors else "")


def cuda_runtime() -> CudaRuntime:
    """The process's CUDA runtime, loaded once.

    Raises:
        CudaUnavailable: with the reason (no library, no driver, no device).
    """
    with _lock:
        loaded = _load()
    if isinstance(loaded, str):
        raise CudaUnavailable(loaded)
    return loaded
