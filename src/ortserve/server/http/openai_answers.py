"""The OpenAI routes' answers once the request is parsed and its model resolved: ``n`` choices
(``best_of`` ranked by their log-probability), each its own sequence in the running batch,
their log-probabilities, whole or as server-sent events.

The choices are one request to the engine: one template render and tokenization, one
admission, one prefill; when the first choice's prefill ends the others start from a copy of
its keys and values and its last logits (``LlmVersion.generate_choices``). Choice ``i`` of a
seeded request samples as a single request with seed ``seed + i`` would.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ortserve.errors import InvalidField
from ortserve.llm.sampler import SamplingParams
from ortserve.llm.sequence import GenerationEvent
from ortserve.llm.servable import GenerationStream, LlmVersion, request_priority
from ortserve.llm.structured import grammar_for, grammars_of
from ortserve.llm.tools import StreamedCalls, ToolRequest, chat_message, template_variables, tool_request
from ortserve.protocol import openai_choices as choices
from ortserve.protocol import openai_codec as codec
from ortserve.protocol.openai_choices import TokenLogprob
from ortserve.protocol.openai_sampling import choice_count, sampling_params

__all__ = ["Answer", "start_chat", "start_completion"]


@dataclass(slots=True)
class _Choice:
    text: str = ""
    finish: str | None = None
    tokens: list[TokenLogprob] = field(default_factory=list)

    @property
    def score(self) -> float:
        return sum(t.logprob for t in self.tokens)


def _plan(
    fields: Mapping[str, object], llm: LlmVersion, chat: bool, tools: ToolRequest | None = None
) -> tuple[int, list[SamplingParams]]:
    """(choices returned, the parameters of every choice generated)."""
    base = sampling_params(fields, llm.default_max_tokens, llm.tokenizer.vocab_size, chat)
    grammar = grammar_for(fields.get("response_format")) if chat else None
    if tools is not None and tools.constrained:
        if grammar is not None:
            raise InvalidField(
                "tool_choice", "a required or named tool call cannot also follow response_format"
            )
        grammar = grammar_for(
            {"type": "json_schema", "json_schema": {"name": "tool_calls", "schema": tools.grammar_schema()}}
        )
    if grammar is not None:
        base = replace(base, guide=grammars_of(llm.tokenizer, llm.eos_ids).constraint(grammar))
    n, best_of = choice_count(fields)
    if best_of > n:
        base = replace(base, logprobs=True)  # ranked by the log-probability of their tokens
    seeds = [None if base.seed is None else (base.seed + i) % 2**64 for i in range(best_of)]
    return n, [replace(base, seed=seed) for seed in seeds]


async def _planned(
    fields: Mapping[str, object], llm: LlmVersion, chat: bool, tools: ToolRequest | None = None
) -> tuple[int, list[SamplingParams]]:
    """``_plan``, in a worker thread when it compiles a grammar: a 40 KB schema takes ~120 ms
    (measured), which must not stall the event loop for every other request."""
    response_format = fields.get("response_format")
    grammar = (isinstance(response_format, dict) and response_format.get("type") != "text") or (
        tools is not None and tools.constrained
    )
    if chat and grammar:
        return await asyncio.to_thread(_plan, fields, llm, chat, tools)
    return _plan(fields, llm, chat, tools)


def _start(
    llm: LlmVersion, prompt: Sequence[int], params: list[SamplingParams], cache_salt: str, priority: int = 0
) -> list[GenerationStream]:
    """The choices as one request: admitted and prefilled once (the others fork from it)."""
    if len(params) == 1:
        return [llm.generate(prompt, params[0], cache_salt, priority=priority)]
    return llm.generate_choices(prompt, params, cache_salt, priority)


def _usage(streams: list[GenerationStream]) -> codec.Usage:
    first = streams[0]
    completion = sum(s.completion_tokens for s in streams)
    return codec.Usage(first.prompt_tokens, completion, first.cached_tokens)


def _usage_now(streams: list[GenerationStream], reply: _Reply) -> codec.Usage | None:
    """The usage so far, for a chunk of a stream that asked for it in every chunk."""
    return _usage(streams) if reply.continuous_usage else None


def _continuous_usage(fields: Mapping[str, object]) -> bool:
    options = fields.get("stream_options")
    return (
        isinstance(options, dict)
        and options.get("include_usage") is True
        and (options.get("continuous_usage_stats") is True)
    )


def _token_logprobs(llm: LlmVersion, event: GenerationEvent) -> list[TokenLogprob]:
    text = llm.tokenizer.token_text
    return [
        TokenLogprob(text(token), logprob, tuple((text(t), lp) for t, lp in top))
        for token, logprob, top in zip(event.token_ids, event.logprobs, event.top_logprobs, strict=True)
    ]


async def _collect(llm: LlmVersion, stream: GenerationStream) -> _Choice:
    choice = _Choice()
    logprobs = stream.sequence.params.logprobs  # asked for, or forced on to rank best_of
    async for event in stream.events():
        choice.text += event.text
        choice.finish = event.finish_reason
        if logprobs:
            choice.tokens += _token_logprobs(llm, event)
    return choice


async def _collect_all(llm: LlmVersion, streams: list[GenerationStream], n: int) -> list[_Choice]:
    done: list[_Choice] | None = None
    try:
        done = await asyncio.gather(*(_collect(llm, s) for s in streams))
    finally:
        if done is None:  # one choice failed, or the client left: the others are withdrawn
            for stream in streams:
                stream.sequence.cancel()
    if len(done) > n:
        done = sorted(done, key=lambda c: c.score, reverse=True)[:n]
    return done


async def _merged(
    streams: list[GenerationStream],
) -> AsyncIterator[tuple[int, GenerationEvent]]:
    """The events of every choice as they come, with the choice's index."""
    iterators = [s.events() for s in streams]
    pending: dict[asyncio.Task[GenerationEvent], int] = {}
    try:
        for index, events in enumerate(iterators):
            pending[asyncio.ensure_future(anext(events))] = index
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                index = pending.pop(task)
                event = task.result()
                yield index, event
                if event.finish_reason is None:
                    pending[asyncio.ensure_future(anext(iterators[index]))] = index
    finally:
        for task in pending:
            task.cancel()
        for events in iterators:
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]
        for stream in streams:
            if not stream.finished:
                stream.sequence.cancel()


