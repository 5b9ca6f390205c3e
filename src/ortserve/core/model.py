"""One served model version: its metadata, validation, scheduler and runner, and its state."""

from __future__ import annotations

import asyncio
import enum
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ortserve.core.classification import CLASSIFICATION, class_count, classify
from ortserve.core.guards import Guard
from ortserve.core.marks import unmark
from ortserve.core.runner import OrtRunner
from ortserve.core.scheduler import Scheduler
from ortserve.core.types import InferOutput, InferRequest, InferResponse, Parameters, TensorSpec
from ortserve.core.validation import InputValidator
from ortserve.errors import InvalidInput, ModelNotReady, OrtServeError

__all__ = ["ModelState", "Servable", "ServedVersion", "VersionInfo", "select_outputs"]

Array = npt.NDArray[np.generic]


class ModelState(enum.Enum):
    """Lifecycle of a served version."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    DRAINING = "draining"
    """Replaced or removed: no new requests; those it holds finish."""
    UNLOADING = "unloading"
    UNLOADED = "unloaded"
    """Unloaded on purpose (model control): not serving, and not a readiness failure."""


@dataclass(frozen=True, slots=True)
class VersionInfo:
    """What a served version is, independent of how it runs."""

    name: str
    version: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    providers: tuple[str, ...]
    platform: str = "onnxruntime_onnx"
    input_defaults: Mapping[str, Array] = field(default_factory=dict, compare=False)
    """Optional inputs (config.pbtxt ``optional``) and the value a request that omits one gets:
    the graph's own default, one row when the model batches (repeated for each row)."""
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict, compare=False)
    """Class labels per output, for the classification extension (repository/labels.py)."""


class Servable(Protocol):
    """What the DataPlane serves under a name and version: an ONNX model or a pipeline."""

    info: VersionInfo
    state: ModelState

    @property
    def ready(self) -> bool: ...

    def refusal(self, priority: int = 0) -> OrtServeError | None:
        """What ``submit`` would refuse for load now (Overloaded, ModelNotReady), or None,
        cheaply, before the request is decoded. The error may be shared by many requests:
        answer with it, never raise it."""
        ...

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]: ...

    async def infer(self, request: InferRequest) -> InferResponse: ...

    async def unload(self, grace_s: float) -> None: ...


