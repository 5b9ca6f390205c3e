"""Building ONNX Runtime sessions: execution-provider chain, thread pools, optimization."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from ortserve.config.model import ModelConfig, ProviderConfig
from ortserve.core.cpus import usable_cpus
from ortserve.core.model_files import ModelFiles, read_model_files
from ortserve.core.tensorrt import (
    cache_folder,
    gpu_name,
    graph_inputs,
    installed_tensorrt,
    int8_table,
    model_digest,
    tensorrt_options,
)
from ortserve.errors import ConfigError
from ortserve.ort_runtime import session_log_severity

__all__ = ["DEFAULT_PROVIDER_ORDER", "SessionPlan", "build_session", "plan_session", "session_options"]

logger = logging.getLogger(__name__)

DEFAULT_PROVIDER_ORDER = (
    "TensorrtExecutionProvider",
    "CUDAExecutionProvider",
    "CPUExecutionProvider",
)

_OPT_LEVELS = {
    "disabled": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
"""Names, not members: nothing here touches onnxruntime at import (``--workers`` forks from a
process that has imported this module but not ONNX Runtime, see ``supervisor/zygote.py``)."""


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """What a session will be built with, decided before any model is read."""

    providers: tuple[tuple[str, dict[str, str]], ...]
    missing: tuple[str, ...]
    intra_op_threads: int
    inter_op_threads: int
    cpu_affinity: str | None
    optimization_level: str
    prepack_weights: bool = True
    strict: bool = False
    """Only the listed providers: none missing, none dropped, no CPU appended."""
    max_batch_size: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    """Batch sizes TensorRT builds its optimization profiles for (:mod:`ortserve.core.tensorrt`)."""


def _chosen_providers(
    requested: list[ProviderConfig] | None, available: list[str], strict: bool = False
) -> tuple[list[tuple[str, dict[str, str]]], list[str]]:
    if requested is None:
        auto: list[tuple[str, dict[str, str]]] = [
            (name, {}) for name in DEFAULT_PROVIDER_ORDER if name in available
        ]
        return auto, []
    chosen: list[tuple[str, dict[str, str]]] = []
    missing: list[str] = []
    for provider in requested:
        if provider.name in available:
            chosen.append((provider.name, {k: str(v) for k, v in provider.options.items()}))
        else:
            missing.append(provider.name)
    if not strict and not any(name == "CPUExecutionProvider" for name, _ in chosen):
        chosen.append(("CPUExecutionProvider", {}))
    return chosen, missing


def plan_session(
    config: ModelConfig, intra_op_default: int | None, inter_op_default: int | None
) -> SessionPlan:
    """Decide providers and thread counts for a model from its config and the server's.

    Raises:
        ConfigError: ``providers_strict`` without ``providers``, or with one not available.
    """
    requested = config.provider_list()
    available = ort.get_available_providers()
    if config.providers_strict and not requested:
        raise ConfigError("providers_strict: true needs the providers listed in field providers")
    providers, missing = _chosen_providers(requested, available, config.providers_strict)
    if config.providers_strict and missing:
        raise ConfigError(
            f"providers_strict: execution provider(s) {missing} not usable in this ONNX Runtime "
            f"build (available: {available}); not running anywhere else"
        )
    intra = config.intra_op_threads or intra_op_default or usable_cpus()
    inter = config.inter_op_threads or inter_op_default or 1
    return SessionPlan(
        providers=tuple(providers),
        missing=tuple(missing),
        intra_op_threads=intra,
        inter_op_threads=inter,
        cpu_affinity=config.cpu_affinity,
        optimization_level=config.graph_optimization_level,
        prepack_weights=config.prepack_weights,
        strict=config.providers_strict,
        max_batch_size=config.batching.max_batch_size or 0,
        preferred_batch_sizes=tuple(config.batching.preferred_batch_sizes),
    )


def build_session(
    model_path: Path,
    plan: SessionPlan,
    model_bytes: bytes | None = None,
    files: ModelFiles | None = None,
) -> ort.InferenceSession:
    """Create the session; warns about every requested provider that is not available.

    Never from the folder: the graph and its external-data files are read into private memory
    first (:mod:`ortserve.core.model_files`), so a writer truncating or rewriting a served
    file changes nothing and crashes nothing.

    Args:
        model_bytes: the model file's contents, already read (a graph rewritten at load);
            its external data is read from next to ``model_path``.
        files: the graph and its external data, already read (and checked against a
            signature); takes precedence over ``model_bytes``.
    """
    for name in plan.missing:
        logger.warning(
            "%s: execution provider %s is not available in this ONNX Runtime build (%s)",
            model_path.name,
            name,
            ", ".join(ort.get_available_providers()),
        )
    if files is None:
        files = read_model_files(model_path, model_bytes)
    options = session_options(plan)
    options.log_severity_level = session_log_severity()  # nothing unstructured on stderr (ort_runtime.py)
    names = [name for name, _ in plan.providers]
    provider_options = [opts for _, opts in plan.providers]
    if "TensorrtExecutionProvider" in names:
        index = names.index("TensorrtExecutionProvider")
        provider_options[index] = _tensorrt_options(provider_options[index], files, plan, model_path.parent)
    # A location not handed over here would be looked for (and memory-mapped) in this folder;
    # every one the graph names is handed over, so this only shapes ONNX Runtime's messages.
    options.add_session_config_entry(
        "session.model_external_initializers_file_folder_path", str(model_path.parent)
    )
    if files.external:
        locations = list(files.external)
        buffers = [files.external[location] for location in locations]
        options.add_external_initializers_from_files_in_memory(
            locations, buffers, [len(buffer) for buffer in buffers]
        )
    session = ort.InferenceSession(
        files.graph, sess_options=options, providers=names, provider_options=provider_options
    )
    active = session.get_providers()
    dropped = [n for n in names if n not in active]
    if dropped and plan.strict:
        raise ConfigError(
            f"{model_path}: providers_strict: providers {dropped} failed to initialise (active: {active}); "
            "not running anywhere else"
        )
    if dropped:
        logger.warning("%s: providers %s failed to initialise; active: %s", model_path, dropped, active)
    return session


def _tensorrt_options(
    user: dict[str, str], files: ModelFiles, plan: SessionPlan, model_dir: Path
) -> dict[str, str]:
    """TensorRT's options completed with an engine cache keyed by GPU, TensorRT and graph,
    profiles from the batch sizes (warm-up builds every engine before READY), and INT8 with
    the calibration table beside the model if one was written there."""
    device = int(user.get("device_id", "0") or 0)
    digest = model_digest([files.graph, *(files.external[key] for key in sorted(files.external))])
    root = Path.home() / ".cache" / "ortserve" / "tensorrt"
    folder = cache_folder(root, gpu_name(device), installed_tensorrt(), digest)
    options = tensorrt_options(
        user,
        graph_inputs(files.graph),
        plan.max_batch_size,
        plan.preferred_batch_sizes,
        folder,
        int8_table(model_dir),
    )
    logger.info(
        "TensorRT engines for this graph are built at load and cached in %s", options["trt_engine_cache_path"]
    )
    return options


def session_options(plan: SessionPlan) -> ort.SessionOptions:
    """ONNX Runtime's options for a plan: thread pools, no spinning, optimization, prepacking."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = plan.intra_op_threads
    options.inter_op_num_threads = plan.inter_op_threads
    options.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if plan.inter_op_threads > 1 else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    options.graph_optimization_level = getattr(
        ort.GraphOptimizationLevel, _OPT_LEVELS[plan.optimization_level]
    )
    # Spinning threads burn the core that the event loop needs between batches.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if not plan.prepack_weights:
        # No second copy of the weights in the layout the CPU kernels prefer: the session holds
        # one private copy of what was read (never the file's pages, see model_files.py).
        options.add_session_config_entry("session.disable_prepacking", "1")
    if plan.cpu_affinity:
        options.add_session_config_entry("session.intra_op_thread_affinities", plan.cpu_affinity)
    return options
