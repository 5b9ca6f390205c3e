"""Turning one version folder into a running ServedVersion: session, warm-up, scheduler."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort

from ortserve.config.model import ModelConfig
from ortserve.core.clock import LoopClock
from ortserve.core.costmodel import BatchCostModel
from ortserve.core.datatypes import datatype_of_ort, numpy_dtype
from ortserve.core.model import ServedVersion, VersionInfo
from ortserve.core.model_files import ModelFiles, read_model_files
from ortserve.core.model_hints import generated_warmup_failure
from ortserve.core.observer import SchedulerObserver
from ortserve.core.policy import SchedulingPolicy
from ortserve.core.runner import OrtRunner
from ortserve.core.scheduler import Scheduler
from ortserve.core.session import build_session, plan_session
from ortserve.core.types import TensorSpec
from ortserve.errors import ConfigError
from ortserve.repository.labels import output_labels
from ortserve.repository.optional_inputs import optional_inputs
from ortserve.repository.reshape import Reshape, reshaped_model
from ortserve.repository.warmup import sample_feeds
from ortserve.resilience.building import VersionParts, build_guard, plan_on_device
from ortserve.resilience.guard import ResilienceGuard
from ortserve.settings import ServerSettings

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "LoadInputs", "load_version"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_SIZE = 32
_WARMUP_ROUNDS = 5

Array = npt.NDArray[np.generic]


@dataclass(frozen=True, slots=True)
class LoadInputs:
    """What the model folder adds to the version's file: config.pbtxt ``reshape``s and
    ``optional`` inputs (declared in ``where``), and the model file's bytes (or the model and
    its external data, ``files``) when its signature was checked on exactly them."""

    reshapes: tuple[Reshape, ...] = ()
    where: str = ""
    model_bytes: bytes | None = None
    optional: tuple[str, ...] = ()
    """Inputs config.pbtxt marks ``optional`` (see ``optional_inputs.py``)."""
    files: ModelFiles | None = None
    """The graph and its external data as verified (takes precedence over ``model_bytes``)."""
    label_filenames: Mapping[str, str] = field(default_factory=dict)
    """Each output's ``label_filename`` as the configuration in force declares it."""


@dataclass(frozen=True, slots=True)
class _Prepared:
    info: VersionInfo
    runner: OrtRunner
    cost_model: BatchCostModel
    policy: SchedulingPolicy
    guard: ResilienceGuard | None = None


def _dim(value: object) -> int:
    return value if isinstance(value, int) and value >= 0 else -1


def _specs(args: list[ort.NodeArg]) -> tuple[TensorSpec, ...]:
    return tuple(
        TensorSpec(a.name, datatype_of_ort(a.type, a.name), tuple(_dim(d) for d in a.shape)) for a in args
    )


def _max_batch_size(config: ModelConfig, specs: tuple[TensorSpec, ...], where: Path) -> int:
    dynamic = all(spec.shape and spec.shape[0] == -1 for spec in specs)
    wanted = config.batching.max_batch_size
    if wanted is None:
        return DEFAULT_MAX_BATCH_SIZE if dynamic else 0
    if wanted > 0 and not dynamic:
        raise ConfigError(
            f"{where}: field batching.max_batch_size: {wanted} needs a dynamic first dimension "
            "on every input and output of the graph"
        )
    return wanted


_WARMUP_BYTES = 64 << 20
"""The default warm-up's feeds for its large batch stay within this (a row at least)."""


