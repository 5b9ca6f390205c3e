"""The device data path: a session run through an IOBinding over reusable device buffers.

``session.run`` hands ONNX Runtime host arrays and takes host arrays back; on a CUDA or
TensorRT session that is an allocation on the device for every input and output of every
batch, plus ONNX Runtime's own staging. Here each worker thread keeps one IOBinding and a
small arena of device tensors keyed by name, shape and type: a batch's inputs are copied into
the arena's tensors in place (``update_inplace``, one host-to-device copy), outputs whose shape
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

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from ortserve.core.datatypes import datatype_of_ort, numpy_dtype

__all__ = ["BindingRun", "DeviceSpec", "bindable", "binding_device"]

Array = npt.NDArray[np.generic]

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

    __slots__ = ("_capacity", "_device", "_values")

    def __init__(self, device: DeviceSpec, capacity: int) -> None:
        self._device = device
        self._capacity = capacity
        self._values: OrderedDict[tuple[str, tuple[int, ...], str], ort.OrtValue] = OrderedDict()

    def __len__(self) -> int:
        return len(self._values)

    def take(self, name: str, shape: tuple[int, ...], dtype: np.dtype[np.generic]) -> ort.OrtValue:
        key = (name, shape, dtype.str)
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
            return value
        value = ort.OrtValue.ortvalue_from_shape_and_type(
            list(shape), dtype, self._device.kind, self._device.index
        )
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
        arena_shapes: how many distinct (name, shape, type) tensors each thread keeps.
    """

    __slots__ = ("_device", "_local", "_outputs", "_session", "_shapes")

    def __init__(
        self,
        session: ort.InferenceSession,
        output_names: list[str],
        device: DeviceSpec,
        arena_shapes: int = 16,
    ) -> None:
        self._session = session
        self._device = device
        self._shapes = arena_shapes
        self._local = threading.local()
        declared = {arg.name: arg for arg in session.get_outputs()}
        batch = _batch_symbol(session.get_inputs())
        self._outputs = tuple(_output(declared[name], batch) for name in output_names)

    @property
    def device(self) -> DeviceSpec:
        return self._device

    def arena_size(self) -> int:
        """Tensors held by the calling thread's arena (for tests of the bound)."""
        state = getattr(self._local, "state", None)
        return 0 if state is None else len(state[1])

    def __call__(self, feeds: dict[str, Array]) -> list[Array]:
        """Run once; outputs in ``output_names`` order as host arrays the caller owns."""
        binding, arena = self._state()
        rows: int | None = None
        for name, array in feeds.items():
            array = np.ascontiguousarray(array)
            if rows is None and array.ndim:
                rows = int(array.shape[0])
            value = arena.take(name, array.shape, array.dtype)
            value.update_inplace(array)
            binding.bind_ortvalue_input(name, value)
        for output in self._outputs:
            if output.tail is not None and rows is not None:
                binding.bind_ortvalue_output(
                    output.name, arena.take(output.name, (rows, *output.tail), output.dtype)
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

    def _state(self) -> tuple[ort.IOBinding, _Arena]:
        state: tuple[ort.IOBinding, _Arena] | None = getattr(self._local, "state", None)
        if state is None:
            state = (self._session.io_binding(), _Arena(self._device, self._shapes))
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
