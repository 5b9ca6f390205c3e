"""OpenAI's ``POST /v1/responses``, the text part of it, on top of the chat completion: the
``input`` (a string or messages) and ``instructions`` become a conversation, the sampling and
``text.format`` fields map onto chat's, and the answer comes back as one ``output`` message.

Nothing is stored (no ``previous_response_id``, ``store`` false only) and there is no streaming
here yet: those fields are refused by name, as is every field this route does not honour.
"""

from __future__ import annotations

import logging
import time
import uuid

import orjson

from ortserve.errors import InternalError, InvalidField, InvalidInput, OrtServeError
from ortserve.protocol import openai_codec as codec
from ortserve.repository.registry import ModelRegistry
from ortserve.server.http.app import HttpApp, Operation
from ortserve.server.http.errors import openai_error_response
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response
from ortserve.server.http.openai_answers import start_chat
from ortserve.server.http.openai_routes import resolve_llm

__all__ = ["add_responses_route"]

logger = logging.getLogger(__name__)

_HONOURED = frozenset(
    {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "text", "store",
     "metadata", "user", "safety_identifier", "prompt_cache_key", "parallel_tool_calls"}
)  # fmt: skip
_REFUSED = {
    "stream": "streaming /v1/responses is not supported; use /v1/chat/completions with stream",
    "previous_response_id": "responses are not stored, so there is no previous response",
    "conversation": "responses are not stored, so there is no conversation",
    "tools": "tools are supported on /v1/chat/completions",
    "tool_choice": "tools are supported on /v1/chat/completions",
    "reasoning": "this server runs no reasoning models",
    "background": "background responses are not supported",
    "include": "include is not supported",
}


def _fields(body: bytes) -> dict[str, object]:
    try:
        fields = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"the body is not JSON: {exc}") from exc
    if not isinstance(fields, dict):
        raise InvalidInput("the body must be a JSON object")
    for name, value in fields.items():
        if name in _REFUSED and value not in (None, False, []):
            raise InvalidField(name, f"{name}: {_REFUSED[name]}")
        if name not in _HONOURED and name not in _REFUSED:
            raise InvalidField(name, f"{name}: unknown field (the supported fields are in docs/llm-api.md)")
    if fields.get("store") not in (None, False):
        raise InvalidField("store", "store: responses are not stored by this server (false only)")
    return fields


def _messages(fields: dict[str, object]) -> list[object]:
    raw = fields.get("input")
    messages: list[object] = []
    instructions = fields.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidField("instructions", "instructions must be a string")
        messages.append({"role": "system", "content": instructions})
    if isinstance(raw, str):
        return [*messages, {"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise InvalidField("input", "input must be a string or a non-empty list of messages")
    for index, item in enumerate(raw):
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            raise InvalidField("input", f"input[{index}]: only messages are supported")
        content = item.get("content")
        if isinstance(content, list):  # input_text / output_text parts
            texts = [
                p.get("text")
                for p in content
                if isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
            ]
            if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
                raise InvalidField("input", f"input[{index}].content: only text parts are supported")
            content = "".join(str(t) for t in texts)
        messages.append({"role": item.get("role"), "content": content})
    return messages


def _chat_fields(fields: dict[str, object]) -> dict[str, object]:
    chat: dict[str, object] = {"model": fields.get("model"), "messages": _messages(fields)}
    for source, target in (
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
    ):
        if fields.get(source) is not None:
            chat[target] = fields[source]
    text = fields.get("text")
    if text is not None:
        if not isinstance(text, dict) or set(text) - {"format"} or not isinstance(text.get("format"), dict):
            raise InvalidField("text", "text takes one key, format (an object)")
        form: dict[str, object] = text["format"]
        if form.get("type") == "json_schema":  # flat in /v1/responses, nested in chat
            spec = {k: v for k, v in form.items() if k != "type"}
            chat["response_format"] = {"type": "json_schema", "json_schema": spec}
        else:
            chat["response_format"] = form
    return chat


def _answer(model: str, text: str, finish: str | None, usage: dict[str, object]) -> dict[str, object]:
    complete = finish != "length"
    message = {
        "type": "message",
        "id": f"msg_{uuid.uuid4().hex}",
        "status": "completed" if complete else "incomplete",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    prompt, completion = int(usage["prompt_tokens"]), int(usage["completion_tokens"])  # type: ignore[call-overload]
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed" if complete else "incomplete",
        "incomplete_details": None if complete else {"reason": "max_output_tokens"},
        "error": None,
        "model": model,
        "output": [message],
        "parallel_tool_calls": True,
        "tool_choice": "none",
        "tools": [],
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]},  # type: ignore[index]
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        },
    }


class _ResponsesRoute:
    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry

    async def respond(self, request: HttpRequest) -> HttpResponse:
        try:
            fields = _fields(request.body)
            parsed = codec.parse_chat(orjson.dumps(_chat_fields(fields)))
            llm = resolve_llm(self._registry, parsed.model)
            answer = await start_chat(llm, parsed)
            chat = orjson.loads(await answer.body())
            choice = chat["choices"][0]
            body = _answer(
                parsed.model, choice["message"]["content"] or "", choice["finish_reason"], chat["usage"]
            )
            return json_response(200, orjson.dumps(body))
        except OrtServeError as error:
            return openai_error_response(error)
        except Exception:
            logger.exception("response failed")
            return openai_error_response(InternalError("internal server error"))


def add_responses_route(app: HttpApp, registry: ModelRegistry) -> None:
    """Add ``POST /v1/responses``."""
    operation: Operation = {
        "operationId": "openai_responses",
        "summary": "OpenAI response (text; not stored, not streamed)",
        "tags": ["openai"],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}},
        "responses": {
            "200": {"description": "the response object"},
            "400": {"description": "invalid or unsupported field, OpenAI's error shape"},
            "404": {"description": "unknown model or not a generation model"},
        },
    }
    app.add_route("POST", "/v1/responses", _ResponsesRoute(registry).respond, operation)
