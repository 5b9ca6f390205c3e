"""Triton's ``optional`` inputs: a request may leave them out, and the graph's default is used.

An ONNX graph can only do without an input that has a default: an initializer of the same
name (ONNX Runtime calls it an overridable initializer and leaves it out of the session's
inputs). An input config.pbtxt marks ``optional`` must be one of these; it is then listed with
the model's inputs (clients may send it) and a request that omits it gets the initializer's
value, one row repeated for each of the request's rows when the model batches. A required
graph input marked optional is refused at load: the graph has nothing to run without it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from ortserve.core.datatypes import numpy_dtype
from ortserve.core.types import TensorSpec
from ortserve.errors import ConfigError

__all__ = ["optional_inputs"]

Array = npt.NDArray[np.generic]


def optional_inputs(
    session: ort.InferenceSession,
    graph: onnx.ModelProto,
    folder: Path,
    specs: dict[str, TensorSpec],
    names: tuple[str, ...],
    batched: bool,
    where: str,
) -> dict[str, Array]:
    """The defaults of the inputs ``names`` (config.pbtxt ``optional``), by name.

    Args:
        session: the version's session (its overridable initializers are the candidates).
        graph: the model as loaded (without external data), to read the defaults from.
        folder: where the graph's external data files are.
        specs: the overridable initializers' specs as the graph declares them, by name.
        names: the inputs marked optional.
        batched: whether dim 0 is the batch dimension (a default must then be one row).
        where: the config file, for messages.

    Raises:
        ConfigError: an optional input without a default, or a default of more than one row.
    """
    required = {arg.name for arg in session.get_inputs()}
    initializers = {tensor.name: tensor for tensor in graph.graph.initializer}
    defaults: dict[str, Array] = {}
    for name in names:
        if name in required or name not in specs or name not in initializers:
            reason = "the graph requires it" if name in required else "it is not an input of the graph"
            raise ConfigError(
                f"{where}: field input {name!r} optional: {reason}; an optional input needs a default "
                "in the graph (an initializer of the same name, listed among the graph's inputs)"
            )
        value = numpy_helper.to_array(initializers[name], base_dir=str(folder))
        if batched and (value.ndim == 0 or value.shape[0] != 1):
            raise ConfigError(
                f"{where}: field input {name!r} optional: its default has shape {list(value.shape)}; a "
                "batching model's default must be one row (1 at dimension 0)"
            )
        defaults[name] = np.ascontiguousarray(value, dtype=numpy_dtype(specs[name].datatype))
    return defaults
