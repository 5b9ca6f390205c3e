"""An LLM version behind the same Servable face as an ONNX model: lifecycle (load, drain,
unload), readiness and admission, OIP inference (``text_input`` -> ``text_output``), plus
``generate`` for the OpenAI and generate routes, which stream."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from collections.abc import Sequence as Tokens
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ortserve.core.model import ModelState, VersionInfo
from ortserve.core.types import InferOutput, InferRequest, InferResponse, TensorSpec
from ortserve.errors import (
    InferenceError,
    InvalidField,
    InvalidInput,
    ModelNotReady,
    OrtServeError,
    Overloaded,
)
from ortserve.llm.sampler import SamplingParams
from ortserve.llm.sequence import GenerationEvent, Sequence
from ortserve.llm.stats import LlmStats
from ortserve.llm.tokenizer import TextTokenizer

if TYPE_CHECKING:
    from ortserve.llm.engine import GenerationEngine

__all__ = ["GenerationStream", "LlmVersion", "engine_rank", "llm_info", "request_priority"]

LLM_INPUTS = (TensorSpec("text_input", "BYTES", (1,)),)
LLM_OUTPUTS = (TensorSpec("text_output", "BYTES", (1,)),)


def llm_info(name: str, version: str, providers: tuple[str, ...]) -> VersionInfo:
    return VersionInfo(name, version, LLM_INPUTS, LLM_OUTPUTS, 0, providers)


@dataclass(slots=True)
class _Timing:
    arrival: float
    last: float | None = None


class GenerationStream:
    """The events of one request as the engine produces them; closing it early cancels it."""

    def __init__(self, sequence: Sequence, loop: asyncio.AbstractEventLoop) -> None:
        self.sequence = sequence
        self.queue: asyncio.Queue[GenerationEvent] = asyncio.Queue()
        self.timing = _Timing(loop.time())
        self.finished = False

    @property
    def prompt_tokens(self) -> int:
        return len(self.sequence.prompt)

    @property
    def cached_tokens(self) -> int:
        return self.sequence.cached_tokens

    @property
    def completion_tokens(self) -> int:
        return len(self.sequence.output)

    async def events(self) -> AsyncIterator[GenerationEvent]:
        """Each step's event until the finishing one; leaving early cancels the sequence.

        Raises:
            InferenceError: the engine failed while generating.
        """
        try:
            while True:
                event = await self.queue.get()
                if event.finish_reason == "error":
                    raise InferenceError(event.error or "generation failed")
                if event.finish_reason == "abort" and event.error:
                    raise ModelNotReady(event.error)
                yield event
                if event.finish_reason is not None:
                    self.finished = True
                    return
        finally:
            if not self.finished:
                self.sequence.cancel()

    async def collect(self) -> GenerationEvent:
        """Every event merged into one (non-streaming answers)."""
        merged = GenerationEvent()
        async for event in self.events():
            merged.text += event.text
            merged.token_ids += event.token_ids
            merged.logprobs += event.logprobs
            merged.finish_reason = event.finish_reason
        return merged


class LlmVersion:
    """One served LLM version: tokenizer, engine and its statistics.

    Args:
        info: names and the OIP face (text_input -> text_output).
        engine: the generation engine (its thread is started here).
        tokenizer: the version's tokenizer and chat template.
        eos_ids: tokens that end generation.
        max_context_len: prompt plus output tokens at most.
        default_max_tokens: output tokens when a request names no limit.
        loop: the event loop that receives the engine's events.
    """

    def __init__(
        self,
        info: VersionInfo,
        engine: GenerationEngine,
        tokenizer: TextTokenizer,
        eos_ids: tuple[int, ...],
        max_context_len: int,
        default_max_tokens: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.info = info
        self.engine = engine
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.max_context_len = max_context_len
        self.default_max_tokens = default_max_tokens
        self.state = ModelState.READY
        self.created = int(time.time())
        self.stats = LlmStats()
        self._loop = loop
        self._streams: dict[Sequence, GenerationStream] = {}
        self._drained = asyncio.Event()
        self._drained.set()
        self.cache_salt_header: str | None = "authorization"
        """Requests are salted by a digest of this header (a tenant's API key): prefixes are
        never shared across its values. None: only the ``cache_salt`` field salts."""

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY

    @property
    def running(self) -> int:
        return self.engine.running

    @property
    def waiting(self) -> int:
        return self.engine.waiting

    @property
    def kv_bytes(self) -> int:
        return self.engine.kv_bytes

    @property
    def kv_budget_bytes(self) -> int:
        """What ``kv_bytes`` stays within: the pool's budget plus the prefix cache's."""
        return self.engine.limits.kv_pool_bytes + self.engine.cache.budget_bytes

    @property
    def expected_wait_s(self) -> float:
        return self.engine.expected_wait_s

    @property
    def itl_target_s(self) -> float:
        return self.engine.itl_target_s()

    @property
    def preemptions(self) -> int:
        return self.engine.preemptions

    @property
    def riding_steps(self) -> int:
        return self.engine.riding_steps

    @property
    def engine_gaps(self) -> tuple[int, int, float]:
        """Running streams' gaps the engine saw, those past the ITL target, the guard's scale."""
        guard = self.engine.guard
        return guard.gaps, guard.past_target, guard.scale

    @property
    def prefix_hit_ratio(self) -> float:
        return self.engine.cache.hit_ratio

    @property
    def engine_seconds(self) -> tuple[int, float, float]:
        """Steps, their wall time and the time inside ONNX Runtime (the engine's own overhead)."""
        engine = self.engine
        return engine.steps, engine.step_seconds, engine.decoder.run_seconds

    def sink(self, events: list[tuple[Sequence, GenerationEvent]]) -> None:
        """The engine's sink (its thread): one hop to the event loop per step."""
        self._loop.call_soon_threadsafe(self._dispatch, events)

    def _dispatch(self, events: list[tuple[Sequence, GenerationEvent]]) -> None:
        now = self._loop.time()
        for sequence, event in events:
            stream = self._streams.get(sequence)
            if stream is None:
                continue
            self.stats.observe(stream.timing, event, now)
            if event.finish_reason is not None:
                del self._streams[sequence]
                self.stats.finished(stream.prompt_tokens, stream.completion_tokens, stream.cached_tokens)
                for fork in sequence.forks:  # it ended before its prefill started them: so do they
                    events.append(
                        (fork, GenerationEvent(finish_reason=event.finish_reason, error=event.error))
                    )
            stream.queue.put_nowait(event)
        if not self._streams:
            self._drained.set()

    def refusal(self, priority: int = 0) -> OrtServeError | None:
        """ModelNotReady or Overloaded when a new request would be refused now, else None."""
        if self.state is not ModelState.READY:
            return ModelNotReady(
                f"model {self.info.name!r} version {self.info.version} is {self.state.value}"
            )
        if self.engine.waiting >= self.engine.limits.max_waiting:
            return Overloaded(
                f"{self.engine.waiting} generation requests are already waiting", retry_after_s=1.0
            )
        return None

    def cache_salt(self, fields: Mapping[str, object], header: Callable[[str], str | None]) -> str:
        """A request's prefix-cache salt: its ``cache_salt`` field (vLLM's name), behind a digest
        of the tenant header (``cache_salt_header``) when the request carries one. Prefixes are
        shared, and ``cached_tokens`` reported, only between requests of the same salt.

        Raises:
            InvalidField: ``cache_salt`` is not a non-empty string of at most 1,024 characters.
        """
        value = fields.get("cache_salt")
        if value is not None and (not isinstance(value, str) or not value or len(value) > 1024):
            raise InvalidField(
                "cache_salt", "cache_salt must be a non-empty string of at most 1024 characters"
            )
        salt = value or ""
        tenant = header(self.cache_salt_header) if self.cache_salt_header else None
        if tenant:
            salt = hashlib.sha256(tenant.encode("utf-8", "surrogateescape")).hexdigest()[:32] + "/" + salt
        return salt

    def generate(
        self,
        prompt: Tokens[int],
        params: SamplingParams,
        cache_salt: str = "",
        forks: list[Sequence] | None = None,
        priority: int = 0,
    ) -> GenerationStream:
        """Queue a generation; its events arrive on the returned stream. ``priority``: its
        lane as for classic models (see :func:`request_priority`): 0 the default, 1 the most
        urgent, larger later; within a lane first come first served.

        Raises:
            InvalidInput: an empty or too long prompt, or parameters out of range.
            ModelNotReady, Overloaded.
        """
        refused = self.refusal()
        if refused is not None:
            raise refused
        params.check()
        if not prompt:
            raise InvalidInput("the prompt is empty")
        if len(prompt) >= self.max_context_len:
            raise InvalidInput(
                f"the prompt has {len(prompt)} tokens; this model's context is {self.max_context_len} tokens"
            )
        sequence = Sequence(prompt, params, self.tokenizer, self.eos_ids, self.max_context_len)
        sequence.cache_salt = cache_salt
        sequence.priority = engine_rank(priority)
        for fork in forks or ():
            fork.cache_salt = cache_salt
            fork.priority = sequence.priority
        sequence.forks = forks or []
        self.engine.submit(sequence)
        return self._stream(sequence)

    def generate_choices(
        self, prompt: Tokens[int], choices: list[SamplingParams], cache_salt: str = "", priority: int = 0
    ) -> list[GenerationStream]:
        """Queue ``n`` choices of one prompt as one request: one admission and one prefill, the
        first choice's; when it ends the engine starts the others from a copy of its keys and
        values and its logits (see ``Sequence.forks``).

        Raises:
            InvalidInput: an empty or too long prompt, or parameters out of range.
            ModelNotReady, Overloaded.
        """
        first = self.generate(
            prompt, choices[0], cache_salt, [self._sequence(prompt, p) for p in choices[1:]], priority
        )
        return [first] + [self._stream(fork) for fork in first.sequence.forks]

    def _sequence(self, prompt: Tokens[int], params: SamplingParams) -> Sequence:
        params.check()
        return Sequence(prompt, params, self.tokenizer, self.eos_ids, self.max_context_len)

    def _stream(self, sequence: Sequence) -> GenerationStream:
        stream = GenerationStream(sequence, self._loop)
        self._streams[sequence] = stream
        self._drained.clear()
        self.stats.requests += 1
        return stream

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        """OIP inference: ``text_input`` (one BYTES element) -> ``text_output``; parameters
        ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed`` as in generate."""
        prompt = _text_input(request)
        params = sampling_from(request.parameters, self.default_max_tokens)
        stream = self.generate(self.tokenizer.encode(prompt), params, priority=request.priority)
        return asyncio.ensure_future(self._answer(stream, request.id))

    async def _answer(self, stream: GenerationStream, request_id: str | None) -> InferResponse:
        result = await stream.collect()
        text = np.array([result.text.encode()], dtype=object)
        output = InferOutput("text_output", "BYTES", (1,), text)
        return InferResponse(self.info.name, self.info.version, [output], request_id)

    async def infer(self, request: InferRequest) -> InferResponse:
        return await self.submit(request)

    async def unload(self, grace_s: float) -> None:
        """Stop admitting, let running generations finish within ``grace_s``, stop the thread."""
        self.state = ModelState.DRAINING
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), grace_s)
        self.state = ModelState.UNLOADING
        self.engine.close()
        await asyncio.to_thread(self.engine.join, max(grace_s, 1.0))


