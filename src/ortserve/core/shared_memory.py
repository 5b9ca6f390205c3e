"""System shared-memory regions (Triton's extension): registry, mappings, bounds and lifetime.

A client on the same host puts tensors into a POSIX shared-memory object (``/dev/shm/<key>``),
registers a window of it under a name, and names that window in an infer request's
parameters instead of sending the bytes. Inputs become ``np.frombuffer`` views of the
mapping (no copy); outputs are written into the window and answered without data.

Lifetime: a view handed to a request is a buffer export of the mapping, so unregistering a
region in use only removes its name; the mapping itself stays until the last request that
holds a view of it has finished (CPython unmaps it when its last reference goes).

Both transports reach the one registry through the DataPlane.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import mmap
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ortserve.core.datatypes import array_to_binary
from ortserve.core.types import InferOutput, InferResponse, Parameters, RequestedOutput
from ortserve.errors import InvalidInput, NotImplementedByServer

__all__ = [
    "BYTE_SIZE",
    "CUDA_NOT_SUPPORTED",
    "OFFSET",
    "REGION",
    "SHARED_MEMORY_PARAMETERS",
    "RegionStatus",
    "SharedMemoryRegistry",
    "SharedMemoryWindow",
    "Window",
    "deliver_to_shared_memory",
    "is_in_shared_memory",
    "write_output",
]

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
SHARED_MEMORY_PARAMETERS = frozenset({REGION, BYTE_SIZE, OFFSET})
SHM_DIRECTORY = Path("/dev/shm")
CUDA_NOT_SUPPORTED = "CUDA shared memory is not supported: ortserve serves tensors from CPU memory only"
_MAX_NAME_LENGTH = 255


class Window(Protocol):
    """Where an output is written: a memoryview of a mapping, or a CUDA region's window."""

    def __len__(self) -> int: ...

    def __setitem__(self, index: slice, value: bytes | memoryview, /) -> None: ...


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """What the status calls report about one registered region."""

    name: str
    key: str
    offset: int
    byte_size: int


class SharedMemoryWindow:
    """One registered region: a shared, writable mapping of ``byte_size`` bytes at ``offset``.

    Args:
        status: the region's name, key, offset and size as registered.
        mapping: the mapping of the object from ``start`` (a multiple of the page size).
        start: where in the object the mapping begins.
    """

    __slots__ = ("_base", "_mapping", "status")

    def __init__(self, status: RegionStatus, mapping: mmap.mmap, start: int) -> None:
        self.status = status
        self._mapping = mapping
        self._base = status.offset - start

    def view(self, offset: int, size: int, what: str) -> memoryview:
        """``size`` bytes at ``offset`` within the region, as a view of the mapping.

        Raises:
            InvalidInput: the window runs past the registered size, or the object has been
                truncated below it since registration (touching those pages would fault).
        """
        region = self.status
        if offset + size > region.byte_size:
            raise InvalidInput(
                f"{what}: shared-memory offset {offset} + byte size {size} exceeds the "
                f"{region.byte_size} bytes of region {region.name!r}"
            )
        start = self._base + offset
        if self._mapping.closed or self._mapping.size() < region.offset + offset + size:
            raise InvalidInput(f"{what}: the object behind region {region.name!r} has shrunk")
        return memoryview(self._mapping)[start : start + size]

    def release(self) -> None:
        """Unmap now unless a request still holds a view; then the last view's end unmaps."""
        with contextlib.suppress(BufferError):
            self._mapping.close()


def _reference(parameters: Parameters, what: str) -> tuple[str, int, int] | None:
    """(region, offset, byte size) named by a tensor's parameters, or None when none is."""
    region = parameters.get(REGION)
    size = parameters.get(BYTE_SIZE)
    if region is None and size is None:
        return None
    if not isinstance(region, str) or not region:
        raise InvalidInput(f"{what}: '{REGION}' must be a region name when '{BYTE_SIZE}' is given")
    offset = parameters.get(OFFSET, 0)
    for key, value in ((BYTE_SIZE, size), (OFFSET, offset)):
        if type(value) is not int or value < 0:
            raise InvalidInput(f"{what}: '{key}' must be a non-negative integer")
    assert isinstance(size, int) and isinstance(offset, int)
    return region, offset, size


