"""A model file and its external-data files, read once into the server's own memory.

ONNX Runtime memory-maps external-data files when it is given a path. A mapped file is shared
with whoever writes it: ``cp new.bin w.bin`` truncates it first, and the next request that
touches a page past the new end kills the whole process with SIGBUS; an in-place write changes
the served weights with no reload. So a session is never built from the folder: the graph and
every file its tensors name are read here (``read()``, not ``mmap``), and ONNX Runtime is handed
the bytes (``add_external_initializers_from_files_in_memory``, which copies them into the
session). A writer can then change or truncate the files freely; the session keeps what was
read. The signature check hands in the very bytes it hashed, so what serves is what was checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import onnx

from ortserve.errors import ConfigError

__all__ = ["MAX_EXTERNAL_FILES", "ModelFiles", "external_locations", "read_model_files", "relative_location"]

MAX_EXTERNAL_FILES = 4096
"""Distinct external-data files one graph may name (a graph naming more is refused)."""


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """A graph's bytes and the contents of every external-data file it names, keyed by the
    location as the graph writes it (``weights.bin``, ``./data/w.bin``)."""

    graph: bytes
    external: Mapping[str, bytes] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.graph) + sum(len(data) for data in self.external.values())


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of a graph: initializers, sparse ones, node attributes, subgraphs."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        yield from _attribute_tensors(node.attribute)


def _attribute_tensors(
    attributes: Iterator[onnx.AttributeProto] | list[onnx.AttributeProto],
) -> Iterator[onnx.TensorProto]:
    for attribute in attributes:
        if attribute.HasField("t"):
            yield attribute.t
        yield from attribute.tensors
        if attribute.HasField("g"):
            yield from _tensors(attribute.g)
        for subgraph in attribute.graphs:
            yield from _tensors(subgraph)


def _model_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    yield from _tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from _attribute_tensors(node.attribute)


def relative_location(location: str, where: str) -> str:
    """The folder-relative path of an external-data location (``./w.bin`` -> ``w.bin``).

    Raises:
        ConfigError: empty, absolute, or leaving the model's folder.
    """
    path = PurePosixPath(location.replace("\\", "/"))
    if not location or path.is_absolute() or ".." in path.parts or path.as_posix() in ("", "."):
        raise ConfigError(f"{where}: external data location {location!r} is not inside the model's folder")
    return path.as_posix()


def external_locations(graph: bytes, where: str) -> list[str]:
    """Every distinct external-data location the graph's tensors name, sorted.

    Raises:
        ConfigError: not an ONNX model, a location outside the folder, or too many files.
    """
    model = onnx.ModelProto()
    try:
        model.ParseFromString(graph)
    except Exception as exc:  # protobuf's DecodeError: the graph itself is not ONNX
        raise ConfigError(f"{where}: not an ONNX model ({type(exc).__name__})") from None
    found: set[str] = set()
    for tensor in _model_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        for entry in tensor.external_data:
            if entry.key == "location":
                relative_location(entry.value, where)
                found.add(entry.value)
        if len(found) > MAX_EXTERNAL_FILES:
            raise ConfigError(f"{where}: names more than {MAX_EXTERNAL_FILES} external data files")
    return sorted(found)


def _read(path: Path, where: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path.name}: {exc.strerror or exc}") from None


def read_model_files(
    path: Path,
    graph: bytes | None = None,
    read: Callable[[str], bytes | None] | None = None,
    where: str | None = None,
) -> ModelFiles:
    """Read the model file (unless ``graph`` holds it) and every external-data file it names.

    Args:
        path: the model file; external data is looked for next to it.
        graph: the model file's bytes, already read (and perhaps checked, or rewritten).
        read: the bytes of a folder-relative file already read and checked (None: not kept,
            read it from the folder).
        where: how errors name the model (default: the file's name).

    Raises:
        ConfigError: a file cannot be read, or a location is outside the folder.
    """
    label = where or path.name
    if graph is None:
        graph = _read(path, label)
    external: dict[str, bytes] = {}
    for location in external_locations(graph, label):
        relative = relative_location(location, label)
        kept = None if read is None else read(relative)
        external[location] = kept if kept is not None else _read(path.parent / relative, label)
    return ModelFiles(graph, external)
