"""The windows of a CUDA shared-memory region that a request's tensors use: an output's window
(written by the answer, or by ONNX Runtime when a run bound it), an input's window remembered
on its decoded host copy, and the link that lets a lone request run straight on its windows
(``core/binding.py``). The regions themselves are ``cuda_shared_memory.py``'s."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ortserve.core.shared_memory import Window
from ortserve.errors import InvalidInput

if TYPE_CHECKING:
    from ortserve.core.cuda_shared_memory import CudaRegion

__all__ = ["CudaWindow", "HostCopy", "InputWindow", "input_window", "link_outputs"]


class CudaWindow:
    """An output's window in a CUDA region, written chunk by chunk as :func:`write_output` does
    (or by ONNX Runtime itself when a run bound it: :meth:`bind`, then nothing is copied)."""

    __slots__ = ("_offset", "_region", "_size", "_what", "filled")

    def __init__(self, region: CudaRegion, offset: int, size: int, what: str) -> None:
        region.check(offset, size, what)
        self._region = region
        self._offset = offset
        self._size = size
        self._what = what
        self.filled = False
        """Set by a run that wrote the whole window through a binding: the answer's later
        write is skipped (the window already holds exactly those bytes)."""

    def __len__(self) -> int:
        return self._size

    @property
    def region(self) -> CudaRegion:
        return self._region

    def fits(self, shape: Sequence[int], dtype: np.dtype[np.generic]) -> bool:
        """Whether an output of ``shape`` and ``dtype`` fills the window exactly."""
        return math.prod(shape) * dtype.itemsize == self._size

    def overlaps(self, window: InputWindow) -> bool:
        """Whether this output window shares bytes with an input's window: bound straight to
        both, ONNX Runtime could write the output over an input it has yet to read."""
        return (
            window.region is self._region
            and window.offset < self._offset + self._size
            and self._offset < window.offset + window.size
        )

    def bind(
        self, binding: object, name: str, shape: Sequence[int], dtype: np.dtype[np.generic]
    ) -> Callable[[], None]:
        """Bind output ``name`` straight to the window (see :meth:`CudaRegion.bind_output`)."""
        return self._region.bind_output(binding, name, self._offset, shape, dtype)

    def __setitem__(self, index: slice, value: bytes | memoryview, /) -> None:
        if self.filled:  # ONNX Runtime wrote the answer into the window during the run
            return
        start, stop, step = index.indices(self._size)
        written = len(value) if isinstance(value, bytes) else value.nbytes
        if step != 1 or stop - start != written:
            raise InvalidInput(f"{self._what}: a write of {written} bytes does not fit [{start}:{stop}]")
        self._region.write(self._offset + start, value, self._what)


@dataclass(slots=True, eq=False)
class InputWindow:
    """Where a decoded input's bytes came from, and the request's CUDA output windows
    (:func:`link_outputs`), for a run that binds them straight to the device."""

    region: CudaRegion
    offset: int
    size: int
    outputs: dict[str, CudaWindow] | None = None


class HostCopy(np.ndarray):
    """A CUDA input window's host copy (bytes) that remembers the window it was read from."""

    window: InputWindow

    @classmethod
    def of(cls, window: InputWindow) -> HostCopy:
        copy = np.empty(window.size, dtype=np.uint8).view(cls)
        copy.window = window
        return copy


def input_window(array: np.ndarray) -> InputWindow | None:
    """The CUDA window ``array`` is the whole host copy of, or None.

    Follows ``array``'s bases (the decoder's ``frombuffer`` and ``reshape`` views) to a
    :class:`HostCopy`; an array the validator converted or a batch joined is a new array and
    has none. Only a C-contiguous view of every byte of the copy counts: it is then the
    window's tensor, in the same layout.
    """
    base: object = array.base
    depth = 0
    while base is not None and depth < 6:  # frombuffer, reshape: a window is 2-3 bases away
        if isinstance(base, HostCopy):
            whole = base.ctypes.data == array.ctypes.data and base.nbytes == array.nbytes
            return base.window if whole and array.flags.c_contiguous else None
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
        depth += 1
    return None


def link_outputs(inputs: Sequence[object], targets: dict[str, Window]) -> None:
    """Hand a request's CUDA output windows to its CUDA input windows, so that the run of
    this request alone can bind them too (:class:`~ortserve.core.binding.BindingRun`).
    Nothing happens unless every input came from a CUDA window.

    Args:
        inputs: the request's decoded inputs (anything with a ``data`` array).
        targets: its outputs' windows, as :meth:`SharedMemoryRegions.output_targets` gives them.
    """
    outputs: dict[str, CudaWindow] | None = None
    for name, target in targets.items():  # a loop: system windows only cost ~100 ns
        if type(target) is CudaWindow:
            outputs = outputs or {}
            outputs[name] = target
    if outputs is None:
        return
    windows = []
    for each in inputs:
        data = getattr(each, "data", None)
        window = input_window(data) if isinstance(data, np.ndarray) else None
        if window is None:
            return
        windows.append(window)
    for window in windows:
        window.outputs = outputs
