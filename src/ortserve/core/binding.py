"""The device data path: a session run through an IOBinding over reusable device buffers.

``session.run`` hands ONNX Runtime host arrays and takes host arrays back; on a CUDA or
TensorRT session that is an allocation on the device for every input and output of every
batch, plus ONNX Runtime's own staging. Here each worker thread keeps one IOBinding and a
small arena of tensors keyed by name, shape, type and memory: on CUDA a batch's inputs are
copied into reusable *pinned* host tensors (see :func:`staging_memory`), which
the provider moves to the device by DMA; where pinned memory cannot be allocated (an ONNX
Runtime without the CUDA provider) they are copied into device tensors in place
(``update_inplace``, one host-to-device copy from pageable memory). Outputs whose shape
the graph fixes up to the batch dimension are bound to arena tensors too, and one
``copy_outputs_to_cpu`` brings the answers back as fresh host arrays. Nothing handed to a
caller is ever reused, so outputs may stay zero-copy views all the way to the wire.

Measured on the CPU (benchmarks/bench_binding.py, RESULTS.md "The device data path"): this
path costs 3-4 us more per batch than ``session.run`` on the small demo MLP (the copies into
the arena and back, which ``session.run`` avoids on the host by wrapping arrays) and the same
on the heavy one; so the runner keeps ``session.run`` on the CPU and takes this path only where
the first provider keeps tensors on a device (see :func:`binding_device`), where it saves a
device allocation per tensor per batch. The path itself is device-agnostic and tested on the CPU.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from ortserve.core.cuda_windows import CudaWindow, InputWindow, input_window
from ortserve.core.datatypes import datatype_of_ort, numpy_dtype

__all__ = ["PINNED", "Allocate", "BindingRun", "DeviceSpec", "bindable", "binding_device", "staging_memory"]

logger = logging.getLogger(__name__)

Array = npt.NDArray[np.generic]

PINNED: Final = "cuda_pinned"
"""ONNX Runtime's name of page-locked host memory, which its CUDA provider copies to the device
by DMA (asynchronously, without staging it again in a pinned bounce buffer)."""

_DEVICE_PROVIDERS: Final = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "cuda"}
_STRING: Final = "tensor(string)"
_BFLOAT16: Final = "tensor(bfloat16)"


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """Where the bound tensors live: ONNX Runtime's device name (``cpu``, ``cuda``) and index."""

    kind: str
    index: int = 0


def binding_device(session: ort.InferenceSession) -> DeviceSpec | None:
    """The device a session's first provider keeps tensors on, or None for a host session.

    TensorRT falls back to CUDA for the nodes it cannot take, so both bind on CUDA memory of
    the provider's ``device_id``.
    """
    providers = session.get_providers()
    if not providers or providers[0] not in _DEVICE_PROVIDERS:
        return None
    options = session.get_provider_options().get(providers[0], {})
    return DeviceSpec(_DEVICE_PROVIDERS[providers[0]], int(options.get("device_id", "0") or 0))


Allocate = Callable[[list[int], "np.dtype[np.generic]", str, int], "ort.OrtValue"]
"""``OrtValue.ortvalue_from_shape_and_type``'s signature: shape, dtype, device name, index."""


def _allocate(shape: list[int], dtype: np.dtype[np.generic], kind: str, index: int) -> ort.OrtValue:
    if kind == PINNED:
        memory = _pinned_memory(index)
        if memory is not None:
            return ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, memory_info=memory)
        # Fall through: ONNX Runtime's Python API names no "cuda_pinned" device up to 1.32
        # (it raises "Unsupported device type"), a release that does is used as it is.
    return ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, kind, index)


@functools.cache
def _pinned_memory(index: int) -> object | None:
    """The CUDA execution provider's host-accessible (pinned) memory, as ONNX Runtime 1.2x+
    exposes it (``OrtEpDevice.memory_info(OrtDeviceMemoryType.HOST_ACCESSIBLE)``), or None.

    The provider's devices are taken in the order ONNX Runtime lists them; page-locked memory
    is usable by every device of the process (unified addressing), so the index only picks one.
    """
    devices = getattr(ort, "get_ep_devices", None)
    memory_type = getattr(ort, "OrtDeviceMemoryType", None)
    if devices is None or memory_type is None:
        return None
    cuda = [each for each in devices() if each.ep_name == "CUDAExecutionProvider"]
    if not cuda:
        return None
    memory: object | None = cuda[min(index, len(cuda) - 1)].memory_info(memory_type.HOST_ACCESSIBLE)
    return memory