def _warmup_rows_within(specs: tuple[TensorSpec, ...], budget: int) -> int:
    """The most batch rows whose warm-up feeds fit ``budget`` bytes (at least 1)."""
    row = sum(
        math.prod(max(dim, 1) for dim in spec.shape[1:]) * max(numpy_dtype(spec.datatype).itemsize, 8)
        for spec in specs
    )
    return max(1, budget // max(row, 1))


def _warmup_feeds(specs: tuple[TensorSpec, ...], rows: int, rng: np.random.Generator) -> dict[str, Array]:
    feeds: dict[str, Array] = {}
    for spec in specs:
        shape = tuple(rows if axis == 0 and dim == -1 else max(dim, 1) for axis, dim in enumerate(spec.shape))
        dtype = numpy_dtype(spec.datatype)
        if spec.datatype == "BYTES":
            feeds[spec.name] = np.full(shape, "", dtype=object)
        elif dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = np.zeros(shape, dtype=dtype)
        else:
            feeds[spec.name] = np.zeros(shape, dtype=dtype)
    return feeds


def _policy(config: ModelConfig, max_batch_size: int) -> SchedulingPolicy:
    b = config.batching
    return SchedulingPolicy(
        max_batch_size=max_batch_size,
        max_queue_delay_s=b.max_queue_delay_ms / 1e3,
        preferred_batch_sizes=tuple(sorted(set(b.preferred_batch_sizes))),
        max_queue_size=b.max_queue_size,
        default_timeout_s=None if b.default_timeout_ms is None else b.default_timeout_ms / 1e3,
        latency_budget_s=None if b.latency_budget_ms is None else b.latency_budget_ms / 1e3,
        max_queue_wait_s=None if b.max_queue_wait_ms is None else b.max_queue_wait_ms / 1e3,
        priority_levels=b.priority_levels,
        default_priority=b.default_priority,
        concurrency=b.concurrency if isinstance(b.concurrency, int) else None,
        adaptive_concurrency=b.concurrency == "adaptive",
    )


def _model_files(path: Path, config: ModelConfig, given: LoadInputs) -> ModelFiles:
    """What the session is built from, read once into memory (never mapped from the folder):
    the verified bytes, or the files read now, with the ``reshape``s applied to the graph."""
    files = given.files or read_model_files(path, given.model_bytes, where=_label(path))
    if not given.reshapes:
        return files
    if config.fallback is not None:
        raise ConfigError(
            f"{given.where}: reshape and fallback levels together are not supported (a fallback "
            "session would be built from the graph as exported)"
        )
    batched = bool(config.batching.max_batch_size)
    graph = reshaped_model(path, given.reshapes, batched, given.where, files.graph)
    return ModelFiles(graph, files.external)


def _label(path: Path) -> str:
    """A model file named as its repository names it: ``model/version/file``."""
    return "/".join(path.parts[-3:])


def _prepare(
    name: str,
    version: int,
    path: Path,
    config: ModelConfig,
    settings: ServerSettings,
    given: LoadInputs,
) -> _Prepared:
    plan = plan_session(config, settings.intra_op_threads, settings.inter_op_threads)
    if config.fallback is not None and config.fallback.device_ids:
        plan = plan_on_device(plan, config.fallback.device_ids[0])
    files = _model_files(path, config, given)
    session = build_session(path, plan, files=files)
    overridable = {spec.name: spec for spec in _specs(session.get_overridable_initializers())}
    inputs = _specs(session.get_inputs()) + tuple(overridable[n] for n in given.optional if n in overridable)
    outputs = _specs(session.get_outputs())
    max_batch = _max_batch_size(config, inputs + outputs, path.parent.parent / "config.yaml")
    defaults = {}
    if given.optional:
        graph = onnx.load_from_string(files.graph)
        defaults = optional_inputs(
            session, graph, path.parent, overridable, given.optional, max_batch > 0, given.where
        )
    label = f"model {name!r} version {version}"
    warmup = _warmup_feeds(inputs, 1, np.random.default_rng(1))
    parts = VersionParts(label, path, plan, session, inputs, outputs, max_batch, warmup, given.files)
    guard = build_guard(parts, config, settings)
    chain = None if guard is None else guard.chain
    screened = guard is not None and guard.sandbox is not None
    runner = OrtRunner(
        session if chain is None else chain, config.instances, f"{name}-{version}", screened=screened
    )
    if chain is not None and settings.enable_fault_injection and config.faults:
        runner.inline_below_s = 0.0  # injected latency and hangs must not stall the event loop
    cost = BatchCostModel()
    # The default warm-up's large batch is bounded in bytes: warm-up feeds are made whole, and a
    # max_batch_size of two million (a config in a load request) made 4.8 GB of them.
    largest = min(max_batch, _warmup_rows_within(inputs, _WARMUP_BYTES))
    sizes = config.warmup_batch_sizes or ([1, largest] if max_batch else [1])
    rng = np.random.default_rng(0)
    for rows in sizes:
        if max_batch and rows > max_batch:
            raise ConfigError(
                f"{path.parent.parent / 'config.yaml'}: field warmup_batch_sizes: {rows} exceeds "
                f"max_batch_size {max_batch}"
            )
        feeds = _warmup_feeds(inputs, rows if max_batch else 1, rng)
        try:
            for _ in range(_WARMUP_ROUNDS):
                _, seconds = runner.run_blocking(feeds)
                cost.observe(rows if max_batch else 1, seconds)
        except Exception as exc:  # ONNX Runtime's error on made-up shapes: say so (model_hints.py)
            message = generated_warmup_failure(label, feeds, exc, bool(config.warmup))
            if not config.warmup:
                raise ConfigError(message) from exc
            logger.warning("%s", message)
            break
    _run_samples(config, inputs, max_batch, path.parent.parent, runner)
    labels = output_labels(path.parent.parent, path.parent, outputs, given.label_filenames)  # labels.py
    info = VersionInfo(
        name,
        str(version),
        inputs,
        outputs,
        max_batch,
        tuple(runner.providers),
        input_defaults=defaults,
        labels=labels,
    )
    logger.info(
        "loaded %s version %d: providers %s, intra-op threads %d, inter-op threads %d, "
        "max_batch_size %d, instances %d, batch cost %.3f ms + %.4f ms/row",
        name,
        version,
        info.providers,
        plan.intra_op_threads,
        plan.inter_op_threads,
        max_batch,
        config.instances,
        cost.coefficients[0] * 1e3,
        cost.coefficients[1] * 1e3,
    )
    return _Prepared(info, runner, cost, _policy(config, max_batch), guard)


def _run_samples(
    config: ModelConfig, inputs: tuple[TensorSpec, ...], max_batch: int, model_dir: Path, runner: OrtRunner
) -> None:
    """Run the config's own warm-up samples (``model_warmup``).

    Raises:
        ConfigError: a sample does not fit the graph, or the graph fails on it.
    """
    for sample in config.warmup:
        feeds = sample_feeds(sample, inputs, max_batch, model_dir)
        total = 0.0
        for _ in range(sample.count):
            try:
                _, seconds = runner.run_blocking(feeds)
            except Exception as exc:  # ONNX Runtime's own error: the sample (and the load) fails
                raise ConfigError(
                    f"model_warmup {sample.name!r} failed: {type(exc).__name__}: {exc}"
                ) from exc
            total += seconds
        logger.info(
            "warm-up sample %r: %d runs, %.3f ms each", sample.name, sample.count, total / sample.count * 1e3
        )


async def load_version(
    name: str,
    version: int,
    path: Path,
    config: ModelConfig,
    settings: ServerSettings,
    observer: SchedulerObserver | None = None,
    given: LoadInputs | None = None,
) -> ServedVersion:
    """Build the session and warm it up in a worker thread, then start its scheduler.

    ``observer`` receives the scheduler's batch records (metrics, statistics, tracing).
    ``given``: config.pbtxt's ``reshape``s, applied to the graph before the session is built
    (so the version takes and gives the clients' shapes), and the verified model bytes.

    Raises:
        ConfigError: the config contradicts the graph.
        Exception: whatever ONNX Runtime raises for an unloadable model (logged by the caller).
    """
    loop = asyncio.get_running_loop()
    prepared = await asyncio.to_thread(_prepare, name, version, path, config, settings, given or LoadInputs())
    guard = prepared.guard
    screen = None if guard is None else guard.sandbox
    scheduler = Scheduler(
        prepared.runner, prepared.policy, LoopClock(loop), loop, prepared.cost_model, observer, screen
    )
    if guard is not None:
        guard.start(loop, LoopClock(loop))
    return ServedVersion(prepared.info, scheduler, prepared.runner, guard)
