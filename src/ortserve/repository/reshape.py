"""Triton's ``reshape``: the graph takes (or gives) another shape than the one clients use.

``config.pbtxt`` may say that an input clients send as ``dims`` reaches the graph as
``reshape.shape``, and that an output the graph makes as ``reshape.shape`` goes back to
clients as ``dims``. ortserve does this inside the graph: at load, each such input gets a
``Reshape`` node in front of its consumers and each such output a ``Reshape`` node behind its
producer, so the session itself takes and gives the clients' shapes (its metadata, the
validator and the batcher see nothing else) and ONNX Runtime does the reshape, a view, with no
per-request code in the server. With batching on, dimension 0 (the batch) is kept as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper

from ortserve.errors import ConfigError

__all__ = ["Reshape", "reshaped_model"]


@dataclass(frozen=True, slots=True)
class Reshape:
    """One tensor whose shape differs between the clients (``dims``) and the graph (``shape``).

    Both exclude the batch dimension when the model batches; -1 is a dimension of any size.
    """

    kind: str
    """``input`` or ``output``."""
    name: str
    dims: tuple[int, ...]
    shape: tuple[int, ...]


def reshaped_model(
    model_path: Path,
    reshapes: tuple[Reshape, ...],
    batched: bool,
    where: str,
    model_bytes: bytes | None = None,
) -> bytes:
    """The model file (or ``model_bytes``, its contents already read) with ``reshapes``
    applied, serialized (external data stays in its files).

    Raises:
        ConfigError: a reshape the graph contradicts, or one that cannot be expressed (more
            than one -1 on a side, or element counts that differ); the message names it.
    """
    try:
        if model_bytes is None:
            model = onnx.load(str(model_path), load_external_data=False)
        else:
            model = onnx.load_from_string(model_bytes)
    except (OSError, DecodeError) as exc:
        raise ConfigError(f"{model_path}: cannot read the graph to apply reshape: {exc}") from exc
    graph = model.graph
    for reshape in reshapes:
        _check(reshape, where)
        if reshape.kind == "input":
            _reshape_input(graph, reshape, batched, where)
        else:
            _reshape_output(graph, reshape, batched, where)
    serialized: bytes = model.SerializeToString()
    return serialized


def _check(reshape: Reshape, where: str) -> None:
    label = f"{where}: field {reshape.kind} {reshape.name!r} reshape"
    for side, dims in (("dims", reshape.dims), ("reshape", reshape.shape)):
        if list(dims).count(-1) > 1:
            raise ConfigError(
                f"{label}: {side} {list(dims)} has more than one -1; ONNX Reshape cannot infer two"
            )
        if any(d == 0 or d < -1 for d in dims):
            raise ConfigError(f"{label}: {side} {list(dims)}: dimensions must be positive or -1")
    known = -1 not in reshape.dims and -1 not in reshape.shape
    if known and int(np.prod(reshape.dims)) != int(np.prod(reshape.shape)):
        raise ConfigError(
            f"{label}: {list(reshape.shape)} does not hold the elements of dims {list(reshape.dims)}"
        )


def _target(dims: tuple[int, ...], batched: bool, name: str) -> onnx.TensorProto:
    """The Reshape node's shape input: 0 keeps the batch dimension as the request has it."""
    values = np.array(([0] if batched else []) + list(dims), dtype=np.int64)
    return numpy_helper.from_array(values, name)


def _set_shape(value: onnx.ValueInfoProto, dims: tuple[int, ...], batched: bool) -> None:
    shape = value.type.tensor_type.shape
    shape.ClearField("dim")
    if batched:
        shape.dim.add().dim_param = "batch"
    for axis, dim in enumerate(dims):
        if dim == -1:
            shape.dim.add().dim_param = f"{value.name}_{axis}"
        else:
            shape.dim.add().dim_value = dim


def _graph_dims(value: onnx.ValueInfoProto, batched: bool) -> list[int] | None:
    if not value.type.tensor_type.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim]
    return dims[1:] if batched else dims


def _agrees(declared: tuple[int, ...], graph: list[int] | None) -> bool:
    if graph is None:
        return True
    return len(declared) == len(graph) and all(
        -1 in (d, g) or d == g for d, g in zip(declared, graph, strict=True)
    )


def _rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name == old:
                node.input[index] = new
        for attribute in node.attribute:
            if attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                subgraphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs
                for subgraph in subgraphs:  # a subgraph may read an outer tensor by name
                    _rename_uses(subgraph, old, new)


def _checked_value(
    values: Iterable[onnx.ValueInfoProto], kind: str, verb: str, reshape: Reshape, batched: bool, where: str
) -> onnx.ValueInfoProto:
    """The graph's input or output ``reshape`` names, once its shape agrees with the reshape."""
    value = next((v for v in values if v.name == reshape.name), None)
    if value is None:
        raise ConfigError(f"{where}: {kind} {reshape.name!r} is not an {kind} of the graph")
    graph_dims = _graph_dims(value, batched)
    if not _agrees(reshape.shape, graph_dims):
        raise ConfigError(
            f"{where}: field {kind} {reshape.name!r} reshape: {list(reshape.shape)}, but the graph {verb} "
            f"{graph_dims}{' after the batch dimension' if batched else ''}"
        )
    return value


def _reshape_input(graph: onnx.GraphProto, reshape: Reshape, batched: bool, where: str) -> None:
    value = _checked_value(graph.input, "input", "takes", reshape, batched, where)
    inner = f"{reshape.name}/ortserve_reshaped"
    _rename_uses(graph, reshape.name, inner)
    target = _target(reshape.shape, batched, f"{reshape.name}/ortserve_shape")
    graph.initializer.append(target)
    graph.node.insert(0, helper.make_node("Reshape", [reshape.name, target.name], [inner]))
    _set_shape(value, reshape.dims, batched)


def _reshape_output(graph: onnx.GraphProto, reshape: Reshape, batched: bool, where: str) -> None:
    value = _checked_value(graph.output, "output", "gives", reshape, batched, where)
    inner = f"{reshape.name}/ortserve_unreshaped"
    for node in graph.node:
        for index, name in enumerate(node.output):
            if name == reshape.name:
                node.output[index] = inner
    _rename_uses(graph, reshape.name, inner)
    target = _target(reshape.dims, batched, f"{reshape.name}/ortserve_shape")
    graph.initializer.append(target)
    graph.node.append(helper.make_node("Reshape", [inner, target.name], [reshape.name]))
    _set_shape(value, reshape.dims, batched)
