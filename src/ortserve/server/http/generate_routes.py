"""Triton's generate extension for LLM models: ``POST /v2/models/{m}[/versions/{v}]/generate``
(one JSON answer) and ``/generate_stream`` (server-sent events, one per step).

The body holds ``text_input`` and the sampling fields, at the top level or in ``parameters``
(OpenAI's names: ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``...).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import orjson

from ortserve.errors import InvalidInput
from ortserve.llm.servable import GenerationStream, LlmVersion, request_priority, sampling_from
from ortserve.protocol import openai_codec as codec
from ortserve.repository.registry import ModelRegistry
from ortserve.server.exchange import Exchange
from ortserve.server.http.answers import begun
from ortserve.server.http.app import HttpApp, Operation
from ortserve.server.http.messages import HttpRequest, HttpResponse, RouteResult, json_response
from ortserve.server.http.methods import method_not_allowed

__all__ = ["add_generate_routes"]

logger = logging.getLogger(__name__)


def _fields(body: bytes) -> tuple[str, dict[str, object]]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"the body is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise InvalidInput("the body must be a JSON object")
    text = value.get("text_input")
    if not isinstance(text, str):
        raise InvalidInput("text_input: a string is required")
    parameters = value.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInput("parameters must be an object")
    return text, {**value, **parameters}


def _answer(llm: LlmVersion, stream: GenerationStream, text: str, finish: str | None) -> dict[str, object]:
    return {
        "model_name": llm.info.name,
        "model_version": llm.info.version,
        "text_output": text,
        "finish_reason": finish,
        "usage": codec.Usage(stream.prompt_tokens, stream.completion_tokens, stream.cached_tokens).body(),
    }


async def _events(llm: LlmVersion, stream: GenerationStream) -> AsyncIterator[bytes]:
    async for event in stream.events():
        yield codec.sse(_answer(llm, stream, event.text, event.finish_reason))


class _GenerateRoutes:
    def __init__(self, exchange: Exchange) -> None:
        self._exchange = exchange

    def generate(self, request: HttpRequest, name: str, version: str | None) -> RouteResult:
        return self._start(request, name, version, streaming=False)

    def generate_stream(self, request: HttpRequest, name: str, version: str | None) -> RouteResult:
        return self._start(request, name, version, streaming=True)

    def _start(self, request: HttpRequest, name: str, version: str | None, streaming: bool) -> RouteResult:
        if request.method != "POST":
            return method_not_allowed("POST")
        return self._run(request, name, version, streaming)

    async def _run(
        self, request: HttpRequest, name: str, version: str | None, streaming: bool
    ) -> HttpResponse:
        """Decode, generate through the Exchange, encode (the app finishes the request's scope
        with the answer, the stream's end or the error)."""
        exchange = self._exchange
        scope = begun(exchange, request, name, version, generation=True)
        text, fields = _fields(request.body)
        llm = exchange.llm(scope, name, version, request.text_header, fields, request.tenant)
        params = sampling_from(fields, llm.default_max_tokens)
        stream = llm.generate(llm.tokenizer.encode(text), params, priority=request_priority(fields))
        exchange.started(scope, request.tenant, llm, (stream,))
        if streaming:
            events = _events(llm, stream)
            return HttpResponse(
                200, [], b"text/event-stream", [(b"cache-control", b"no-cache")], stream=events
            )
        result = await stream.collect()
        return json_response(200, orjson.dumps(_answer(llm, stream, result.text, result.finish_reason)))


def _operation(name: str, streaming: bool) -> Callable[[str], Operation]:
    def describe(path: str) -> Operation:
        parameters = [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]
        if "{version}" in path:
            parameters.append(
                {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}
            )
        content = "text/event-stream" if streaming else "application/json"
        return {
            "operationId": f"{name}{'_version' if '{version}' in path else ''}",
            "summary": "Triton generate extension" + (" (server-sent events)" if streaming else ""),
            "tags": ["generate"],
            "parameters": parameters,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
            "responses": {
                "200": {
                    "description": "generated text",
                    "content": {content: {"schema": {"type": "object" if not streaming else "string"}}},
                },
                "400": {"description": "invalid request"},
                "404": {"description": "unknown model, or not an LLM"},
                "429": {"description": "the generation queue is full (Retry-After)"},
            },
        }

    return describe


def add_generate_routes(app: HttpApp, registry: ModelRegistry) -> None:
    """Add ``generate`` and ``generate_stream`` under every model path."""
    routes = _GenerateRoutes(app.exchange)
    app.add_model_route("POST", "generate", routes.generate, _operation("generate", False))
    app.add_model_route(
        "POST", "generate_stream", routes.generate_stream, _operation("generate_stream", True)
    )
