"""Triton's model configuration (config.pbtxt, or JSON in a load request) to ortserve's ModelConfig.

Parsed against ``model_config.proto`` (Triton's field names and numbers), then mapped field by
field. Every field that is set but has no meaning here is named in one warning per file, never
dropped silently. A model written for another backend (python, pytorch, tensorflow, an
ensemble...), or a stateful or decoupled one, is refused with a reason that says so; what
fields mean beyond their names (graph level, execution mode, batching) is triton_semantics.py. Triton's convention is kept: with
``max_batch_size > 0`` the ``dims`` of inputs and outputs exclude the batch dimension.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.message import Message
from pydantic import ValidationError

from ortserve.config.bounded import bounded_text, load_yaml
from ortserve.config.model import ModelConfig
from ortserve.errors import ConfigError
from ortserve.protocol.grpc import model_config_pb2 as mc
from ortserve.repository.single_model import VIEW_PREFIX
from ortserve.repository.triton_semantics import (
    HANDLED_PARAMETERS,
    batch_limit,
    batching_notes,
    check_stateless,
    graph_level,
    thread_fields,
)

__all__ = [
    "ACCELERATOR_PROVIDERS",
    "DeclaredTensor",
    "TritonConfig",
    "parse_json_config",
    "parse_pbtxt",
    "to_model_config",
]

logger = logging.getLogger(__name__)

_PLATFORMS = {"", "onnxruntime_onnx"}
_BACKENDS = {"", "onnxruntime"}
ACCELERATOR_PROVIDERS = {
    "tensorrt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "cpu": "CPUExecutionProvider",
}
"""Triton's execution accelerator names and the ONNX Runtime provider each selects."""
_TENSORRT_PARAMETERS = {
    "precision_mode": "trt_fp16_enable",
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "trt_engine_cache_enable": "trt_engine_cache_enable",
    "trt_engine_cache_path": "trt_engine_cache_path",
    "max_partition_iterations": "trt_max_partition_iterations",
    "minimum_segment_size": "trt_min_subgraph_size",
}
_RESILIENCE_PARAMETERS = {
    "ortserve.fallback": "fallback",
    "ortserve.faults": "faults",
    "ortserve.inputs": "inputs",
    "ortserve.providers_strict": "providers_strict",
}
"""Parameters whose string value is the YAML (or JSON) of the config.yaml field of that name."""
_SUPPORTED = {
    "name",
    "platform",
    "backend",
    "max_batch_size",
    "input.name",
    "input.data_type",
    "input.dims",
    "input.optional",
    "input.reshape",
    "input.reshape.shape",
    "output.name",
    "output.data_type",
    "output.dims",
    "output.label_filename",
    "output.reshape",
    "output.reshape.shape",
    "dynamic_batching",
    "dynamic_batching.preferred_batch_size",
    "dynamic_batching.max_queue_delay_microseconds",
    "dynamic_batching.priority_levels",
    "dynamic_batching.default_priority_level",
    "dynamic_batching.default_queue_policy.timeout_action",
    "dynamic_batching.default_queue_policy.default_timeout_microseconds",
    "dynamic_batching.default_queue_policy.max_queue_size",
    "instance_group.count",
    "instance_group.kind",
    "instance_group.name",
    "version_policy.latest.num_versions",
    "version_policy.all",
    "version_policy.specific.versions",
    "default_model_filename",
    "optimization.graph",
    "optimization.graph.level",
    "optimization.execution_accelerators.gpu_execution_accelerator.name",
    "optimization.execution_accelerators.gpu_execution_accelerator.parameters",
    "optimization.execution_accelerators.cpu_execution_accelerator.name",
    "optimization.execution_accelerators.cpu_execution_accelerator.parameters",
    "parameters",
    "model_warmup.name",
    "model_warmup.batch_size",
    "model_warmup.count",
    "model_warmup.inputs",
}
_WARMUP_DATA = {"zero_data": "zero", "random_data": "random", "input_data_file": "file"}


