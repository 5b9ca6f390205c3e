"""CUDA shared-memory regions (Triton's extension): a client's device memory, opened by IPC handle.

A client on the same host allocates device memory, exports it with ``cudaIpcGetMemHandle``
(tritonclient.utils.cuda_shared_memory does both) and registers the 64-byte handle, the device
and the byte size under a name. Infer requests then name a window of the region in a tensor's
``shared_memory_region`` / ``_offset`` / ``_byte_size`` parameters, as for system shared memory.

What the server does with a window:

- an input is copied device-to-host once (``cudaMemcpy``) when the request is decoded, into a
  host buffer (:class:`HostCopy`) that remembers its window: the validator, traffic captures and
  the batcher (which joins several requests in host memory) read it;
- an output is copied host-to-device into the window before the answer is sent (no data on the
  wire);
- a request that runs alone on a CUDA or TensorRT session (the binding path,
  :class:`~ortserve.core.binding.BindingRun`) with every input a whole window is run straight on
  the windows: its inputs bound by device pointer (:meth:`CudaRegion.bind_input`; the host copy
  is not uploaded again), and each output the request put in a window of its exact size bound
  to that window (:meth:`CudaWindow.bind`; ONNX Runtime writes the answer there and the copy
  into the window is skipped). The DataPlane hands the request's output windows to its input
  windows (:func:`link_outputs`). A batch of several requests takes the copy path.

Safety: the extension is off unless ``--cuda-shared-memory-regions N`` is given; every window
is checked against the registered byte size, and the registered size against the size of the
allocation the handle names (``cuMemGetAddressRange``), so a client cannot make the server read
or write outside memory it exported. A region unregistered while a copy is in flight is closed
when the copy ends. The CUDA runtime is loaded on the first registration (no dependency
otherwise); without one every call answers 501 with the reason.

System and CUDA regions share one namespace (:class:`SharedMemoryRegions`), as in Triton. With
CUDA shared memory off (the default) the server keeps the plain system registry
(:func:`shared_memory_registry`), so nothing is added to a request's path.
"""

from __future__ import annotations

import base64
import binascii
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from ortserve.core.cuda_ipc import IPC_HANDLE_SIZE, CudaError, CudaRuntime, CudaUnavailable, cuda_runtime
from ortserve.core.cuda_windows import CudaWindow, HostCopy, InputWindow
from ortserve.core.shared_memory import (
    BYTE_SIZE,
    CUDA_NOT_SUPPORTED,
    REGION,
    SHM_DIRECTORY,
    SharedMemoryRegistry,
    Window,
    _reference,
)
from ortserve.core.types import Parameters, RequestedOutput
from ortserve.errors import InvalidInput, NotImplementedByServer

__all__ = [
    "CUDA_OFF",
    "CudaRegion",
    "CudaRegionStatus",
    "CudaSharedMemoryRegistry",
    "SharedMemoryRegions",
    "decode_raw_handle",
    "shared_memory_registry",
]

CUDA_OFF: Final = "CUDA shared memory is off; start the server with --cuda-shared-memory-regions N"
_MAX_NAME_LENGTH: Final = 255


@dataclass(frozen=True, slots=True)
class CudaRegionStatus:
    """What the status calls report about one CUDA region."""

    name: str
    device_id: int
    byte_size: int


