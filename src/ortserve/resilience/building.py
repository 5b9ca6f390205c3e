"""Building a version's resilience at load: fallback levels, breakers, faults and sandbox."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from ortserve.config.model import ModelConfig, load_model_config
from ortserve.config.names import is_model_name
from ortserve.config.resilience import FallbackConfig
from ortserve.core.model_files import ModelFiles
from ortserve.core.sandbox import InputLimits, InputSandbox
from ortserve.core.session import SessionPlan, build_session, plan_session
from ortserve.core.types import TensorSpec
from ortserve.errors import ConfigError
from ortserve.resilience.breaker import Breaker, BreakerPolicy
from ortserve.resilience.chain import FallbackChain
from ortserve.resilience.defaults import DefaultAnswers
from ortserve.resilience.faults import FaultInjector
from ortserve.resilience.guard import ResilienceGuard
from ortserve.resilience.levels import DefaultLevel, Level, SessionLevel
from ortserve.resilience.nvml import current_health
from ortserve.settings import ServerSettings

__all__ = ["VersionParts", "build_guard", "plan_on_device"]

logger = logging.getLogger(__name__)

Array = npt.NDArray[np.generic]
Feeds = dict[str, Array]

_DEVICE_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider", "ROCMExecutionProvider")


@dataclasses.dataclass(frozen=True, slots=True)
class VersionParts:
    """What the loader already built for a version, which the levels reuse."""

    label: str
    path: Path
    plan: SessionPlan
    session: ort.InferenceSession
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    warmup: Feeds
    files: ModelFiles | None = None
    """The graph and external data as their signature check read them (None: unsigned): the
    levels built from the same model use these bytes, never the folder again."""


def plan_on_device(plan: SessionPlan, device_id: int) -> SessionPlan:
    """The plan with ``device_id`` set on every GPU provider (CPU-only plans are unchanged)."""
    providers = tuple(
        (name, {**options, "device_id": str(device_id)}) if name in _DEVICE_PROVIDERS else (name, options)
        for name, options in plan.providers
    )
    return dataclasses.replace(plan, providers=providers)


def build_guard(parts: VersionParts, config: ModelConfig, settings: ServerSettings) -> ResilienceGuard | None:
    """The version's guard, or None when its config asks for no sandbox, fallback or faults.

    Raises:
        ConfigError: a fallback level contradicts the graph (lighter model's tensors, defaults).
    """
    sandbox = _sandbox(config, parts)
    faults = config.faults if settings.enable_fault_injection else {}
    if config.faults and not settings.enable_fault_injection:
        logger.warning("%s: faults: in its config ignored (no --enable-fault-injection)", parts.label)
    if config.fallback is None and not faults:
        return None if sandbox is None else ResilienceGuard(None, sandbox)
    if any(spec.datatype == "BF16" for spec in (*parts.inputs, *parts.outputs)):
        raise ConfigError(f"{parts.label}: fallback and faults are not supported for bfloat16 graphs yet")
    fallback = config.fallback or FallbackConfig(session="none")
    injectors: dict[str, FaultInjector] = {}
    for name, fault in faults.items():
        injectors[name] = injector = FaultInjector(fault)
        logger.warning(
            "%s: fault injection on %s: %s (schedule from monotonic %.3f)",
            parts.label,
            name,
            fault.model_dump(exclude_defaults=True),
            injector.started_at,
        )
    levels = _levels(parts, config, fallback, injectors, settings)
    policy = BreakerPolicy(**fallback.breaker.model_dump())
    devices = [_device_of(parts.plan), *fallback.device_ids[1:]]
    breakers = [Breaker(policy, time.monotonic) for _ in levels]
    _watch_devices(breakers, devices)
    defaults = levels[-1].answers if isinstance(levels[-1], DefaultLevel) else None
    chain = FallbackChain(parts.label, parts.session, levels, breakers, defaults, fallback.degraded_status)
    logger.info("%s: fallback levels %s", parts.label, ", ".join(level.name for level in levels))
    return ResilienceGuard(chain, sandbox, fallback.ready_when_degraded)


def _sandbox(config: ModelConfig, parts: VersionParts) -> InputSandbox | None:
    if not config.inputs:
        return None
    known = {spec.name for spec in parts.inputs}
    unknown = sorted(set(config.inputs) - known)
    if unknown:
        raise ConfigError(
            f"{parts.label}: field inputs: {unknown} are not inputs of the graph ({sorted(known)})"
        )
    return InputSandbox(
        {
            name: InputLimits(
                c.min, c.max, c.allow_nan, c.allow_inf, None if c.max_shape is None else tuple(c.max_shape)
            )
            for name, c in config.inputs.items()
        }
    )


def _levels(
    parts: VersionParts,
    config: ModelConfig,
    fallback: FallbackConfig,
    faults: dict[str, FaultInjector],
    settings: ServerSettings,
) -> list[Level]:
    names = [spec.name for spec in parts.outputs]
    levels: list[Level] = [
        SessionLevel(
            0,
            "L0 primary",
            functools.partial(_same, parts.session),
            names,
            parts.warmup,
            faults.get("L0"),
            session=parts.session,
        )
    ]
    for device in fallback.device_ids[1:]:
        plan = plan_on_device(parts.plan, device)
        session = build_session(parts.path, plan, files=parts.files)
        built = functools.partial(_same, session)
        levels.append(
            SessionLevel(
                1, f"L1 device {device}", built, names, parts.warmup, faults.get("L1"), session=session
            )
        )
    second = _second_session(parts, config, fallback, names, faults, settings)
    if second is not None:
        levels.append(second)
    if fallback.default is not None:
        answers = DefaultAnswers(
            fallback.default, parts.inputs, parts.outputs, parts.max_batch_size > 0, parts.label
        )
        if answers.has_static or answers.remembers:
            levels.append(DefaultLevel(answers, faults.get("L3")))
    return levels


def _second_session(
    parts: VersionParts,
    config: ModelConfig,
    fallback: FallbackConfig,
    names: list[str],
    faults: dict[str, FaultInjector],
    settings: ServerSettings,
) -> SessionLevel | None:
    if fallback.model is not None:
        path, other = _lighter_model(parts, fallback, settings)
        plan = plan_session(other, settings.intra_op_threads, settings.inter_op_threads)
        chunk = other.batching.max_batch_size or (32 if parts.max_batch_size else 0)
        label = f"L2 model {fallback.model}"
    elif fallback.session == "cpu":
        path, plan, chunk = parts.path, _cpu_plan(parts.plan), 0
        label = "L2 cpu session"
    else:
        return None
    build = functools.partial(_build_checked, path, plan, parts)
    built = build() if fallback.build == "load" else None
    chunk = chunk if parts.max_batch_size else 0
    return SessionLevel(2, label, build, names, parts.warmup, faults.get("L2"), chunk, session=built)


def _device_of(plan: SessionPlan) -> int | None:
    """The GPU a plan runs on (None on CPU)."""
    for name, options in plan.providers:
        if name in _DEVICE_PROVIDERS:
            return int(options.get("device_id", "0"))
    return None


def _watch_devices(breakers: list[Breaker], devices: list[int | None]) -> None:
    """A level on a GPU is held open while NVML reports that GPU unhealthy."""
    health = current_health()
    if health is None:
        return
    for breaker, device in zip(breakers, devices, strict=False):
        if device is not None:
            health.watch(device, breaker)


def _same(session: ort.InferenceSession) -> ort.InferenceSession:
    return session


def _cpu_plan(plan: SessionPlan) -> SessionPlan:
    return dataclasses.replace(plan, providers=(("CPUExecutionProvider", {}),), missing=(), strict=False)


def _lighter_model(
    parts: VersionParts, fallback: FallbackConfig, settings: ServerSettings
) -> tuple[Path, ModelConfig]:
    assert fallback.model is not None
    if not is_model_name(fallback.model):  # "../elsewhere" read a model file outside the repository
        raise ConfigError(f"{parts.label}: field fallback.model: {fallback.model!r} is not a model name")
    if settings.trusted_keys is not None:
        # Its folder's signature is not checked here: a verified version must not fall back to
        # bytes nobody verified.
        raise ConfigError(f"{parts.label}: field fallback.model is not available with --trusted-keys")
    folder = parts.path.parent.parent.parent / fallback.model
    versions = sorted(int(p.name) for p in folder.glob("*") if p.is_dir() and p.name.isdigit())
    version = fallback.version or (versions[-1] if versions else None)
    if version is None or version not in versions:
        raise ConfigError(
            f"{parts.label}: field fallback.model: {fallback.model!r} version {fallback.version} "
            f"not found under {folder}"
        )
    other = load_model_config(folder)
    return folder / str(version) / other.default_model_filename, other


def _build_checked(path: Path, plan: SessionPlan, parts: VersionParts) -> ort.InferenceSession:
    """Build a fallback session and check it takes the same inputs and gives the same outputs."""
    session = build_session(path, plan, files=parts.files if path == parts.path else None)
    have_in = {a.name for a in session.get_inputs()}
    have_out = {a.name for a in session.get_outputs()}
    want_in = {s.name for s in parts.inputs}
    want_out = {s.name for s in parts.outputs}
    if have_in != want_in or not want_out <= have_out:
        raise ConfigError(
            f"{path}: a fallback must take the inputs {sorted(want_in)} and give the outputs "
            f"{sorted(want_out)} (it takes {sorted(have_in)}, gives {sorted(have_out)})"
        )
    return session