def staging_memory(device: DeviceSpec, allocate: Allocate = _allocate) -> tuple[DeviceSpec | None, str]:
    """Where a batch's inputs are staged before the device copies them in, and why (for the
    load log line).

    On CUDA, pinned host memory where this ONNX Runtime can allocate it (the CUDA provider's
    host-accessible memory info, else a ``cuda_pinned`` device where the Python API names one):
    one host copy into the pinned tensor, then the provider's DMA to the device. Otherwise (an
    ONNX Runtime without the CUDA provider, a host session) None: inputs go straight into the
    arena's tensors from the caller's pageable host arrays (``update_inplace``).
    """
    if device.kind != "cuda":
        return None, f"inputs copied into {device.kind} tensors"
    try:
        allocate([1], np.dtype(np.uint8), PINNED, device.index)
    except Exception as exc:  # ONNX Runtime raises a bare Exception for an unknown device type
        return None, f"pinned host memory unavailable ({exc}): inputs copied from pageable host memory"
    return DeviceSpec(PINNED, device.index), "inputs staged in pinned host memory (cuda_pinned)"


def bindable(session: ort.InferenceSession) -> bool:
    """Whether an IOBinding can carry every input and output: ONNX Runtime binds no string
    tensors (and bfloat16 goes through :mod:`~ortserve.core.ortvalues`), so such a graph keeps
    ``session.run``, which stages strings itself."""
    args = (*session.get_inputs(), *session.get_outputs())
    return not any(arg.type in (_STRING, _BFLOAT16) for arg in args)


class _Arena:
    """Device tensors reused across batches of the same shape, at most ``capacity`` of them.

    Least recently used first out: a server sees a handful of batch shapes (its preferred
    sizes and the odd partial batch), and a bound on the count keeps a stream of distinct
    shapes from growing device memory without end.
    """

    __slots__ = ("_allocate", "_capacity", "_values")

    def __init__(self, capacity: int, allocate: Allocate = _allocate) -> None:
        self._capacity = capacity
        self._allocate = allocate
        self._values: OrderedDict[tuple[str, tuple[int, ...], str, str], ort.OrtValue] = OrderedDict()

    def __len__(self) -> int:
        return len(self._values)

    def take(
        self, name: str, shape: tuple[int, ...], dtype: np.dtype[np.generic], memory: DeviceSpec
    ) -> ort.OrtValue:
        key = (name, shape, dtype.str, memory.kind)
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
            return value
        value = self._allocate(list(shape), dtype, memory.kind, memory.index)
        self._values[key] = value
        if len(self._values) > self._capacity:
            self._values.popitem(last=False)
        return value


@dataclass(frozen=True, slots=True)
class _Output:
    name: str
    dtype: np.dtype[np.generic]
    tail: tuple[int, ...] | None
    """The dims after the batch dimension when the graph fixes all of them and names the
    first one as the inputs' batch dimension, else None (ONNX Runtime allocates it)."""