def _shown(text: str) -> str:
    """A client's string as an error message quotes it: bounded, whatever it sent."""
    return repr(text) if len(text) <= 80 else f"{text[:80]!r}..."


def _checked_key(key: object) -> str:
    """The object's file name under /dev/shm: shm_open's rules (one name, leading slashes)."""
    if not isinstance(key, str):
        raise InvalidInput("'key' must be a string")
    name = key.lstrip("/")
    if not name or "/" in name or "\0" in name or name in (".", "..") or len(name) > _MAX_NAME_LENGTH:
        raise InvalidInput(f"shared-memory key {_shown(key)} is not a valid POSIX shared-memory name")
    return name


def _map(path: Path, key: str, offset: int, byte_size: int) -> tuple[mmap.mmap, int]:
    """Map ``[offset, offset + byte_size)`` of the object read-write; (mapping, its start)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InvalidInput(f"no shared-memory object with key {key!r}") from None
    except OSError as exc:
        raise InvalidInput(f"cannot open shared-memory object {key!r}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput(f"shared-memory object {key!r} is not a regular memory object")
        if info.st_size < offset + byte_size:
            raise InvalidInput(
                f"shared-memory object {key!r} holds {info.st_size} bytes; offset {offset} + "
                f"byte_size {byte_size} runs past its end"
            )
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        return mmap.mmap(fd, offset + byte_size - start, offset=start), start
    finally:
        os.close(fd)  # the mapping keeps its own duplicate


class SharedMemoryRegistry:
    """Registered system shared-memory regions, by name, at most ``max_regions`` at once.

    Args:
        max_regions: bound on registered regions; 0 turns the extension off (a client that
            can reach the server could otherwise read and overwrite any shared-memory object
            this process may open, which is why Triton also makes it opt-in).
        directory: where POSIX shared-memory objects live.
    """

    def __init__(self, max_regions: int = 0, directory: Path = SHM_DIRECTORY) -> None:
        self.max_regions = max_regions
        self._directory = directory
        self._regions: dict[str, SharedMemoryWindow] = {}

    @property
    def enabled(self) -> bool:
        return self.max_regions > 0

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise NotImplementedByServer(
                "system shared memory is off; start the server with --shared-memory-regions N"
            )

    def register(self, name: str, key: object, offset: object, byte_size: object) -> None:
        """Map a window of ``/dev/shm/<key>`` under ``name``.

        Raises:
            InvalidInput: a bad or duplicate name, a bad key, offset or size, an object that
                cannot be opened or is too small, or the region limit reached.
            NotImplementedByServer: the extension is off.
        """
        self._check_enabled()
        if not name or len(name) > _MAX_NAME_LENGTH:
            raise InvalidInput("a shared-memory region needs a name of 1 to 255 characters")
        if name in self._regions:
            raise InvalidInput(f"shared-memory region {name!r} is already registered")
        if len(self._regions) >= self.max_regions:
            raise InvalidInput(
                f"{self.max_regions} shared-memory regions are registered, the most allowed; "
                "unregister one first"
            )
        file_name = _checked_key(key)
        for field, value in (("offset", offset), ("byte_size", byte_size)):
            if type(value) is not int or value < 0:
                raise InvalidInput(f"'{field}' must be a non-negative integer")
        assert isinstance(offset, int) and isinstance(byte_size, int) and isinstance(key, str)
        if byte_size == 0:
            raise InvalidInput("'byte_size' must be positive")
        mapping, start = _map(self._directory / file_name, key, offset, byte_size)
        self._regions[name] = SharedMemoryWindow(RegionStatus(name, key, offset, byte_size), mapping, start)

    def unregister(self, name: str | None = None) -> None:
        """Forget one region (or all with None); unknown names are no error, as in Triton.

        Requests already holding a view keep the mapping until they finish.
        """
        self._check_enabled()
        names = list(self._regions) if name is None else [name]
        for each in names:
            window = self._regions.pop(each, None)
            if window is not None:
                window.release()

    def status(self, name: str | None = None) -> list[RegionStatus]:
        """Every registered region, or the one named.

        Raises:
            InvalidInput: the named region is not registered.
        """
        self._check_enabled()
        if name is None:
            return [window.status for window in self._regions.values()]
        return [self._window(name, None).status]

    def close(self) -> None:
        """Unregister everything (server shutdown)."""
        for window in self._regions.values():
            window.release()
        self._regions.clear()

    def _window(self, name: str, what: str | None) -> SharedMemoryWindow:
        window = self._regions.get(name)
        if window is None:
            prefix = "" if what is None else f"{what}: "
            raise InvalidInput(f"{prefix}shared-memory region {_shown(name)} is not registered")
        return window

    def view(self, parameters: Parameters, what: str) -> memoryview | None:
        """The bytes a tensor's parameters name, or None when they name no region.

        Raises:
            InvalidInput: malformed parameters, an unknown region, a window out of bounds.
        """
        reference = _reference(parameters, what)
        if reference is None:
            return None
        region, offset, size = reference
        self._check_enabled()
        return self._window(region, what).view(offset, size, what)

    def output_targets(self, outputs: Sequence[RequestedOutput]) -> dict[str, Window] | None:
        """Where requested outputs go, by name; None when every output travels on the wire."""
        targets: dict[str, Window] | None = None
        for output in outputs:
            if REGION in output.parameters or BYTE_SIZE in output.parameters:
                target = self.view(output.parameters, f"output {output.name!r}")
                assert target is not None
                targets = targets or {}
                targets[output.name] = target
        return targets


def deliver_to_shared_memory(
    pending: asyncio.Future[InferResponse], targets: dict[str, Window]
) -> asyncio.Future[InferResponse]:
    """A future of the same answer whose outputs in ``targets`` have been written there.

    Cancelling the returned future cancels ``pending`` (the client went away).
    """
    answer: asyncio.Future[InferResponse] = pending.get_loop().create_future()
    pending.add_done_callback(functools.partial(_write_outputs, answer, targets))
    answer.add_done_callback(functools.partial(_cancel_pending, pending))
    return answer


def _write_outputs(
    answer: asyncio.Future[InferResponse],
    targets: dict[str, Window],
    pending: asyncio.Future[InferResponse],
) -> None:
    if answer.done():
        return
    if pending.cancelled():
        answer.cancel()
        return
    error = pending.exception()
    if error is not None:
        answer.set_exception(error)
        return
    response = pending.result()
    try:
        for output in response.outputs:
            target = targets.get(output.name)
            if target is not None:
                output.parameters = write_output(output, target)
    except InvalidInput as refused:
        answer.set_exception(refused)
        return
    answer.set_result(response)


def write_output(output: InferOutput, target: Window) -> Parameters:
    """Copy one output into its window; the parameters that answer for it on the wire.

    Raises:
        InvalidInput: the output is larger than the window.
    """
    chunks = array_to_binary(output.data)
    size = sum(len(chunk) for chunk in chunks)
    if size > len(target):
        raise InvalidInput(
            f"output {output.name!r} needs {size} bytes, its shared-memory window holds {len(target)}"
        )
    position = 0
    for chunk in chunks:
        target[position : position + len(chunk)] = chunk
        position += len(chunk)
    answered = {key: output.parameters[key] for key in (REGION, OFFSET) if key in output.parameters}
    answered[BYTE_SIZE] = size
    return answered


def _cancel_pending(pending: asyncio.Future[InferResponse], answer: asyncio.Future[InferResponse]) -> None:
    if answer.cancelled() and not pending.done():
        pending.cancel()


def is_in_shared_memory(parameters: Parameters) -> bool:
    """An answered output whose data went to shared memory (encoders send no data for it)."""
    return REGION in parameters