DEFAULT_LANE = 1
"""The lane of a request that names none (priority 0), as a classic model's default."""


def request_priority(fields: Mapping[str, object]) -> int:
    """A generation request's ``priority`` field (OpenAI and generate bodies; vLLM's name),
    read as classic models read theirs: 0 or absent the default lane, 1 the most urgent,
    larger numbers later.

    Raises:
        InvalidField: not an integer from 0 to 1000.
    """
    value = fields.get("priority", 0)
    if value is None:
        return 0
    if type(value) is not int or not 0 <= value <= 1000:
        raise InvalidField("priority", "priority must be an integer from 0 (default) to 1000")
    return value


def engine_rank(priority: int) -> int:
    """The engine's rank of a lane (its queue serves higher ranks first)."""
    return -(priority or DEFAULT_LANE)


def _text_input(request: InferRequest) -> str:
    inputs = {i.name: i for i in request.inputs}
    text = inputs.get("text_input")
    if text is None or text.data.size != 1 or set(inputs) != {"text_input"}:
        raise InvalidInput("an llm model takes one input, text_input: BYTES [1]")
    value = text.data.reshape(-1)[0]
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError as exc:
            raise InvalidInput("text_input is not UTF-8") from exc
    return str(value)


def _number(parameters: Mapping[str, object], key: str, default: float) -> float:
    value = parameters.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"parameter {key} must be a number")
    return float(value)


