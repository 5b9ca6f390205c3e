"""Which configuration file a model folder has, and reading it into a ModelConfig.

A folder holds ``config.yaml`` (ortserve's own), ``config.pbtxt`` (Triton's), or neither
(defaults). Both at once is refused: two files that can disagree about batching or versions
would make the served behaviour depend on a precedence rule nobody reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from google.protobuf import text_format

from ortserve.config.bounded import bounded_text, load_yaml, read_bounded
from ortserve.config.model import CONFIG_FILE, ModelConfig, validated_config
from ortserve.core.model import VersionInfo
from ortserve.errors import ConfigError
from ortserve.protocol.grpc import model_config_pb2 as mc
from ortserve.repository.reshape import Reshape
from ortserve.repository.triton_config import DeclaredTensor, TritonConfig, to_model_config

__all__ = ["PBTXT_FILE", "ModelSource", "check_declared", "read_model_config", "read_model_source"]

PBTXT_FILE = "config.pbtxt"


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A model's configuration and where it came from (for error messages)."""

    config: ModelConfig
    where: str
    inputs: tuple[DeclaredTensor, ...] = ()
    outputs: tuple[DeclaredTensor, ...] = ()
    digests: Mapping[str, str] | None = None
    """SHA-256 of the configuration file parsed, by name (``{}``: the folder has none; None:
    not from the folder, a load request's configuration)."""

    @classmethod
    def from_triton(cls, triton: TritonConfig, where: str) -> ModelSource:
        return cls(triton.config, where, triton.inputs, triton.outputs)

    def optional_inputs(self) -> tuple[str, ...]:
        """The inputs config.pbtxt marks ``optional``."""
        return tuple(tensor.name for tensor in self.inputs if tensor.optional)

    def reshapes(self) -> tuple[Reshape, ...]:
        """The declared tensors whose graph shape is not the clients' (``reshape``)."""
        return tuple(
            Reshape(kind, tensor.name, tensor.dims, tensor.reshape)
            for kind, tensors in (("input", self.inputs), ("output", self.outputs))
            for tensor in tensors
            if tensor.reshape is not None
        )


def read_model_source(folder: Path) -> ModelSource:
    """The model's configuration from its folder (defaults when it has no file).

    The file is read once, measured (config/bounded.py), parsed from those bytes, and their
    SHA-256 kept in :attr:`ModelSource.digests` for the signature check: the configuration
    that serves is the one whose digest was checked.

    Raises:
        ConfigError: both files, or an invalid one; the message names the file and the field.
    """
    yaml_path, pbtxt_path = folder / CONFIG_FILE, folder / PBTXT_FILE
    if yaml_path.exists() and pbtxt_path.exists():
        raise ConfigError(f"{folder}: has both {CONFIG_FILE} and {PBTXT_FILE}; keep one of them")
    if pbtxt_path.exists():
        data = read_bounded(pbtxt_path)
        try:
            message = text_format.Parse(data.decode("utf-8"), mc.ModelConfig())
        except (UnicodeDecodeError, text_format.ParseError, RecursionError) as exc:
            problem = "nested too deeply" if isinstance(exc, RecursionError) else bounded_text(str(exc), 300)
            raise ConfigError(f"{pbtxt_path}: cannot parse: {problem}") from None
        triton = to_model_config(message, str(pbtxt_path), folder.name)
        return replace(ModelSource.from_triton(triton, str(pbtxt_path)), digests=_digest(PBTXT_FILE, data))
    if not yaml_path.exists():
        return ModelSource(ModelConfig(), str(yaml_path), digests={})
    data = read_bounded(yaml_path)
    raw = load_yaml(data.decode("utf-8", errors="replace"), str(yaml_path))
    return ModelSource(validated_config(raw, yaml_path), str(yaml_path), digests=_digest(CONFIG_FILE, data))


def _digest(name: str, data: bytes) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest()}


def read_model_config(folder: Path) -> ModelConfig:
    """Only the ModelConfig of :func:`read_model_source`."""
    return read_model_source(folder).config


def check_declared(source: ModelSource, info: VersionInfo) -> None:
    """The tensors a config.pbtxt declares must be the graph's (dims without the batch dim).

    Raises:
        ConfigError: an unknown tensor, another datatype, or other dims.
    """
    batched = info.max_batch_size > 0
    for kind, declared, specs in (
        ("input", source.inputs, info.inputs),
        ("output", source.outputs, info.outputs),
    ):
        graph = {spec.name: spec for spec in specs}
        for tensor in declared:
            spec = graph.get(tensor.name)
            if spec is None:
                raise ConfigError(
                    f"{source.where}: {kind} {tensor.name!r} is not in the graph ({sorted(graph)})"
                )
            if spec.datatype != tensor.datatype:
                raise ConfigError(
                    f"{source.where}: {kind} {tensor.name!r} has data_type {tensor.datatype}; "
                    f"the graph says {spec.datatype}"
                )
            shape = spec.shape[1:] if batched else spec.shape
            if len(shape) != len(tensor.dims) or any(
                g not in (-1, d) and d != -1 for g, d in zip(shape, tensor.dims)
            ):
                raise ConfigError(
                    f"{source.where}: {kind} {tensor.name!r} has dims {list(tensor.dims)}; the graph's "
                    f"are {list(shape)}{' after the batch dimension' if batched else ''}"
                )
