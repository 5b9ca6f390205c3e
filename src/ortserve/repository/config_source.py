"""Which configuration file a model folder has, and reading it into a ModelConfig.

A folder holds ``config.yaml`` (ortserve's own), ``config.pbtxt`` (Triton's), or neither
(defaults). Both at once is refused: two files that can disagree about batching or versions
would make the served behaviour depend on a precedence rule nobody reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ortserve.core.model import VersionInfo
from ortserve.errors import ConfigError
from ortserve.repository.bounded_config import DEFAULT_LIMITS, check_yaml
from ortserve.repository.config import CONFIG_FILE, ModelConfig, load_model_config
from ortserve.repository.reshape import Reshape
from ortserve.repository.triton_config import DeclaredTensor, TritonConfig, parse_pbtxt

__all__ = ["PBTXT_FILE", "ModelSource", "check_declared", "read_model_config", "read_model_source"]

PBTXT_FILE = "config.pbtxt"


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A model's configuration and where it came from (for error messages)."""

    config: ModelConfig
    where: str
    inputs: tuple[DeclaredTensor, ...] = ()
    outputs: tuple[DeclaredTensor, ...] = ()

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

    Raises:
        ConfigError: both files, or an invalid one; the message names the file and the field.
    """
    yaml_path, pbtxt_path = folder / CONFIG_FILE, folder / PBTXT_FILE
    if yaml_path.exists() and pbtxt_path.exists():
        raise ConfigError(f"{folder}: has both {CONFIG_FILE} and {PBTXT_FILE}; keep one of them")
    if pbtxt_path.exists():
        _check_size(pbtxt_path)
        return ModelSource.from_triton(parse_pbtxt(pbtxt_path, folder.name), str(pbtxt_path))
    if yaml_path.exists():
        check_yaml(_check_size(yaml_path).read_text(encoding="utf-8", errors="replace"), str(yaml_path))
    try:
        return ModelSource(load_model_config(folder), str(yaml_path))
    except RecursionError:  # check_yaml bounds the depth far below this; never a traceback
        raise ConfigError(f"{yaml_path}: nested too deeply") from None


def _check_size(path: Path) -> Path:
    """Raises: ConfigError: larger than a configuration may be (bounded_config.py)."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if size > DEFAULT_LIMITS.max_bytes:
        raise ConfigError(f"{path}: larger than {DEFAULT_LIMITS.max_bytes} bytes")
    return path


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