@dataclass(frozen=True, slots=True)
class _Reply:
    ident: str
    created: int
    model: str
    include_usage: bool
    logprobs: bool
    continuous_usage: bool = False
    """vLLM's ``stream_options.continuous_usage_stats`` (with ``include_usage``): every chunk
    carries the usage so far (guidellm asks for it)."""


async def _chat_events(
    llm: LlmVersion, streams: list[GenerationStream], reply: _Reply, tools: ToolRequest
) -> AsyncIterator[bytes]:
    head = (reply.ident, reply.created, reply.model)
    opening = [
        {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        for i in range(len(streams))
    ]
    yield choices.chat_chunk(*head, opening, _usage_now(streams, reply))
    calls = [StreamedCalls(tools) for _ in streams]
    async for index, event in _merged(streams):
        text = calls[index].feed(event.text)
        if text or (reply.logprobs and event.token_ids):
            logprobs = choices.chat_logprobs(_token_logprobs(llm, event)) if reply.logprobs else None
            delta = {"index": index, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": None}
            yield choices.chat_chunk(*head, [delta], _usage_now(streams, reply))
        if event.finish_reason is not None:
            rest, deltas, finish = calls[index].finish(event.finish_reason)
            if rest:
                piece = {"index": index, "delta": {"content": rest}, "logprobs": None, "finish_reason": None}
                yield choices.chat_chunk(*head, [piece], _usage_now(streams, reply))
            if deltas:
                piece = {
                    "index": index,
                    "delta": {"tool_calls": deltas},
                    "logprobs": None,
                    "finish_reason": None,
                }
                yield choices.chat_chunk(*head, [piece], _usage_now(streams, reply))
            last = {"index": index, "delta": {}, "logprobs": None, "finish_reason": finish}
            yield choices.chat_chunk(*head, [last], _usage_now(streams, reply))
    if reply.include_usage:
        yield choices.chat_chunk(*head, [], _usage(streams))
    yield codec.DONE


class Answer:
    """A request's choices under way: read them whole (``body``) or as events (``events``),
    once. Failures after the start raise from either (the route turns them into its error)."""

    def __init__(
        self,
        whole: Callable[[], Awaitable[bytes]],
        events: Callable[[], AsyncIterator[bytes]],
        streams: Sequence[GenerationStream] = (),
    ) -> None:
        self.body = whole
        self.events = events
        self.streams = streams
        """The choices' generations (the Exchange may copy the first to a shadow version)."""


async def start_chat(llm: LlmVersion, parsed: codec.ChatRequest, cache_salt: str = "") -> Answer:
    """Start the chat completion's choices (``cache_salt``: see ``LlmVersion.cache_salt``).

    Raises:
        OrtServeError: refused fields, queue full...: nothing was started.
    """
    tools = tool_request(parsed.fields)
    n, params = await _planned(parsed.fields, llm, True, tools)
    rendered = llm.tokenizer.render_chat(parsed.messages, extra=template_variables(parsed.fields, tools))
    prompt = llm.tokenizer.encode(rendered, special=False)
    streams = _start(llm, prompt, params, cache_salt, request_priority(parsed.fields))
    reply = _Reply(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), parsed.model, parsed.include_usage,
                   parsed.fields.get("logprobs") is True, _continuous_usage(parsed.fields))  # fmt: skip

    async def whole() -> bytes:
        done = await _collect_all(llm, streams, n)
        body = []
        for i, c in enumerate(done):
            message, finish = chat_message(c.text, c.finish, tools)
            logprobs = choices.chat_logprobs(c.tokens) if reply.logprobs else None
            body.append({"index": i, "message": message, "logprobs": logprobs, "finish_reason": finish})
        return choices.chat_body(reply.ident, reply.created, reply.model, body, _usage(streams))

    return Answer(whole, lambda: _chat_events(llm, streams, reply, tools), streams)


async def _completion_events(
    llm: LlmVersion, streams: list[GenerationStream], reply: _Reply, echo: str
) -> AsyncIterator[bytes]:
    head = (reply.ident, reply.created, reply.model)
    offsets = [len(echo)] * len(streams)
    if echo:
        yield choices.completion_chunk(
            *head,
            [
                {"index": i, "text": echo, "logprobs": None, "finish_reason": None}
                for i in range(len(streams))
            ],
        )
    async for index, event in _merged(streams):
        if event.token_ids or event.text or event.finish_reason is not None:  # a chunk per step
            logprobs = None
            if reply.logprobs:
                tokens = _token_logprobs(llm, event)
                logprobs = choices.completion_logprobs(tokens, offsets[index])
                offsets[index] += sum(len(t.text) for t in tokens)
            piece = {
                "index": index,
                "text": event.text,
                "logprobs": logprobs,
                "finish_reason": event.finish_reason,
            }
            yield choices.completion_chunk(*head, [piece], _usage_now(streams, reply))
    if reply.include_usage:
        yield choices.completion_chunk(*head, [], _usage(streams))
    yield codec.DONE


async def start_completion(llm: LlmVersion, parsed: codec.CompletionRequest, cache_salt: str = "") -> Answer:
    """Start the completion's choices (``cache_salt``: see ``LlmVersion.cache_salt``).

    Raises:
        OrtServeError: refused fields, queue full...: nothing was started.
    """
    n, params = await _planned(parsed.fields, llm, False)
    logprobs = parsed.fields.get("logprobs") is not None
    if parsed.echo and logprobs:
        raise InvalidField(
            "echo", "echo with logprobs is not supported (the prompt's logprobs are not computed)"
        )
    if isinstance(parsed.prompt, str):
        prompt, echo = llm.tokenizer.encode(parsed.prompt), parsed.prompt
    else:
        prompt = parsed.prompt
        if any(not 0 <= t < llm.tokenizer.vocab_size for t in prompt):  # before decoding them
            raise InvalidField("prompt", f"prompt: token ids must be in [0, {llm.tokenizer.vocab_size})")
        echo = llm.tokenizer.decode(prompt)
    echoed = echo if parsed.echo else ""
    streams = _start(llm, prompt, params, cache_salt, request_priority(parsed.fields))
    reply = _Reply(f"cmpl-{uuid.uuid4().hex}", int(time.time()), parsed.model, parsed.include_usage, logprobs,
                   _continuous_usage(parsed.fields))  # fmt: skip

    async def whole() -> bytes:
        done = await _collect_all(llm, streams, n)
        body = [
            {
                "index": i,
                "text": echoed + c.text,
                "logprobs": choices.completion_logprobs(c.tokens, len(echoed)) if logprobs else None,
                "finish_reason": c.finish,
            }
            for i, c in enumerate(done)
        ]
        return choices.completion_body(reply.ident, reply.created, reply.model, body, _usage(streams))

    return Answer(whole, lambda: _completion_events(llm, streams, reply, echoed), streams)
