"""vLLM's utility routes beside the OpenAI ones: ``GET /health`` (what load balancers and
guidellm probe), ``POST /tokenize`` and ``POST /detokenize``, in vLLM's request and answer
shapes, errors in OpenAI's shape.

``model`` may be left out when exactly one LLM is served (vLLM serves one model, and its
clients send none).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import orjson

from ortserve.errors import InvalidField, InvalidInput
from ortserve.llm.servable import LlmVersion
from ortserve.llm.tools import template_variables, tool_request
from ortserve.protocol.openai_codec import parse_messages
from ortserve.repository.registry import ModelRegistry
from ortserve.server.exchange import Exchange
from ortserve.server.http.answers import begun
from ortserve.server.http.app import HttpApp, Operation
from ortserve.server.http.embeddings_routes import add_embeddings_route
from ortserve.server.http.errors import OPENAI
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response
from ortserve.server.http.openai_routes import llm_versions
from ortserve.server.http.responses_routes import add_responses_route

__all__ = ["add_llm_tool_routes"]

logger = logging.getLogger(__name__)

_TOKENIZE_FIELDS = frozenset(
    {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt", "return_token_strs",
     "tools", "chat_template_kwargs"}
)  # fmt: skip
_DETOKENIZE_FIELDS = frozenset({"model", "tokens"})
_MAX_TOKENS = 1 << 20


def _object(body: bytes, allowed: frozenset[str]) -> dict[str, object]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"the body is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise InvalidInput("the body must be a JSON object")
    for name in value:
        if name not in allowed:
            raise InvalidField(name, f"{name}: unknown field (accepted: {', '.join(sorted(allowed))})")
    return value


def _flag(fields: dict[str, object], name: str, default: bool) -> bool:
    value = fields.get(name, default)
    if not isinstance(value, bool):
        raise InvalidField(name, f"{name} must be a boolean")
    return value


class _ToolRoutes:
    """Decode, reach the LLM through the Exchange (counted, logged, traced, captured, routed and
    admitted like a generation, under the model it names), encode: the app finishes the scope."""

    def __init__(self, registry: ModelRegistry, exchange: Exchange, ready: Callable[[], bool]) -> None:
        self._registry = registry
        self._exchange = exchange
        self._ready = ready

    def _llm(self, request: HttpRequest, allowed: frozenset[str]) -> tuple[dict[str, object], LlmVersion]:
        """The body's fields and the LLM version they name (the only one when they name none)."""
        exchange = self._exchange
        scope = begun(exchange, request, "", None, OPENAI)
        fields = _object(request.body, allowed)
        name = fields.get("model")
        if name is None:
            served = {model for model, _, _ in llm_versions(self._registry)}
            if len(served) != 1:
                raise InvalidField("model", f"model is required ({len(served)} LLMs are served)")
            name = served.pop()
        if not isinstance(name, str):
            raise InvalidField("model", "model must be a string")
        scope.model = name
        return fields, exchange.llm(scope, name, None, request.text_header, fields, request.tenant)

    async def health(self, request: HttpRequest) -> HttpResponse:
        """200 with an empty body when every model is ready, else 503 (as vLLM answers)."""
        return HttpResponse(200 if self._ready() else 503, [], b"application/json")

    async def tokenize(self, request: HttpRequest) -> HttpResponse:
        fields, llm = self._llm(request, _TOKENIZE_FIELDS)
        tokenizer = llm.tokenizer
        if "messages" in fields:
            if "prompt" in fields:
                raise InvalidField("prompt", "give prompt or messages, not both")
            text = tokenizer.render_chat(
                parse_messages(fields.get("messages")),
                add_generation_prompt=_flag(fields, "add_generation_prompt", True),
                extra=template_variables(fields, tool_request(fields)),
            )
            tokens = tokenizer.encode(text, special=_flag(fields, "add_special_tokens", False))
        else:
            prompt = fields.get("prompt")
            if not isinstance(prompt, str):
                raise InvalidField("prompt", "prompt (a string) or messages is required")
            tokens = tokenizer.encode(prompt, special=_flag(fields, "add_special_tokens", True))
        strings = (
            [tokenizer.token_text(t) for t in tokens] if _flag(fields, "return_token_strs", False) else None
        )
        body = {
            "count": len(tokens),
            "max_model_len": llm.max_context_len,
            "tokens": tokens,
            "token_strs": strings,
        }
        return json_response(200, orjson.dumps(body))

    async def detokenize(self, request: HttpRequest) -> HttpResponse:
        fields, llm = self._llm(request, _DETOKENIZE_FIELDS)
        tokens = fields.get("tokens")
        size = llm.tokenizer.vocab_size
        if (
            not isinstance(tokens, list)
            or len(tokens) > _MAX_TOKENS
            or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < size for t in tokens)
        ):
            raise InvalidField("tokens", f"tokens must be a list of token ids in [0, {size})")
        return json_response(200, orjson.dumps({"prompt": llm.tokenizer.decode(tokens)}))


def _operation(operation_id: str, summary: str, body: bool) -> Operation:
    operation: Operation = {
        "operationId": operation_id,
        "summary": summary,
        "tags": ["openai"],
        "responses": {
            "200": {"description": "the answer (vLLM's shape)"},
            "400": {"description": "invalid request, OpenAI's error shape"},
            "404": {"description": "unknown model or not a generation model"},
        },
    }
    if body:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    else:
        operation["responses"] = {
            "200": {"description": "every model is ready (empty body)"},
            "503": {"description": "not ready (loading or draining)"},
        }
    return operation


def add_llm_tool_routes(
    app: HttpApp, registry: ModelRegistry, ready: Callable[[], bool], repository: Path | None = None
) -> None:
    """Add ``/health``, ``/tokenize``, ``/detokenize``, ``/v1/responses`` and, with the model
    ``repository`` folder, ``/v1/embeddings``; ``ready`` is the server's readiness."""
    routes = _ToolRoutes(registry, app.exchange, ready)
    add_responses_route(app)
    if repository is not None:
        add_embeddings_route(app, registry, repository)
    app.add_route("GET", "/health", routes.health, _operation("vllm_health", "Ready (vLLM's probe)", False))
    app.add_route(
        "POST", "/tokenize", routes.tokenize, _operation("vllm_tokenize", "Text or chat to token ids", True)
    )
    app.add_route(
        "POST", "/detokenize", routes.detokenize, _operation("vllm_detokenize", "Token ids to text", True)
    )