class CudaRegion:
    """One opened IPC handle: ``byte_size`` bytes of device memory at ``pointer``.

    Copies hold the region (a count); closing it while one runs defers
    ``cudaIpcCloseMemHandle`` to the copy's end, so no copy touches a closed mapping.
    """

    __slots__ = ("_closed", "_lock", "_runtime", "_users", "kind", "pointer", "status")

    def __init__(
        self, status: CudaRegionStatus, pointer: int, runtime: CudaRuntime, kind: str = "cuda"
    ) -> None:
        self.status = status
        self.pointer = pointer
        self.kind = kind
        """ONNX Runtime's name of the memory (``cuda``; ``cpu`` when a test runs it on the host)."""
        self._runtime = runtime
        self._lock = threading.Lock()
        self._users = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def check(self, offset: int, size: int, what: str) -> None:
        """Raises InvalidInput unless ``[offset, offset + size)`` lies within the region."""
        region = self.status
        if offset < 0 or size < 0 or offset + size > region.byte_size:
            raise InvalidInput(
                f"{what}: shared-memory offset {offset} + byte size {size} exceeds the "
                f"{region.byte_size} bytes of CUDA region {region.name!r}"
            )

    def _acquire(self, what: str) -> None:
        with self._lock:
            if self._closed:
                raise InvalidInput(f"{what}: CUDA region {self.status.name!r} was unregistered")
            self._users += 1

    def _release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._closed and self._users == 0
        if last:
            self._runtime.close_ipc_handle(self.pointer)

    def read(self, offset: int, size: int, what: str) -> memoryview:
        """A host copy of ``size`` bytes at ``offset`` (one device-to-host copy); the copy
        remembers its window (:func:`input_window`), so a run of this request alone can bind
        the window itself instead of uploading the copy."""
        self.check(offset, size, what)
        buffer = HostCopy.of(InputWindow(self, offset, size))
        if size:
            self._acquire(what)
            try:
                self._runtime.set_device(self.status.device_id)
                self._runtime.copy_to_host(int(buffer.ctypes.data), self.pointer + offset, size)
            finally:
                self._release()
        return buffer.data

    def write(self, offset: int, data: bytes | memoryview, what: str) -> None:
        """Copy ``data`` host-to-device at ``offset``."""
        size = len(data) if isinstance(data, bytes) else data.nbytes
        self.check(offset, size, what)
        if not size:
            return
        self._acquire(what)
        try:
            self._runtime.set_device(self.status.device_id)
            address = np.frombuffer(data, dtype=np.uint8).ctypes.data
            self._runtime.copy_from_host(self.pointer + offset, address, size)
        finally:
            self._release()

    def _bound(
        self, offset: int, shape: Sequence[int], dtype: np.dtype[np.generic], what: str
    ) -> tuple[list[int], int]:
        dims = [int(dim) for dim in shape]
        if any(dim < 0 for dim in dims):
            raise InvalidInput(f"{what}: negative dimension in {dims}")
        self.check(offset, math.prod(dims) * dtype.itemsize, what)
        self._acquire(what)
        return dims, self.pointer + offset

    def bind_input(
        self, binding: object, name: str, offset: int, shape: Sequence[int], dtype: np.dtype[np.generic]
    ) -> Callable[[], None]:
        """Bind an input straight to the window's device pointer; returns the release to call
        once the run is over (the region stays open until then)."""
        dims, address = self._bound(offset, shape, dtype, f"input {name!r}")
        try:
            binding.bind_input(name, self.kind, self.status.device_id, dtype, dims, address)  # type: ignore[attr-defined]
        except BaseException:
            self._release()  # not bound: nothing will call the release
            raise
        return self._release

    def bind_output(
        self, binding: object, name: str, offset: int, shape: Sequence[int], dtype: np.dtype[np.generic]
    ) -> Callable[[], None]:
        """Bind an output straight to the window: ONNX Runtime writes the answer into it."""
        dims, address = self._bound(offset, shape, dtype, f"output {name!r}")
        try:
            binding.bind_output(name, self.kind, self.status.device_id, dtype, dims, address)  # type: ignore[attr-defined]
        except BaseException:
            self._release()
            raise
        return self._release

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            last = self._users == 0
        if last:
            self._runtime.close_ipc_handle(self.pointer)


def decode_raw_handle(raw: object) -> bytes:
    """The IPC handle of an HTTP register body's ``raw_handle`` (``{"b64": ...}``, as tritonclient
    sends it).

    Raises:
        InvalidInput: not base64 of exactly 64 bytes.
    """
    encoded = raw.get("b64") if isinstance(raw, dict) else None
    if not isinstance(encoded, str):
        raise InvalidInput("'raw_handle' must be an object {\"b64\": <base64 of the cudaIpcMemHandle_t>}")
    try:
        handle = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("'raw_handle.b64' is not valid base64") from None
    return handle