class ServedVersion:
    """Validates requests for one version, queues them on its scheduler, shapes the answer.

    Args:
        info: names, specs and batching of the version.
        scheduler: the version's queue and batcher.
        runner: the session runner, closed when the version is unloaded.
        guard: input sandbox and fallback chain (docs/resilience.md), when configured.
    """

    def __init__(
        self,
        info: VersionInfo,
        scheduler: Scheduler,
        runner: OrtRunner | None = None,
        guard: Guard | None = None,
    ) -> None:
        self.info = info
        self.scheduler = scheduler
        self.runner = runner
        self.guard = guard
        self._breaker = None if guard is None else guard.primary
        """Level 0's breaker, read for every request; the guard is asked only when it does not
        allow."""
        self._shapes = None if guard is None else guard.shapes
        self.state = ModelState.READY
        self._output_index = {spec.name: i for i, spec in enumerate(info.outputs)}
        self._validator = InputValidator(info.inputs, info.max_batch_size > 0, info.input_defaults)

    @property
    def ready(self) -> bool:
        if self.state is not ModelState.READY:
            return False
        breaker = self._breaker
        return breaker is None or breaker.allows or (self.guard is not None and self.guard.ready)

    def fallback_parameters(self) -> Parameters:
        """The fallback level and its reason (empty without a fallback chain)."""
        return {} if self.guard is None else self.guard.parameters()

    def refusal(
        self, priority: int = 0, tenant_of: Callable[[], str | None] | None = None
    ) -> OrtServeError | None:
        """The refusal a request would get now, from its model name alone, or None
        (``tenant_of``: names its tenant, asked only if needed; see :meth:`Scheduler.refusal`).

        Returns:
            ModelNotReady, Overloaded, InvalidInput (priority out of range); see
            :meth:`Scheduler.refusal` (the error may be shared: answer with it, never raise it).
        """
        if self.state is not ModelState.READY:
            return ModelNotReady(
                f"model {self.info.name!r} version {self.info.version} is {self.state.value}"
            )
        breaker = self._breaker
        if breaker is not None and not breaker.allows and self.guard is not None:
            try:
                self.guard.check_usable()
            except ModelNotReady as error:
                return error
        return self.scheduler.refusal(priority, tenant_of)

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        """Validate and queue one request; the future gives an answer with only its rows.

        A callback chain rather than a coroutine: no task per request on the hot path.
        Cancelling the returned future (the client went away) withdraws the queued request.

        Raises:
            InvalidInput, Overloaded, ModelNotReady at once; the future may fail with
            DeadlineExceeded, ModelNotReady or InferenceError.
        """
        if self.state is not ModelState.READY:
            raise ModelNotReady(f"model {self.info.name!r} version {self.info.version} is {self.state.value}")
        selected = select_outputs(request, self._output_index)
        if request.outputs is not None:
            for index, parameters in selected:
                class_count(parameters, self.info.outputs[index])  # InvalidInput before any work
        feeds, rows = self._validator.validate(request.inputs)
        breaker = self._breaker
        if breaker is not None and not breaker.allows and self.guard is not None:
            self.guard.check_usable()  # ModelNotReady: no level can answer now (503)
        if self._shapes is not None:
            self._shapes.check_shapes(feeds)  # InvalidInput: over an input's max_shape
        queued = self.scheduler.submit(feeds, rows, request.priority, request.timeout_s, request.tenant)
        answer: asyncio.Future[InferResponse] = queued.get_loop().create_future()
        queued.add_done_callback(functools.partial(self._answer, answer, selected, request.id))
        answer.add_done_callback(functools.partial(_withdraw, queued))
        return answer

    async def infer(self, request: InferRequest) -> InferResponse:
        """``submit`` and wait for the answer."""
        return await self.submit(request)

    def _answer(
        self,
        answer: asyncio.Future[InferResponse],
        selected: list[tuple[int, Parameters]],
        request_id: str | None,
        queued: asyncio.Future[list[Array]],
    ) -> None:
        if answer.done():
            return
        if queued.cancelled():
            answer.cancel()
            return
        error = queued.exception()
        if error is not None:
            answer.set_exception(error)
            return
        arrays, degraded = unmark(queued.result())
        specs = self.info.outputs
        # The datatype comes from the graph, not the array: BF16 arrives as uint16 (core/datatypes.py).
        outputs = [
            InferOutput(specs[i].name, specs[i].datatype, arrays[i].shape, arrays[i], p)
            if not p.get(CLASSIFICATION)
            else self._classified(specs[i], arrays[i], p)
            for i, p in selected
        ]
        response = InferResponse(self.info.name, self.info.version, outputs, request_id)
        if degraded is not None:
            response.degraded = degraded
            response.parameters = {
                "degraded": True,
                "fallback_level": degraded.level,
                "fallback_reason": degraded.reason,
            }
        answer.set_result(response)

    def _classified(self, spec: TensorSpec, array: Array, parameters: Parameters) -> InferOutput:
        """The top classes of ``array`` as Triton's ``score:index:label`` strings (BYTES)."""
        count = class_count(parameters, spec) or 0  # checked at submit: an int
        labels = self.info.labels.get(spec.name, ())
        classes = classify(array, spec.datatype, count, labels, self.info.max_batch_size > 0)
        return InferOutput(spec.name, "BYTES", classes.shape, classes, parameters)

    async def unload(self, grace_s: float) -> None:
        """Stop admitting, let queued and running requests finish (up to ``grace_s``), close."""
        self.state = ModelState.DRAINING
        if not await self.scheduler.drain(grace_s):
            self.scheduler.abort(
                f"model {self.info.name!r} version {self.info.version} was unloaded before this "
                f"request could run (drain grace {grace_s:g} s)"
            )
        self.state = ModelState.UNLOADING
        if self.guard is not None:
            await self.guard.close()
        if self.runner is not None:
            self.runner.close()
            # Released means released: the worker threads are gone when unload returns.
            await asyncio.to_thread(self.runner.join, max(grace_s, 1.0))


def select_outputs(request: InferRequest, output_index: dict[str, int]) -> list[tuple[int, Parameters]]:
    """The outputs a request asks for, as (index, parameters); every output when it names none.

    Raises:
        InvalidInput: an unknown or repeated output name.
    """
    if request.outputs is None:
        return [(i, {}) for i in range(len(output_index))]
    selected = []
    seen = set()
    for wanted in request.outputs:
        index = output_index.get(wanted.name)
        if index is None:
            raise InvalidInput(
                f"unknown output {wanted.name!r}; the model's outputs are {sorted(output_index)}"
            )
        if wanted.name in seen:
            raise InvalidInput(f"output {wanted.name!r} is requested more than once")
        seen.add(wanted.name)
        selected.append((index, wanted.parameters))
    return selected


def _withdraw(queued: asyncio.Future[list[Array]], answer: asyncio.Future[InferResponse]) -> None:
    if answer.cancelled() and not queued.done():
        queued.cancel()
