"""OpenAI-compatible routes: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models``; non-streaming JSON or server-sent events, errors in OpenAI's shape.

Decode, hand the prompt to the model's LLM version through the Exchange (request id, routing
between LLM versions, metrics, access log, span, capture), encode: the engine does the rest. A
client that hangs up mid-stream closes the event generator, which cancels its sequence and
finishes the request's scope.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ortserve.llm.servable import LlmVersion
from ortserve.protocol import openai_codec as codec
from ortserve.repository.registry import ModelRegistry
from ortserve.server.exchange import Exchange
from ortserve.server.http.answers import begun
from ortserve.server.http.app import HttpApp, Operation
from ortserve.server.http.errors import OPENAI
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response
from ortserve.server.http.openai_answers import Answer, start_chat, start_completion

__all__ = ["add_openai_routes", "llm_versions"]

logger = logging.getLogger(__name__)

_Parsed = TypeVar("_Parsed", codec.ChatRequest, codec.CompletionRequest)

_SSE = b"text/event-stream"
_SSE_HEADERS = [(b"cache-control", b"no-cache")]


def llm_versions(registry: ModelRegistry) -> list[tuple[str, str, LlmVersion]]:
    """Every loaded LLM version as (model, version, servable): what the metrics collector reads."""
    return [
        (entry.name, str(number), served)
        for entry in registry.entries()
        for number, served in entry.versions.items()
        if isinstance(served, LlmVersion)
    ]


class _OpenAiRoutes:
    def __init__(self, registry: ModelRegistry, exchange: Exchange) -> None:
        self._registry = registry
        self._exchange = exchange

    async def chat(self, request: HttpRequest) -> HttpResponse:
        return await self._answer(request, codec.parse_chat, start_chat)

    async def completion(self, request: HttpRequest) -> HttpResponse:
        return await self._answer(request, codec.parse_completion, start_completion)

    async def _answer(
        self,
        request: HttpRequest,
        parse: Callable[[bytes], _Parsed],
        start: Callable[[LlmVersion, _Parsed, str], Awaitable[Answer]],
    ) -> HttpResponse:
        """Parse, route to an LLM version, start the choices, answer whole or as events (the
        app finishes the request's scope with the answer, the stream's end or the error)."""
        exchange = self._exchange
        scope = begun(exchange, request, "", None, OPENAI, generation=True)
        parsed = parse(request.body)  # a body that does not parse is accounted under no model
        scope.model = parsed.model
        llm = exchange.llm(scope, parsed.model, None, request.text_header, parsed.fields, request.tenant)
        answer = await start(llm, parsed, llm.cache_salt(parsed.fields, request.text_header))
        exchange.started(scope, request.tenant, llm, answer.streams)
        if parsed.stream:
            return HttpResponse(200, [], _SSE, list(_SSE_HEADERS), stream=answer.events())
        return json_response(200, await answer.body())

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
    routes = _OpenAiRoutes(registry, app.exchange)
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
