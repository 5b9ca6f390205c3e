"""Running a session through OrtValues, for graphs with bfloat16 tensors that NumPy cannot carry."""

from __future__ import annotations

import ctypes
from typing import Final

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from ortserve.errors import RepositoryError

__all__ = ["OrtValueRun", "needs_ort_values"]

Array = npt.NDArray[np.generic]

_BFLOAT16: Final = "tensor(bfloat16)"
_STRING: Final = "tensor(string)"
_ONNX_BFLOAT16: Final = 16  # onnx.TensorProto.BFLOAT16 (onnx is not imported on the serving path)


def needs_ort_values(session: ort.InferenceSession) -> bool:
    """Whether a graph has a bfloat16 input or output, which ``session.run`` cannot take or give."""
    return any(arg.type == _BFLOAT16 for arg in (*session.get_inputs(), *session.get_outputs()))


class OrtValueRun:
    """``session.run`` for graphs with bfloat16 tensors, held as uint16 bit patterns.

    ``session.run`` refuses a uint16 array for a bfloat16 input, and cannot return a bfloat16
    output as NumPy. Bfloat16 inputs are wrapped without a copy in OrtValues reinterpreted as
    ``BFLOAT16``, which ``session.run`` accepts. When an output is bfloat16 too, the run goes
    through an IOBinding whose outputs stay OrtValues, and each bfloat16 one is copied once
    into a new uint16 array. (``run_with_ort_values`` would also do, but its Python wrapper
    spends ~45 us per call walking the result vector: measured with ONNX Runtime 1.32.)

    Args:
        session: a session for which :func:`needs_ort_values` holds.
        output_names: the outputs to fetch, in order.

    Raises:
        RepositoryError: the graph has bfloat16 outputs and string inputs, which an IOBinding
            cannot take.
    """

    __slots__ = ("_bf16_inputs", "_bf16_outputs", "_bind", "_output_names", "_session")

    def __init__(self, session: ort.InferenceSession, output_names: list[str]) -> None:
        inputs = session.get_inputs()
        types = {arg.name: arg.type for arg in session.get_outputs()}
        self._session = session
        self._output_names = output_names
        self._bf16_inputs = frozenset(arg.name for arg in inputs if arg.type == _BFLOAT16)
        self._bf16_outputs = tuple(types[name] == _BFLOAT16 for name in output_names)
        self._bind = any(self._bf16_outputs)
        strings = [arg.name for arg in inputs if arg.type == _STRING]
        if self._bind and strings:
            raise RepositoryError(
                f"a graph with bfloat16 outputs cannot also have string inputs ({', '.join(strings)}): "
                "ONNX Runtime gives bfloat16 only as OrtValues, through an IOBinding that takes no strings"
            )

    def __call__(self, feeds: dict[str, Array]) -> list[Array]:
        """Run once; outputs in ``output_names`` order, bfloat16 ones as uint16 arrays."""
        if not self._bind:
            wrapped = {name: self._input(name, array) for name, array in feeds.items()}
            outputs: list[Array] = self._session.run(self._output_names, wrapped)
            return outputs
        binding = self._session.io_binding()  # one per run: instances run concurrently
        for name, array in feeds.items():  # the binding keeps what it is given alive
            value = self._input(name, array)
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, value)
        for name in self._output_names:
            binding.bind_output(name, "cpu")
        self._session.run_with_iobinding(binding)
        return [
            _bf16_array(value) if bf16 else value.numpy()
            for value, bf16 in zip(binding.get_outputs(), self._bf16_outputs)
        ]

    def _input(self, name: str, array: Array) -> ort.OrtValue | Array:
        if name not in self._bf16_inputs:
            return array
        # An OrtValue aliases the array's memory and assumes it is C-contiguous.
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ascontiguousarray(array), _ONNX_BFLOAT16)


def _bf16_array(value: ort.OrtValue) -> npt.NDArray[np.uint16]:
    """Copy a bfloat16 OrtValue's bits into a uint16 array (``OrtValue.numpy`` refuses bfloat16)."""
    if value.device_name() != "cpu":
        raise RuntimeError(f"a bfloat16 output is on {value.device_name()}, not in host memory")
    out = np.empty(tuple(value.shape()), dtype=np.uint16)
    if out.nbytes:
        ctypes.memmove(out.ctypes.data, value.data_ptr(), out.nbytes)
    return out