class BindingRun:
    """Run batches through one IOBinding and arena per calling thread.

    Args:
        session: a session for which :func:`bindable` holds.
        output_names: the outputs to fetch, in order.
        device: where the arena's tensors live.
        arena_shapes: how many distinct (name, shape, type, memory) tensors each thread keeps.
        staging: where inputs are staged (pinned host memory); None: chosen by
            :func:`staging_memory` (tests pass one, with ``allocate`` standing in for it).
        allocate: makes the arena's tensors (``OrtValue.ortvalue_from_shape_and_type``).
        label: names the session in the log line that says where inputs are staged.
        windows: run a lone request straight on its CUDA shared-memory windows
            (:meth:`_run_on_windows`); False where the inputs are screened before the run.
    """

    __slots__ = (
        "_allocate",
        "_device",
        "_local",
        "_on_windows",
        "_outputs",
        "_session",
        "_shapes",
        "_staging",
    )

    def __init__(
        self,
        session: ort.InferenceSession,
        output_names: list[str],
        device: DeviceSpec,
        arena_shapes: int = 16,
        staging: DeviceSpec | None = None,
        allocate: Allocate = _allocate,
        label: str = "",
        windows: bool = True,
    ) -> None:
        self._session = session
        self._on_windows = windows
        self._device = device
        self._shapes = arena_shapes
        self._allocate = allocate
        if staging is None:
            staging, why = staging_memory(device, allocate)
        else:
            why = f"inputs staged in {staging.kind} memory"
        self._staging = staging
        logger.info(
            "%sIOBinding data path on %s:%d, %s",
            f"{label}: " if label else "",
            device.kind,
            device.index,
            why,
        )
        self._local = threading.local()
        declared = {arg.name: arg for arg in session.get_outputs()}
        batch = _batch_symbol(session.get_inputs())
        self._outputs = tuple(_output(declared[name], batch) for name in output_names)

    @property
    def device(self) -> DeviceSpec:
        return self._device

    @property
    def staging(self) -> DeviceSpec | None:
        """The pinned memory inputs are staged in, or None (copied straight into the arena)."""
        return self._staging

    def arena_size(self) -> int:
        """Tensors held by the calling thread's arena (for tests of the bound)."""
        state = getattr(self._local, "state", None)
        return 0 if state is None else len(state[1])

    def __call__(self, feeds: dict[str, Array]) -> list[Array]:
        """Run once; outputs in ``output_names`` order as host arrays the caller owns.

        A batch whose every input is the whole host copy of a CUDA shared-memory window (one
        request alone: a joined batch is a new array) binds the windows themselves
        (:meth:`_run_on_windows`).
        """
        windows = self._windows(feeds) if self._on_windows else None
        if windows is not None:
            return self._run_on_windows(feeds, windows)
        binding, arena = self._state()
        rows: int | None = None
        staging = self._staging
        for name, array in feeds.items():
            array = np.ascontiguousarray(array)
            if rows is None and array.ndim:
                rows = int(array.shape[0])
            if staging is None:
                value = arena.take(name, array.shape, array.dtype, self._device)
                value.update_inplace(array)
            else:  # page-locked host memory: a plain host copy, the provider DMAs it in
                value = arena.take(name, array.shape, array.dtype, staging)
                if array.nbytes:
                    ctypes.memmove(value.data_ptr(), array.ctypes.data, array.nbytes)
            binding.bind_ortvalue_input(name, value)
        for output in self._outputs:
            if output.tail is not None and rows is not None:
                binding.bind_ortvalue_output(
                    output.name, arena.take(output.name, (rows, *output.tail), output.dtype, self._device)
                )
            else:
                binding.bind_output(output.name, self._device.kind, self._device.index)
        try:
            self._session.run_with_iobinding(binding)
            results: list[Array] = binding.copy_outputs_to_cpu()
        finally:
            binding.clear_binding_inputs()
            binding.clear_binding_outputs()
        # Fresh arrays on every device, the host's included (measured with ONNX Runtime 1.32;
        # tests/core/test_binding.py holds it): the next batch may overwrite the arena freely.
        return results

    def _windows(self, feeds: dict[str, Array]) -> list[InputWindow] | None:
        """Each input's CUDA window when all have one on this session's device, else None."""
        windows = []
        device = self._device
        for array in feeds.values():
            window = input_window(array)
            if window is None:
                return None
            region = window.region
            if region.kind != device.kind or region.status.device_id != device.index:
                return None
            windows.append(window)
        return windows or None

    def _run_on_windows(self, feeds: dict[str, Array], windows: list[InputWindow]) -> list[Array]:
        """Run one request straight on its CUDA shared-memory windows.

        Inputs are bound to the windows' device pointers (no upload of the host copy); an
        output whose window the request named and whose size the graph fixes is bound to that
        window (ONNX Runtime writes the answer there, and the answer's copy into the window is
        skipped: :attr:`CudaWindow.filled`) unless it overlaps an input's window (the copy path
        reads every input before writing); other outputs as usual. The host arrays returned
        are ONNX Runtime's copies of every output, so whatever reads the answer reads it.
        """
        binding, arena = self._state()
        rows: int | None = None
        releases: list[Callable[[], None]] = []
        filled: list[CudaWindow] = []
        targets = windows[0].outputs or {}
        try:
            for (name, array), window in zip(feeds.items(), windows):
                if rows is None and array.ndim:
                    rows = int(array.shape[0])
                releases.append(
                    window.region.bind_input(binding, name, window.offset, array.shape, array.dtype)
                )
            for output in self._outputs:
                shape = None if output.tail is None or rows is None else (rows, *output.tail)
                target = targets.get(output.name)
                if (
                    shape is not None
                    and target is not None
                    and target.fits(shape, output.dtype)
                    and not any(target.overlaps(window) for window in windows)
                ):
                    releases.append(target.bind(binding, output.name, shape, output.dtype))
                    filled.append(target)
                elif shape is not None:
                    binding.bind_ortvalue_output(
                        output.name, arena.take(output.name, shape, output.dtype, self._device)
                    )
                else:
                    binding.bind_output(output.name, self._device.kind, self._device.index)
            self._session.run_with_iobinding(binding)
            results: list[Array] = binding.copy_outputs_to_cpu()
        finally:
            binding.clear_binding_inputs()
            binding.clear_binding_outputs()
            for release in releases:
                release()
        for target in filled:
            target.filled = True
        return results

    def _state(self) -> tuple[ort.IOBinding, _Arena]:
        state: tuple[ort.IOBinding, _Arena] | None = getattr(self._local, "state", None)
        if state is None:
            state = (self._session.io_binding(), _Arena(self._shapes, self._allocate))
            self._local.state = state
        return state


def _batch_symbol(inputs: list[ort.NodeArg]) -> str | None:
    """The name every non-string input gives its first dimension, if they agree on one."""
    names = {arg.shape[0] if arg.shape else None for arg in inputs}
    only = names.pop() if len(names) == 1 else None
    return only if isinstance(only, str) and only else None


def _output(arg: ort.NodeArg, batch: str | None) -> _Output:
    dtype = numpy_dtype(datatype_of_ort(arg.type))
    shape = list(arg.shape)
    tail = shape[1:]
    fixed = batch is not None and bool(shape) and shape[0] == batch
    fixed = fixed and all(isinstance(dim, int) and dim >= 0 for dim in tail)
    return _Output(arg.name, dtype, tuple(int(dim) for dim in tail) if fixed else None)