@dataclass(frozen=True, slots=True)
class DeclaredTensor:
    """An input or output as config.pbtxt declares it (checked against the graph at load)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    """The shape the graph takes (input) or gives (output) instead of ``dims``, if another."""
    optional: bool = False
    """An input requests may omit (the graph's default is used)."""
    label_filename: str = ""
    """An output's class labels, a file in the model folder (classification; ``repository/labels.py``)."""


@dataclass(frozen=True, slots=True)
class TritonConfig:
    """A Triton configuration mapped: the ModelConfig and the tensors it declares."""

    config: ModelConfig
    inputs: tuple[DeclaredTensor, ...]
    outputs: tuple[DeclaredTensor, ...]


def parse_pbtxt(path: Path, model_name: str) -> TritonConfig:
    """Read and map ``config.pbtxt``.

    Raises:
        ConfigError: unreadable, not valid text format for the schema, another backend, or a
            value ortserve cannot take; the message names the file (and field).
    """
    try:
        text = path.read_text(encoding="utf-8")
        message = text_format.Parse(text, mc.ModelConfig())
    except (OSError, UnicodeDecodeError, text_format.ParseError) as exc:
        raise ConfigError(f"{path}: cannot parse: {exc}") from exc
    return to_model_config(message, str(path), model_name)


def parse_json_config(text: str, model_name: str) -> TritonConfig:
    """Map a Triton JSON configuration (a load request's ``parameters.config``).

    Raises:
        ConfigError: not a JSON ModelConfig, or a value ortserve cannot take.
    """
    try:
        message = json_format.Parse(text, mc.ModelConfig())
    except json_format.ParseError as exc:
        raise ConfigError(f"parameters.config: not a model configuration: {exc}") from exc
    return to_model_config(message, "parameters.config", model_name)


def to_model_config(message: mc.ModelConfig, where: str, model_name: str) -> TritonConfig:
    """Map a parsed Triton ModelConfig; warns once about every field set but not supported.

    Raises:
        ConfigError: another backend, a name that is not the folder's, or an invalid value.
    """
    _check_backend(message, where, model_name)
    check_stateless(message, where)
    threads, notes = thread_fields(message, where)
    unsupported = sorted(set(_set_fields(message)) - _SUPPORTED)
    unsupported += _unsupported_values(message) + notes + batching_notes(message)
    if unsupported:
        logger.warning(
            "%s: fields not supported by ortserve, ignored: %s", where, bounded_text(", ".join(unsupported))
        )
    raw: dict[str, Any] = {
        "batching": _batching(message),
        "instances": sum(group.count or 1 for group in message.instance_group) or 1,
        "version_policy": _version_policy(message),
    }
    if message.default_model_filename:
        raw["default_model_filename"] = message.default_model_filename
    if message.model_warmup:
        raw["warmup"] = [_warmup(sample) for sample in message.model_warmup]
    providers = _providers(message)
    if providers is not None:
        raw["providers"] = providers
    raw.update(threads)
    level = graph_level(message, where)
    if level is not None:
        raw["graph_optimization_level"] = level
    for key, field in _RESILIENCE_PARAMETERS.items():
        if key in message.parameters:
            raw[field] = _yaml_parameter(message, key, where)
    try:
        config = ModelConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{where}: {problems}") from exc
    inputs = tuple(_with_shape(t) for t in message.input)
    outputs = tuple(_with_shape(t) for t in message.output)
    return TritonConfig(config, inputs, outputs)


def _with_shape(tensor: mc.ModelInput | mc.ModelOutput) -> DeclaredTensor:
    declared = _declared(tensor.name, tensor.data_type, tensor.dims)
    if isinstance(tensor, mc.ModelInput) and tensor.optional:
        declared = replace(declared, optional=True)
    if isinstance(tensor, mc.ModelOutput) and tensor.label_filename:
        declared = replace(declared, label_filename=tensor.label_filename)
    if not tensor.HasField("reshape") or list(tensor.reshape.shape) == list(tensor.dims):
        return declared
    return replace(declared, reshape=tuple(int(d) for d in tensor.reshape.shape))


def _renamed(where: str) -> bool:
    """The file is read through a ``--model-name`` view (single_model.py): it keeps its own name."""
    folder = Path(where).parent
    return folder.is_symlink() and folder.parent.name.startswith(VIEW_PREFIX)


def _check_backend(message: mc.ModelConfig, where: str, model_name: str) -> None:
    if message.name and message.name != model_name and not _renamed(where):
        raise ConfigError(
            f"{where}: field name: {message.name!r} is not the model folder's name {model_name!r}"
        )
    other = ""
    if message.WhichOneof("scheduling_choice") == "ensemble_scheduling" or message.platform == "ensemble":
        other = "ensemble"
    elif message.platform not in _PLATFORMS:
        other = f"platform {message.platform!r}"
    elif message.backend not in _BACKENDS:
        other = f"backend {message.backend!r}"
    if other:
        raise ConfigError(
            f"{where}: this model is for {other}; ortserve serves ONNX models only "
            "(platform onnxruntime_onnx / backend onnxruntime)"
        )


def _batching(message: mc.ModelConfig) -> dict[str, Any]:
    limit = batch_limit(message)  # None: decided from the graph, as Triton's auto-complete
    batching: dict[str, Any] = {} if limit is None else {"max_batch_size": limit}
    if not message.HasField("dynamic_batching"):
        batching["max_queue_delay_ms"] = 0.0
        return batching
    dynamic = message.dynamic_batching
    batching["preferred_batch_sizes"] = list(dynamic.preferred_batch_size)
    batching["max_queue_delay_ms"] = dynamic.max_queue_delay_microseconds / 1e3
    if dynamic.priority_levels:
        batching["priority_levels"] = dynamic.priority_levels
        batching["default_priority"] = dynamic.default_priority_level or 1
    policy = dynamic.default_queue_policy
    if policy.default_timeout_microseconds:
        batching["default_timeout_ms"] = policy.default_timeout_microseconds / 1e3
    if policy.max_queue_size:
        batching["max_queue_size"] = policy.max_queue_size
    return batching


def _warmup(sample: mc.ModelWarmup) -> dict[str, Any]:
    inputs: dict[str, Any] = {}
    for name, given in sample.inputs.items():
        choice = given.WhichOneof("input_data_type")
        entry: dict[str, Any] = {
            "datatype": _declared(name, given.data_type, given.dims).datatype,
            "dims": list(given.dims),
            "data": _WARMUP_DATA.get(choice or "zero_data", "zero"),
        }
        if choice == "input_data_file":
            entry["file"] = given.input_data_file
        inputs[name] = entry
    return {
        "name": sample.name,
        "batch_size": sample.batch_size,
        "count": sample.count or 1,
        "inputs": inputs,
    }


def _version_policy(message: mc.ModelConfig) -> Any:
    choice = message.version_policy.WhichOneof("policy_choice")
    if choice == "all":
        return "all"
    if choice == "specific":
        return {"specific": list(message.version_policy.specific.versions)}
    if choice == "latest":
        return {"latest": message.version_policy.latest.num_versions or 1}
    return "latest"


def _providers(message: mc.ModelConfig) -> list[dict[str, Any]] | None:
    accelerators = message.optimization.execution_accelerators
    chosen: list[dict[str, Any]] = []
    for accelerator in [*accelerators.gpu_execution_accelerator, *accelerators.cpu_execution_accelerator]:
        provider = ACCELERATOR_PROVIDERS.get(accelerator.name.lower())
        if provider is None:
            continue  # named in the unsupported-field warning
        options: dict[str, Any] = {}
        for key, value in accelerator.parameters.items():
            if provider == "TensorrtExecutionProvider" and key in _TENSORRT_PARAMETERS:
                options[_TENSORRT_PARAMETERS[key]] = "True" if value.upper() == "FP16" else value
            else:
                options[key] = value
        chosen.append({"name": provider, "options": options})
    if not chosen:
        gpu = any(group.kind == mc.ModelInstanceGroup.KIND_GPU for group in message.instance_group)
        return [{"name": "CUDAExecutionProvider"}, {"name": "CPUExecutionProvider"}] if gpu else None
    if not any(p["name"] == "CPUExecutionProvider" for p in chosen):
        chosen.append({"name": "CPUExecutionProvider"})
    return chosen


def _yaml_parameter(message: mc.ModelConfig, key: str, where: str) -> Any:
    # Bounded (bytes, depth, values) before it is built, by the C loader: see config/bounded.py.
    return load_yaml(message.parameters[key].string_value, f"{where}: field parameters.{key}")


def _declared(name: str, data_type: int, dims: Any) -> DeclaredTensor:
    type_name = mc.DataType.Name(data_type).removeprefix("TYPE_")
    return DeclaredTensor(name, "BYTES" if type_name == "STRING" else type_name, tuple(int(d) for d in dims))


def _unsupported_values(message: mc.ModelConfig) -> list[str]:
    """Fields that are supported in general but set to a value ortserve cannot honour."""
    found = []
    accelerators = message.optimization.execution_accelerators
    for kind in ("gpu_execution_accelerator", "cpu_execution_accelerator"):
        for accelerator in getattr(accelerators, kind):
            if accelerator.name.lower() not in ACCELERATOR_PROVIDERS:
                found.append(f"optimization.execution_accelerators.{kind}.name={accelerator.name}")
    if message.dynamic_batching.default_queue_policy.timeout_action == mc.ModelQueuePolicy.DELAY:
        found.append("dynamic_batching.default_queue_policy.timeout_action=DELAY")
    found += [
        f"parameters.{key}"
        for key in sorted(message.parameters)
        if key not in HANDLED_PARAMETERS and key not in _RESILIENCE_PARAMETERS
    ]
    return found


def _set_fields(message: Message, prefix: str = "") -> list[str]:
    """Dotted paths of every scalar or empty message set in ``message`` (maps: their own path)."""
    paths = []
    for descriptor, value in message.ListFields():
        path = f"{prefix}{descriptor.name}"
        is_message = descriptor.type == descriptor.TYPE_MESSAGE
        if is_message and descriptor.message_type.GetOptions().map_entry:
            paths.append(path)
        elif is_message:
            children = [value] if isinstance(value, Message) else list(value)
            nested = [p for child in children for p in _set_fields(child, f"{path}.")]
            paths.extend(nested or [path])
        else:
            paths.append(path)
    return paths
