"""The effective configuration of a served version, in Triton's ModelConfig form.

What the model configuration API answers (HTTP as JSON with Triton's field names, gRPC as the
``inference.ModelConfig`` message): the file's settings after defaults, plus what the graph
says (tensors, max_batch_size), so ``tritonclient``'s ``get_model_config`` works unchanged.
"""

from __future__ import annotations

from ortserve.config.model import LatestPolicy, ModelConfig, SpecificPolicy
from ortserve.core.model import VersionInfo
from ortserve.core.types import TensorSpec
from ortserve.protocol.grpc import model_config_pb2 as mc
from ortserve.repository.triton_config import ACCELERATOR_PROVIDERS
from ortserve.repository.warmup import WarmupSample

__all__ = ["effective_config"]

_ACCELERATORS = {provider: name for name, provider in ACCELERATOR_PROVIDERS.items()}
_GPU_PROVIDERS = {"TensorrtExecutionProvider", "CUDAExecutionProvider"}


def effective_config(info: VersionInfo, config: ModelConfig | None) -> mc.ModelConfig:
    """Triton's ModelConfig for a served version (``config`` None: defaults, e.g. pipelines)."""
    config = config or ModelConfig()
    batched = info.max_batch_size > 0
    message = mc.ModelConfig(
        name=info.name,
        platform=info.platform,
        backend="onnxruntime" if info.platform == "onnxruntime_onnx" else "",
        max_batch_size=info.max_batch_size,
        default_model_filename=config.default_model_filename,
        input=[
            mc.ModelInput(
                name=s.name,
                data_type=_data_type(s),
                dims=_dims(s, batched),
                optional=s.name in info.input_defaults,
            )
            for s in info.inputs
        ],
        output=[
            mc.ModelOutput(name=s.name, data_type=_data_type(s), dims=_dims(s, batched)) for s in info.outputs
        ],
        version_policy=_version_policy(config),
    )
    gpu = bool(info.providers) and info.providers[0] in _GPU_PROVIDERS
    message.instance_group.add(
        name=f"{info.name}_0",
        count=config.instances,
        kind=mc.ModelInstanceGroup.KIND_GPU if gpu else mc.ModelInstanceGroup.KIND_CPU,
    )
    if batched:
        _dynamic_batching(message.dynamic_batching, config)
    for provider in info.providers:
        name = _ACCELERATORS.get(provider)
        if name is not None and provider != "CPUExecutionProvider":
            accelerators = message.optimization.execution_accelerators
            target = (
                accelerators.gpu_execution_accelerator
                if provider in _GPU_PROVIDERS
                else (accelerators.cpu_execution_accelerator)
            )
            target.add(name=name)
    for sample in config.warmup:
        _warmup(message.model_warmup.add(), sample)
    if config.intra_op_threads is not None:
        message.parameters["intra_op_thread_count"].string_value = str(config.intra_op_threads)
    if config.inter_op_threads is not None:
        message.parameters["inter_op_thread_count"].string_value = str(config.inter_op_threads)
    return message


def _data_type(spec: TensorSpec) -> str:
    return "TYPE_STRING" if spec.datatype == "BYTES" else f"TYPE_{spec.datatype}"


def _dims(spec: TensorSpec, batched: bool) -> list[int]:
    return list(spec.shape[1:] if batched else spec.shape)


def _version_policy(config: ModelConfig) -> mc.ModelVersionPolicy:
    policy = config.version_policy
    if policy == "all":
        return mc.ModelVersionPolicy(all=mc.ModelVersionPolicy.All())
    if isinstance(policy, SpecificPolicy):
        return mc.ModelVersionPolicy(specific=mc.ModelVersionPolicy.Specific(versions=policy.specific))
    count = policy.latest if isinstance(policy, LatestPolicy) else 1
    return mc.ModelVersionPolicy(latest=mc.ModelVersionPolicy.Latest(num_versions=count))


def _dynamic_batching(target: mc.ModelDynamicBatching, config: ModelConfig) -> None:
    b = config.batching
    target.preferred_batch_size.extend(b.preferred_batch_sizes)
    target.max_queue_delay_microseconds = round(b.max_queue_delay_ms * 1e3)
    target.priority_levels = b.priority_levels
    target.default_priority_level = b.default_priority
    target.default_queue_policy.max_queue_size = b.max_queue_size
    if b.default_timeout_ms is not None:
        target.default_queue_policy.default_timeout_microseconds = round(b.default_timeout_ms * 1e3)


def _warmup(target: mc.ModelWarmup, sample: WarmupSample) -> None:
    target.name, target.batch_size, target.count = sample.name, sample.batch_size, sample.count
    for name, given in sample.inputs.items():
        tensor = target.inputs[name]
        tensor.data_type = mc.DataType.Value(
            "TYPE_STRING" if given.datatype == "BYTES" else f"TYPE_{given.datatype}"
        )
        tensor.dims.extend(given.dims)
        if given.data == "file":
            tensor.input_data_file = str(given.file)
        elif given.data == "random":
            tensor.random_data = True
        else:
            tensor.zero_data = True