class CudaSharedMemoryRegistry:
    """Registered CUDA regions, by name, at most ``max_regions`` at once (0: off).

    Args:
        max_regions: bound on registered regions; 0 turns the extension off.
        runtime: returns the CUDA runtime or raises :class:`CudaUnavailable` (tests pass a fake).
        taken: names held elsewhere in the same namespace (the system regions).
        memory_kind: ONNX Runtime's name of the regions' memory when a run binds them
            (``cuda``; tests of the served path on the CPU, whose fake device memory is host
            memory, pass ``cpu``).
    """

    def __init__(
        self,
        max_regions: int = 0,
        runtime: Callable[[], CudaRuntime] = cuda_runtime,
        taken: Callable[[str], bool] = lambda name: False,
        memory_kind: str = "cuda",
    ) -> None:
        self.max_regions = max_regions
        self._runtime = runtime
        self._taken = taken
        self._kind = memory_kind
        self._regions: dict[str, CudaRegion] = {}

    @property
    def enabled(self) -> bool:
        return self.max_regions > 0

    def __contains__(self, name: object) -> bool:
        return name in self._regions

    def ready(self) -> CudaRuntime:
        """The runtime, or 501 with why there is none (off, or no CUDA here)."""
        if not self.enabled:
            raise NotImplementedByServer(CUDA_OFF)
        try:
            return self._runtime()
        except CudaUnavailable as exc:
            raise NotImplementedByServer(f"{CUDA_NOT_SUPPORTED} ({exc})") from None

    def register(self, name: str, raw_handle: object, device_id: object, byte_size: object) -> None:
        """Open ``raw_handle`` on ``device_id`` as ``byte_size`` bytes under ``name``.

        Raises:
            InvalidInput: a bad or duplicate name, a handle that is not 64 bytes or that CUDA
                refuses, a bad device or size, a size beyond the exported allocation, the limit.
            NotImplementedByServer: the extension is off or there is no CUDA here.
        """
        runtime = self.ready()
        if not name or len(name) > _MAX_NAME_LENGTH:
            raise InvalidInput("a shared-memory region needs a name of 1 to 255 characters")
        if name in self._regions or self._taken(name):
            raise InvalidInput(f"shared-memory region {name!r} is already registered")
        if len(self._regions) >= self.max_regions:
            raise InvalidInput(
                f"{self.max_regions} CUDA shared-memory regions are registered, the most allowed; "
                "unregister one first"
            )
        if not isinstance(raw_handle, bytes) or len(raw_handle) != IPC_HANDLE_SIZE:
            raise InvalidInput(f"'raw_handle' must be the {IPC_HANDLE_SIZE} bytes of a cudaIpcMemHandle_t")
        for field, value in (("device_id", device_id), ("byte_size", byte_size)):
            if type(value) is not int or value < 0:
                raise InvalidInput(f"'{field}' must be a non-negative integer")
        assert isinstance(device_id, int) and isinstance(byte_size, int)
        if byte_size == 0:
            raise InvalidInput("'byte_size' must be positive")
        try:
            devices = runtime.device_count()
            if device_id >= devices:
                raise InvalidInput(f"'device_id' {device_id} names no device (this host has {devices})")
            runtime.set_device(device_id)
            pointer = runtime.open_ipc_handle(raw_handle)
        except CudaError as exc:
            raise InvalidInput(f"cannot open the CUDA IPC handle of region {name!r}: {exc}") from None
        exported = runtime.allocation_size(pointer)
        if exported is not None and exported < byte_size:
            runtime.close_ipc_handle(pointer)
            raise InvalidInput(
                f"CUDA region {name!r}: byte_size {byte_size} exceeds the {exported} bytes the handle exports"
            )
        self._regions[name] = CudaRegion(
            CudaRegionStatus(name, device_id, byte_size), pointer, runtime, self._kind
        )

    def unregister(self, name: str | None = None) -> None:
        """Close one region (or all with None); unknown names are no error, as in Triton."""
        self.ready()
        names = list(self._regions) if name is None else [name]
        for each in names:
            region = self._regions.pop(each, None)
            if region is not None:
                region.close()

    def status(self, name: str | None = None) -> list[CudaRegionStatus]:
        """Every registered region, or the one named (InvalidInput if it is not registered)."""
        self.ready()
        if name is None:
            return [region.status for region in self._regions.values()]
        return [self.region(name, None).status]

    def region(self, name: str, what: str | None) -> CudaRegion:
        region = self._regions.get(name)
        if region is None:
            prefix = "" if what is None else f"{what}: "
            raise InvalidInput(f"{prefix}CUDA shared-memory region {name[:80]!r} is not registered")
        return region

    def close(self) -> None:
        for region in self._regions.values():
            region.close()
        self._regions.clear()


