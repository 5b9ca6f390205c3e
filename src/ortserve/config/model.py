"""Per-model ``config.yaml``: validated at load, errors naming the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ortserve.config.bounded import bounded_text, load_yaml, read_bounded
from ortserve.config.llm import LlmConfig
from ortserve.config.resilience import FallbackConfig, FaultConfig, InputConstraint
from ortserve.config.routing import RoutingConfig
from ortserve.config.warmup import WarmupSample
from ortserve.errors import ConfigError

__all__ = [
    "BatchingConfig",
    "ModelConfig",
    "ProviderConfig",
    "VersionPolicy",
    "load_model_config",
]

CONFIG_FILE = "config.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LatestPolicy(_Strict):
    """Serve the N highest versions."""

    latest: Annotated[int, Field(ge=1)]


class SpecificPolicy(_Strict):
    """Serve exactly these versions."""

    specific: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)]


VersionPolicy = Literal["latest", "all"] | LatestPolicy | SpecificPolicy


class ProviderConfig(_Strict):
    """One execution provider and the ONNX Runtime options passed to it verbatim.

    TensorRT options of note: ``trt_fp16_enable``, ``trt_int8_enable``,
    ``trt_engine_cache_enable``/``trt_engine_cache_path``, ``trt_timing_cache_enable``/
    ``trt_timing_cache_path``, ``trt_profile_min_shapes``/``opt``/``max``. CUDA: ``device_id``,
    ``gpu_mem_limit``.
    """

    name: str
    options: dict[str, str | int | float | bool] = Field(default_factory=dict)


class BatchingConfig(_Strict):
    """Dynamic batching and queueing for one served version."""

    max_batch_size: Annotated[int, Field(ge=0, le=1 << 20)] | None = None
    """Rows per execution; 0 turns batching off. Default: 32 when dim 0 is dynamic, else 0."""
    max_queue_delay_ms: Annotated[float, Field(ge=0)] = 1.0
    """Longest a request waits for company once the runner is busy."""
    preferred_batch_sizes: list[Annotated[int, Field(ge=1)]] = Field(default_factory=list)
    """Batch sizes dispatched as soon as they are reached (no further waiting)."""
    max_queue_size: Annotated[int, Field(ge=1)] = 1024
    """Requests waiting at most; beyond it, 429 with Retry-After."""
    default_timeout_ms: Annotated[float, Field(gt=0)] | None = None
    """Deadline for requests that name none; a request still queued at its deadline gets 504."""
    latency_budget_ms: Annotated[float, Field(gt=0)] | None = None
    """Target end-to-end time: batching stops waiting, and admission refuses, to keep it."""
    max_queue_wait_ms: Annotated[float, Field(ge=0)] | None = None
    """Longest predicted queueing wait admitted (beyond it 429); while waits stay above it for
    twice as long, requests that waited longer are shed unrun (429). Default: automatic, 2 full
    batches of work and at least 50 ms; 0 turns both off (only ``max_queue_size`` bounds the
    queue)."""
    concurrency: Literal["adaptive"] | Annotated[int, Field(ge=1)] | None = None
    """Most requests held at once (queued and running); beyond it, 429. ``adaptive`` learns
    the limit from the latency requests see (rising latency lowers it, see
    ``core/adaptive.py``). Default: none beyond ``max_queue_size`` and the queue-wait target."""
    priority_levels: Annotated[int, Field(ge=1, le=16)] = 2
    """Number of priority lanes; ``parameters.priority`` 1 is the most urgent."""
    default_priority: Annotated[int, Field(ge=1)] = 1
    """Lane for requests that give priority 0 or none."""

    @model_validator(mode="after")
    def _priority_in_range(self) -> BatchingConfig:
        if self.default_priority > self.priority_levels:
            raise ValueError("default_priority must be <= priority_levels")
        return self


class ModelConfig(_Strict):
    """Everything ``config.yaml`` may say about a model; the graph says the rest."""

    version_policy: VersionPolicy = "latest"
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    instances: Annotated[int, Field(ge=1, le=64)] = 1
    """Concurrent executions of one version (one shared session, N runner threads)."""
    providers: list[str | ProviderConfig] | None = None
    """Execution providers in order of preference; default: TensorRT, CUDA, CPU as available."""
    # Bounded: each is an OS thread, and a load request's config may set them (3,000 made
    # 3,000 threads).
    intra_op_threads: Annotated[int, Field(ge=1, le=1024)] | None = None
    inter_op_threads: Annotated[int, Field(ge=1, le=1024)] | None = None
    cpu_affinity: str | None = None
    """ONNX Runtime intra-op thread affinity string, e.g. ``"1;2"`` (see session options)."""
    graph_optimization_level: Literal["disabled", "basic", "extended", "all"] = "all"
    warmup_batch_sizes: list[Annotated[int, Field(ge=1)]] | None = None
    """Batch sizes run with generated inputs before ready; default: 1 and max_batch_size."""
    warmup: list[WarmupSample] = Field(default_factory=list)
    """Warm-up requests of the model's own (Triton's ``model_warmup``), run after the
    generated ones and before the version serves; a sample that fails fails the load."""
    pipeline: str | None = None
    """``package.module:Class`` of a pipeline that wraps this model (see ortserve.pipeline)."""
    prepack_weights: bool = True
    """Let ONNX Runtime copy weights into its kernels' preferred layout at load (faster large
    batches). False keeps external-data weights as memory-mapped file pages: no second copy,
    a much faster load (see README, "Large models")."""
    kind: Literal["onnx", "llm"] = "onnx"
    """``llm``: a decoder-only text generator in Optimum's layout, served on the OpenAI routes."""
    llm: LlmConfig = Field(default_factory=LlmConfig)
    """Generation bounds (``kind: llm`` only)."""
    default_model_filename: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,255}$")] = "model.onnx"
    """The model file inside each version folder (Triton's field of the same name)."""
    providers_strict: bool = False
    """Run only on the providers listed: no CPU appended, and the load fails when one is not
    usable (see docs/resilience.md)."""
    fallback: FallbackConfig | None = None
    """Fallback levels, circuit breaker and degraded answers (docs/resilience.md)."""
    faults: dict[Literal["L0", "L1", "L2", "L3"], FaultConfig] = Field(default_factory=dict)
    """Injected faults per level, honoured only under ``--enable-fault-injection``."""
    inputs: dict[str, InputConstraint] = Field(default_factory=dict)
    """Input sandbox: value range, NaN/Inf and shape limits per input, checked before queueing."""

    routing: RoutingConfig | None = None
    """Traffic policy for requests that name no version: override, split, sticky key, shadow,
    rollout, retirement (see docs/traffic.md)."""

    def provider_list(self) -> list[ProviderConfig] | None:
        if self.providers is None:
            return None
        return [p if isinstance(p, ProviderConfig) else ProviderConfig(name=p) for p in self.providers]


def load_model_config(model_dir: Path) -> ModelConfig:
    """Read ``model_dir/config.yaml`` (defaults when absent), within the bounds of
    :mod:`ortserve.config.bounded`. The repository reads a model's config with
    ``repository.config_source.read_model_config`` (config.pbtxt too); this is for the code
    below the repository (a fallback model's folder) that needs only the YAML.

    Raises:
        ConfigError: unreadable, too large or invalid YAML, or an invalid field, naming the
            file and the field.
    """
    path = model_dir / CONFIG_FILE
    if not path.exists():
        return ModelConfig()
    text = read_bounded(path).decode("utf-8", errors="replace")
    return validated_config(load_yaml(text, str(path)), path)


def validated_config(raw: object, path: Path) -> ModelConfig:
    """A parsed config.yaml document as a ModelConfig (None: the defaults).

    Raises:
        ConfigError: naming the file and every field that is wrong (the list bounded).
    """
    if raw is None:
        return ModelConfig()
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    try:
        return ModelConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"field {'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"{path}: {bounded_text(problems, 4000)}") from None
