"""A test double of ortserve.core.cuda_ipc's CUDA runtime: "device" memory is host memory.

Clients export allocations (:meth:`FakeCuda.export`) and get the 64-byte handle a real
``cudaIpcGetMemHandle`` would give; the server side opens it and copies through the same
calls as :class:`~ortserve.core.cuda_ipc.LibCudart`. Every call is recorded, so tests can
prove what the binding path asks of CUDA, and copies really move bytes (``memmove``).
"""

from __future__ import annotations

import ctypes
import secrets
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ortserve.core.cuda_ipc import CudaError


@dataclass
class FakeCuda:
    devices: int = 1
    calls: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    exported: dict[bytes, npt.NDArray[np.uint8]] = field(default_factory=dict)
    opened: dict[int, int] = field(default_factory=dict)
    """Open IPC mappings: pointer -> times opened and not closed."""
    report_size: bool = True
    current: int = 0

    def export(self, size: int) -> tuple[bytes, npt.NDArray[np.uint8]]:
        """A client's allocation of ``size`` bytes and its IPC handle."""
        memory = np.zeros(size, dtype=np.uint8)
        handle = secrets.token_bytes(64)
        self.exported[handle] = memory
        return handle, memory

    def _memory(self, pointer: int, size: int) -> None:
        """Raise unless ``[pointer, pointer + size)`` lies in an opened allocation (a fault)."""
        for memory in self.exported.values():
            base = memory.ctypes.data
            if base in self.opened and base <= pointer and pointer + size <= base + memory.nbytes:
                return
        raise AssertionError(f"device access outside every opened allocation: {pointer:#x}+{size}")

    def device_count(self) -> int:
        self.calls.append(("device_count", ()))
        return self.devices

    def set_device(self, device: int) -> None:
        self.calls.append(("set_device", (device,)))
        if not 0 <= device < self.devices:
            raise CudaError("cudaSetDevice failed: invalid device ordinal (101)")
        self.current = device

    def open_ipc_handle(self, handle: bytes) -> int:
        self.calls.append(("open_ipc_handle", ()))
        memory = self.exported.get(handle)
        if memory is None:
            raise CudaError("cudaIpcOpenMemHandle failed: invalid resource handle (400)")
        pointer = int(memory.ctypes.data)
        self.opened[pointer] = self.opened.get(pointer, 0) + 1
        return pointer

    def close_ipc_handle(self, pointer: int) -> None:
        self.calls.append(("close_ipc_handle", (pointer,)))
        count = self.opened.pop(pointer)
        if count > 1:
            self.opened[pointer] = count - 1

    def allocation_size(self, pointer: int) -> int | None:
        if not self.report_size:
            return None
        for memory in self.exported.values():
            if memory.ctypes.data == pointer:
                return int(memory.nbytes)
        return None

    def copy_to_host(self, destination: int, source: int, size: int) -> None:
        self.calls.append(("copy_to_host", (source, size)))
        self._memory(source, size)
        ctypes.memmove(destination, source, size)

    def copy_from_host(self, destination: int, source: int, size: int) -> None:
        self.calls.append(("copy_from_host", (destination, size)))
        self._memory(destination, size)
        ctypes.memmove(destination, source, size)

    def copy_within(self, destination: int, source: int, size: int) -> None:
        self.calls.append(("copy_within", (destination, source, size)))
        ctypes.memmove(destination, source, size)

    def copy_2d(
        self, destination: int, destination_pitch: int, source: int, source_pitch: int, width: int, rows: int
    ) -> None:
        self.calls.append(("copy_2d", (destination_pitch, source_pitch, width, rows)))
        for row in range(rows):
            ctypes.memmove(destination + row * destination_pitch, source + row * source_pitch, width)