class SharedMemoryRegions(SharedMemoryRegistry):
    """System and CUDA regions in one namespace; infer requests name either kind alike.

    Args:
        max_regions: system regions at most (0: system shared memory off).
        max_cuda_regions: CUDA regions at most (0: CUDA shared memory off).
        runtime: the CUDA runtime's loader (a fake in tests).
        memory_kind: see :class:`CudaSharedMemoryRegistry`.
    """

    def __init__(
        self,
        max_regions: int = 0,
        max_cuda_regions: int = 0,
        directory: Path = SHM_DIRECTORY,
        runtime: Callable[[], CudaRuntime] = cuda_runtime,
        memory_kind: str = "cuda",
    ) -> None:
        super().__init__(max_regions, directory)
        self.cuda = CudaSharedMemoryRegistry(max_cuda_regions, runtime, self._has_system, memory_kind)

    def _has_system(self, name: str) -> bool:
        return name in self._regions

    def register(self, name: str, key: object, offset: object, byte_size: object) -> None:
        if name in self.cuda:
            raise InvalidInput(f"shared-memory region {name!r} is already registered")
        super().register(name, key, offset, byte_size)

    def _is_cuda(self, region: object) -> bool:
        """Whether a tensor naming ``region`` is resolved among the CUDA regions (also when only
        CUDA shared memory is on, so that an unknown name is a 400, not system memory's 501)."""
        return isinstance(region, str) and (region in self.cuda or (self.cuda.enabled and not self.enabled))

    def view(self, parameters: Parameters, what: str) -> memoryview | None:
        region = parameters.get(REGION)
        if self._is_cuda(region):
            reference = _reference(parameters, what)
            assert reference is not None
            _, offset, size = reference
            return self.cuda.region(str(region), what).read(offset, size, what)
        return super().view(parameters, what)

    def output_targets(self, outputs: Sequence[RequestedOutput]) -> dict[str, Window] | None:
        targets: dict[str, Window] | None = None
        for output in outputs:
            region = output.parameters.get(REGION)
            if self._is_cuda(region):
                what = f"output {output.name!r}"
                reference = _reference(output.parameters, what)
                assert reference is not None
                _, offset, size = reference
                targets = targets or {}
                targets[output.name] = CudaWindow(self.cuda.region(str(region), what), offset, size, what)
            elif REGION in output.parameters or BYTE_SIZE in output.parameters:
                target = super().view(output.parameters, f"output {output.name!r}")
                assert target is not None
                targets = targets or {}
                targets[output.name] = target
        return targets

    def close(self) -> None:
        super().close()
        self.cuda.close()


def shared_memory_registry(max_regions: int, max_cuda_regions: int) -> SharedMemoryRegistry:
    """The server's registry: system and CUDA regions when CUDA shared memory is on, else the
    system registry alone (the transports then answer CUDA calls 501 with :data:`CUDA_OFF`)."""
    if max_cuda_regions > 0:
        return SharedMemoryRegions(max_regions, max_cuda_regions)
    return SharedMemoryRegistry(max_regions)