def _integer(parameters: Mapping[str, object], key: str, default: int | None) -> int | None:
    value = parameters.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"parameter {key} must be an integer")
    return value


def _stops(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise InvalidInput("stop must be a string or a list of strings")


def sampling_from(parameters: Mapping[str, object], default_max_tokens: int) -> SamplingParams:
    """Sampling parameters from a request's JSON fields (OpenAI's names).

    Raises:
        InvalidInput: a field of the wrong type or out of range.
    """
    max_tokens = _integer(parameters, "max_completion_tokens", None)
    if max_tokens is None:
        max_tokens = _integer(parameters, "max_tokens", default_max_tokens)
    logprobs = parameters.get("logprobs")
    params = SamplingParams(
        max_tokens=default_max_tokens if max_tokens is None else max_tokens,
        temperature=_number(parameters, "temperature", 1.0),
        top_p=_number(parameters, "top_p", 1.0),
        top_k=_integer(parameters, "top_k", 0) or 0,
        seed=_integer(parameters, "seed", None),
        presence_penalty=_number(parameters, "presence_penalty", 0.0),
        frequency_penalty=_number(parameters, "frequency_penalty", 0.0),
        stop=_stops(parameters.get("stop")),
        logprobs=bool(logprobs) if isinstance(logprobs, (bool, int)) else False,
        ignore_eos=parameters.get("ignore_eos") is True,
    )
    params.check()
    return params
