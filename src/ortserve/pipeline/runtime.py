"""Loading a pipeline and running it: step plans, model calls on the schedulers, OIP serving.

Sync or async is decided once at load, per step. ``async def`` steps are awaited. A plain step
is timed on the pipeline's example during warm-up and runs inline on the event loop when its
median is under ``INLINE_LIMIT_S``; only slower steps hop to a worker thread. On a small
machine a thread hop costs tens of microseconds and, for pure-Python work that holds the GIL,
frees the loop for nothing, so a 50 us tokenizer step is cheaper and no less fair inline.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, cast

import numpy as np
import orjson

from ortserve.core.dataplane import ModelResolver
from ortserve.core.datatypes import BF16, datatype_of_numpy, numpy_dtype
from ortserve.core.model import ModelState, Servable, VersionInfo, select_outputs
from ortserve.core.types import InferInput, InferOutput, InferRequest, InferResponse, Parameters, TensorSpec
from ortserve.errors import InvalidInput, ModelNotReady, OrtServeError
from ortserve.pipeline.contract import Array, JsonObject, ModelCall, ModelOutputs, Pipeline, PipelineContext
from ortserve.pipeline.spec import BUILTIN_PIPELINES, import_pipeline

__all__ = [
    "BUILTIN_PIPELINES",
    "INLINE_LIMIT_S",
    "ROUTED_VERSIONS",
    "PipelineRunner",
    "PipelineVersion",
    "StepPlan",
    "import_pipeline",
    "load_pipeline",
    "pipeline_model_name",
]

logger = logging.getLogger(__name__)

ROUTED_VERSIONS: ContextVar[Mapping[str, str] | None] = ContextVar("ortserve_routed_versions", default=None)
"""The versions a pipeline route's routing policy chose for the models the pipeline calls
(model name -> version); a model not named here is called on its newest ready version."""

INLINE_LIMIT_S = 0.002
"""A plain step whose median on the example is above this runs in a worker thread."""
REQUEST_INPUT = "request"
RESPONSE_OUTPUT = "response"
_TIMING_ROUNDS = 30

RequestT = TypeVar("RequestT")
Mode = Literal["inline", "thread", "async"]


def pipeline_model_name(model: str) -> str:
    """The OIP model name a pipeline wrapping ``model`` is served under."""
    return f"{model}.pipeline"


@dataclass(frozen=True, slots=True)
class StepPlan:
    """How a step is called, decided at load, and its median time on the example."""

    name: str
    mode: Mode
    median_s: float


def _bind(function: Callable[..., Any], mode: Mode) -> Callable[..., Awaitable[Any]]:
    if mode == "async":
        return cast(Callable[..., Awaitable[Any]], function)
    if mode == "thread":
        return lambda *args: asyncio.to_thread(function, *args)

    async def inline(*args: object) -> object:
        return function(*args)

    return inline


async def _plan(name: str, function: Callable[..., Any], *args: object) -> tuple[StepPlan, object]:
    if inspect.iscoroutinefunction(function):
        start = time.perf_counter()
        result = await function(*args)
        return StepPlan(name, "async", time.perf_counter() - start), result

    def timed() -> tuple[float, object]:
        times, result = [], None
        for _ in range(_TIMING_ROUNDS):
            start = time.perf_counter()
            result = function(*args)
            times.append(time.perf_counter() - start)
        return statistics.median(times), result

    median, result = await asyncio.to_thread(timed)
    return StepPlan(name, "inline" if median <= INLINE_LIMIT_S else "thread", median), result


class PipelineRunner(Generic[RequestT]):
    """Runs one pipeline's steps; model calls go through the models' own schedulers.

    Build it with :meth:`build`, which warms the pipeline up and plans its steps.
    """

    def __init__(
        self, pipeline: Pipeline[RequestT], resolver: ModelResolver, plans: tuple[StepPlan, StepPlan]
    ) -> None:
        self.pipeline = pipeline
        self.plans = plans
        self._resolver = resolver
        self._pre = _bind(pipeline.preprocess, plans[0].mode)
        self._post = _bind(pipeline.postprocess, plans[1].mode)

    @classmethod
    async def build(cls, pipeline: Pipeline[RequestT], resolver: ModelResolver) -> PipelineRunner[RequestT]:
        """Run the example once through every step, timing the steps to choose how to call them.

        Raises:
            InvalidInput: the pipeline's own example is rejected; other errors of its models.
        """
        request = pipeline.parse(pipeline.example())
        pre, calls = await _plan("preprocess", pipeline.preprocess, request)
        probe = cls(pipeline, resolver, (pre, pre))
        outputs = await probe.call_models(cast(Sequence[ModelCall], calls))
        post, _ = await _plan("postprocess", pipeline.postprocess, outputs, request)
        return cls(pipeline, resolver, (pre, post))

    async def run(self, document: object, marks: list[float] | None = None) -> JsonObject:
        """Parse, preprocess, run the model calls, postprocess one decoded JSON document.

        Args:
            document: the decoded JSON request.
            marks: when given, the monotonic time after preprocessing and after the model
                calls are appended (the route's step timings and trace spans).

        Raises:
            InvalidInput and whatever the model calls raise (Overloaded, DeadlineExceeded, ...).
        """
        request = self.pipeline.parse(document)
        calls: Sequence[ModelCall] = await self._pre(request)
        if marks is not None:
            marks.append(time.monotonic())
        outputs = await self.call_models(calls)
        if marks is not None:
            marks.append(time.monotonic())
        answer: JsonObject = await self._post(outputs, request)
        return answer

    async def call_models(self, calls: Sequence[ModelCall]) -> list[ModelOutputs]:
        """Each call's outputs, in order; the calls run concurrently."""
        if len(calls) == 1:
            return [await self._call(calls[0])]
        return list(await asyncio.gather(*(self._call(call) for call in calls)))

    async def _call(self, call: ModelCall) -> ModelOutputs:
        routed = ROUTED_VERSIONS.get()
        served = self._resolver.resolve(call.model, routed.get(call.model) if routed else None)
        limit = served.info.max_batch_size
        rows = next(iter(call.inputs.values())).shape[0] if call.inputs else 0
        if limit == 0 or rows <= limit:
            return await _infer(served, call.inputs)
        chunks = [
            {name: array[start : start + limit] for name, array in call.inputs.items()}
            for start in range(0, rows, limit)
        ]
        parts = await asyncio.gather(*(_infer(served, chunk) for chunk in chunks))
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


async def _infer(served: Servable, inputs: ModelOutputs) -> dict[str, Array]:
    declared = {spec.name: spec.datatype for spec in served.info.inputs}
    tensors = [
        InferInput(name, _datatype(array, declared.get(name)), array.shape, array)
        for name, array in inputs.items()
    ]
    response = await served.infer(InferRequest(served.info.name, tensors, served.info.version))
    return {output.name: output.data for output in response.outputs}


def _datatype(array: Array, declared: str | None) -> str:
    """The model's own datatype when the array is in its form (a BF16 input takes uint16 bit
    patterns, which would otherwise read as UINT16), else the array's."""
    if declared == BF16 and array.dtype == numpy_dtype(BF16):
        return BF16
    return datatype_of_numpy(array.dtype)


def decode_document(raw: object) -> object:
    """One JSON document from a body or a BYTES element.

    Raises:
        InvalidInput: not UTF-8 JSON.
    """
    try:
        return orjson.loads(raw if isinstance(raw, (bytes, str)) else bytes(cast(bytes, raw)))
    except (orjson.JSONDecodeError, TypeError) as exc:
        raise InvalidInput(f"the request is not valid JSON: {exc}") from None


class PipelineVersion:
    """A pipeline served as an OIP model (a :class:`~ortserve.core.model.Servable`): BYTES
    ``request`` (JSON documents) in, BYTES ``response`` (JSON documents) out, one per element.

    A pipeline has no scheduler of its own: its model calls queue on their models' schedulers.
    """

    def __init__(self, info: VersionInfo, runner: PipelineRunner[Any]) -> None:
        self.info = info
        self.state = ModelState.READY
        self.pipeline = runner
        self._output_index = {spec.name: i for i, spec in enumerate(info.outputs)}

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY

    @property
    def route(self) -> str | None:
        return self.pipeline.pipeline.route

    async def handle_body(self, body: bytes, marks: list[float] | None = None) -> bytes:
        """The REST route: one JSON request body in, one JSON answer out (``marks`` as in
        :meth:`PipelineRunner.run`).

        Raises:
            ModelNotReady, InvalidInput, and whatever the model calls raise.
        """
        self._check_ready()
        answer = await self.pipeline.run(decode_document(body), marks)
        return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)

    def refusal(self, priority: int = 0) -> OrtServeError | None:
        """Only readiness: which models the documents call is known after preprocessing."""
        try:
            self._check_ready()
        except ModelNotReady as error:
            return error
        return None

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        """Each element of the BYTES input ``request`` is one JSON document, answered in order.

        Raises:
            ModelNotReady, InvalidInput at once; the future fails with whatever a step or a
            model call raises.
        """
        self._check_ready()
        selected = select_outputs(request, self._output_index)
        if [t.name for t in request.inputs] != [REQUEST_INPUT] or request.inputs[0].datatype != "BYTES":
            raise InvalidInput(f"a pipeline takes exactly one BYTES input named {REQUEST_INPUT!r}")
        documents = [decode_document(item) for item in request.inputs[0].data.ravel()]
        return asyncio.ensure_future(self._respond(documents, selected, request.id))

    async def infer(self, request: InferRequest) -> InferResponse:
        """``submit`` and wait for the answer."""
        return await self.submit(request)

    async def _respond(
        self, documents: list[object], selected: list[tuple[int, Parameters]], request_id: str | None
    ) -> InferResponse:
        answers = await asyncio.gather(*(self.pipeline.run(doc) for doc in documents))
        data = np.empty(len(answers), dtype=object)
        data[:] = [orjson.dumps(a, option=orjson.OPT_SERIALIZE_NUMPY) for a in answers]
        outputs = [InferOutput(RESPONSE_OUTPUT, "BYTES", data.shape, data, params) for _, params in selected]
        return InferResponse(self.info.name, self.info.version, outputs, request_id)

    async def unload(self, grace_s: float) -> None:
        """Stop answering; the models behind the pipeline drain on their own."""
        self.state = ModelState.UNLOADING

    def _check_ready(self) -> None:
        if self.state is not ModelState.READY:
            raise ModelNotReady(f"pipeline {self.info.name!r} is {self.state.value}")


async def load_pipeline(spec: str, context: PipelineContext, resolver: ModelResolver) -> PipelineVersion:
    """Import and build the pipeline (in a worker thread), warm it up, plan its steps.

    Raises:
        ConfigError: the spec names nothing importable; whatever the pipeline raises while built.
    """
    factory = import_pipeline(spec)
    pipeline = await asyncio.to_thread(factory, context)
    runner = await PipelineRunner.build(pipeline, resolver)
    name = pipeline_model_name(context.model_name)
    info = VersionInfo(
        name,
        context.model_version,
        (TensorSpec(REQUEST_INPUT, "BYTES", (-1,)),),
        (TensorSpec(RESPONSE_OUTPUT, "BYTES", (-1,)),),
        max_batch_size=0,
        providers=("python",),
        platform="ortserve_pipeline",
    )
    for plan in runner.plans:
        logger.info(
            "pipeline %s: %s runs %s (%.1f us on the example)",
            name,
            plan.name,
            plan.mode,
            plan.median_s * 1e6,
        )
    return PipelineVersion(info, runner)
