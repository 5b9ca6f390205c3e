"""OpenAI-compatible routes: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models``; non-streaming JSON or server-sent events, errors in OpenAI's shape.

Decode, hand the prompt to the model's LLM version, encode: the engine does the rest. A client
that hangs up mid-stream closes the event generator, which cancels its sequence.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator

from ortserve.errors import InternalError, InvalidInput, ModelNotFound, OrtServeError
from ortserve.llm.servable import GenerationStream, LlmVersion
from ortserve.protocol import openai_codec as codec
from ortserve.protocol.openai_sampling import sampling_params
from ortserve.repository.registry import ModelRegistry
from ortserve.server.http.app import HttpApp, Operation
from ortserve.server.http.errors import openai_error_response
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response

__all__ = ["add_openai_routes", "llm_versions", "resolve_llm"]

logger = logging.getLogger(__name__)

_SSE = b"text/event-stream"
_SSE_HEADERS = [(b"cache-control", b"no-cache")]


def resolve_llm(registry: ModelRegistry, name: str, version: str | None = None) -> LlmVersion:
    """The LLM version serving ``name`` now (a reload swaps it; the routes keep working).

    Raises:
        ModelNotFound: no such model, or it is not a generation model.
        ModelNotReady: no version can take requests.
    """
    served = registry.resolve(name, version)
    if not isinstance(served, LlmVersion):
        raise ModelNotFound(f"model {name!r} is not a text-generation model (kind: llm)")
    return served


def llm_versions(registry: ModelRegistry) -> list[tuple[str, str, LlmVersion]]:
    """Every loaded LLM version as (model, version, servable): what the metrics collector reads."""
    return [
        (entry.name, str(number), served)
        for entry in registry.entries()
        for number, served in entry.versions.items()
        if isinstance(served, LlmVersion)
    ]


def _usage(stream: GenerationStream) -> codec.Usage:
    return codec.Usage(stream.prompt_tokens, stream.completion_tokens, stream.cached_tokens)


async def _errors_as_events(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A failure after the head is out becomes one error event, then the stream ends."""
    try:
        async for piece in events:
            yield piece
    except OrtServeError as error:
        yield codec.sse(codec.error_body(error.message, "server_error", None))
    except Exception:
        logger.exception("generation stream failed")
        yield codec.sse(codec.error_body("internal server error", "server_error", None))


async def _chat_events(
    stream: GenerationStream, ident: str, created: int, model: str, usage: bool
) -> AsyncIterator[bytes]:
    yield codec.chat_chunk(ident, created, model, {"role": "assistant", "content": ""}, None)
    async for event in stream.events():
        if event.text:
            yield codec.chat_chunk(ident, created, model, {"content": event.text}, None)
        if event.finish_reason is not None:
            yield codec.chat_chunk(ident, created, model, {}, event.finish_reason)
    if usage:
        yield codec.chat_chunk(ident, created, model, {}, None, _usage(stream))
    yield codec.DONE


async def _completion_events(
    stream: GenerationStream, ident: str, created: int, model: str, usage: bool, echo: str
) -> AsyncIterator[bytes]:
    if echo:
        yield codec.completion_chunk(ident, created, model, echo, None)
    async for event in stream.events():
        if event.token_ids or event.text or event.finish_reason is not None:  # a chunk per step
            yield codec.completion_chunk(ident, created, model, event.text, event.finish_reason)
    if usage:
        yield codec.completion_chunk(ident, created, model, "", None, _usage(stream))
    yield codec.DONE


def _streaming(events: AsyncIterator[bytes]) -> HttpResponse:
    return HttpResponse(200, [], _SSE, list(_SSE_HEADERS), stream=_errors_as_events(events))


class _OpenAiRoutes:
    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry

    async def chat(self, request: HttpRequest) -> HttpResponse:
        try:
            parsed = codec.parse_chat(request.body)
            llm = resolve_llm(self._registry, parsed.model)
            params = sampling_params(parsed.fields, llm.default_max_tokens, llm.tokenizer.vocab_size, True)
            prompt = llm.tokenizer.encode(llm.tokenizer.render_chat(parsed.messages), special=False)
            stream = llm.generate(prompt, params)
            ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
            if parsed.stream:
                return _streaming(_chat_events(stream, ident, created, parsed.model, parsed.include_usage))
            result = await stream.collect()
            body = codec.chat_response(
                ident, created, parsed.model, result.text, result.finish_reason, _usage(stream)
            )
            return json_response(200, body)
        except OrtServeError as error:
            return openai_error_response(error)
        except Exception:
            logger.exception("chat completion failed")
            return openai_error_response(InternalError("internal server error"))

    async def completion(self, request: HttpRequest) -> HttpResponse:
        try:
            parsed = codec.parse_completion(request.body)
            llm = resolve_llm(self._registry, parsed.model)
            params = sampling_params(parsed.fields, llm.default_max_tokens, llm.tokenizer.vocab_size, False)
            if isinstance(parsed.prompt, str):
                prompt, echo = llm.tokenizer.encode(parsed.prompt), parsed.prompt
            else:
                prompt = parsed.prompt
                if any(not 0 <= t < llm.tokenizer.vocab_size for t in prompt):  # before decoding them
                    raise InvalidInput(f"prompt: token ids must be in [0, {llm.tokenizer.vocab_size})")
                echo = llm.tokenizer.decode(prompt)
            stream = llm.generate(prompt, params)
            ident, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
            echoed = echo if parsed.echo else ""
            if parsed.stream:
                return _streaming(
                    _completion_events(stream, ident, created, parsed.model, parsed.include_usage, echoed)
                )
            result = await stream.collect()
            text = echoed + result.text
            body = codec.completion_response(
                ident, created, parsed.model, text, result.finish_reason, _usage(stream)
            )
            return json_response(200, body)
        except OrtServeError as error:
            return openai_error_response(error)
        except Exception:
            logger.exception("completion failed")
            return openai_error_response(InternalError("internal server error"))

    async def models(self, request: HttpRequest) -> HttpResponse:
        names = []
        for entry in self._registry.entries():
            served = entry.latest_ready()
            if isinstance(served, LlmVersion):
                names.append((entry.name, served.created))
        return json_response(200, codec.models_body(names))


def _operation(operation_id: str, summary: str, body: bool) -> Operation:
    operation: Operation = {
        "operationId": operation_id,
        "summary": summary,
        "tags": ["openai"],
        "responses": {
            "200": {
                "description": "JSON, or server-sent events (`data: {...}` chunks, then `data: [DONE]`) when `stream` is true",
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            "400": {"description": "invalid request, OpenAI's error shape"},
            "404": {"description": "unknown model or not a generation model"},
            "429": {"description": "the generation queue is full (Retry-After)"},
        },
    }
    if body:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    return operation


def add_openai_routes(app: HttpApp, registry: ModelRegistry) -> None:
    """Add the OpenAI-compatible routes (they answer 404 for models that are not LLMs)."""
    routes = _OpenAiRoutes(registry)
    app.add_route(
        "POST", "/v1/chat/completions", routes.chat, _operation("openai_chat", "OpenAI chat completion", True)
    )
    app.add_route(
        "POST",
        "/v1/completions",
        routes.completion,
        _operation("openai_completion", "OpenAI completion", True),
    )
    app.add_route(
        "GET", "/v1/models", routes.models, _operation("openai_models", "Generation models served", False)
    )
