"""OpenAI's ``POST /v1/responses``, the text part of it, on top of the chat completion: the
``input`` (a string or messages) and ``instructions`` become a conversation, the sampling and
``text.format`` fields map onto chat's, and the answer comes back as one ``output`` message.

Nothing is stored (no ``previous_response_id``, ``store`` false only): those fields are refused
by name, as is every field this route does not honour. ``stream`` sends the Responses API's
events (created, output_text deltas, completed). Function ``tools`` map onto chat's (calls come
back as ``function_call`` output items; ``function_call`` and ``function_call_output`` input
items become the conversation's assistant and tool messages), not streamed.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator

import orjson

from ortserve.errors import InvalidField, InvalidInput, OrtServeError
from ortserve.llm.servable import GenerationStream
from ortserve.protocol import openai_codec as codec
from ortserve.server.exchange import Exchange
from ortserve.server.http.answers import begun
from ortserve.server.http.app import HttpApp, Operation
from ortserve.server.http.errors import openai_error_response
from ortserve.server.http.messages import ErrorShape, HttpRequest, HttpResponse, json_response
from ortserve.server.http.openai_answers import start_chat

__all__ = ["add_responses_route"]

logger = logging.getLogger(__name__)

_HONOURED = frozenset(
    {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "text", "store", "stream",
     "metadata", "user", "safety_identifier", "prompt_cache_key", "parallel_tool_calls", "tools", "tool_choice"}
)  # fmt: skip
_REFUSED = {
    "previous_response_id": "responses are not stored, so there is no previous response",
    "conversation": "responses are not stored, so there is no conversation",
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


def _tool_item(item: dict[str, object], index: int) -> dict[str, object]:
    """A function call the model made, or its output, as the chat's assistant or tool message."""
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise InvalidField("input", f"input[{index}].call_id must be a string")
    if item["type"] == "function_call_output":
        return {"role": "tool", "tool_call_id": call_id, "content": str(item.get("output", ""))}
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": item.get("name"), "arguments": item.get("arguments")},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _tools(fields: dict[str, object], chat: dict[str, object]) -> None:
    """Function tools (flat here, nested in chat) and tool_choice, into the chat request."""
    tools = fields.get("tools")
    if tools:
        if not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type") == "function" for t in tools
        ):
            raise InvalidField("tools", "tools: only function tools are supported")
        chat["tools"] = [
            {
                "type": "function",
                "function": {k: v for k, v in t.items() if k in ("name", "description", "parameters")},
            }
            for t in tools
        ]
    choice = fields.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        chat["tool_choice"] = choice
    if fields.get("parallel_tool_calls") is not None:
        chat["parallel_tool_calls"] = fields["parallel_tool_calls"]


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
        if isinstance(item, dict) and item.get("type") in ("function_call", "function_call_output"):
            messages.append(_tool_item(item, index))
            continue
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            raise InvalidField("input", f"input[{index}]: only messages and function calls are supported")
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
    _tools(fields, chat)
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


def _message(message_id: str, text: str | None, status: str) -> dict[str, object]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": message_id, "status": status, "role": "assistant", "content": content}


def _response(
    response_id: str, created: int, model: str, status: str, output: list[object], usage: codec.Usage | None
) -> dict[str, object]:
    """The response object; ``usage`` None while it is in progress."""
    counted = None
    if usage is not None:
        counted = {
            "input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        }
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "error": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "none",
        "tools": [],
        "usage": counted,
    }


def _error_event(error: OrtServeError) -> bytes:
    """A failure after the stream's head is out: the Responses API's error event, then the end."""
    body = orjson.dumps({"type": "error", "code": None, "message": error.message, "param": None})
    return b"event: error\ndata: " + body + b"\n\n"


RESPONSES = ErrorShape(openai_error_response, _error_event)
"""OpenAI's error object; a stream's failure as the Responses API's ``error`` event."""


def _usage(stream: GenerationStream) -> codec.Usage:
    return codec.Usage(stream.prompt_tokens, stream.completion_tokens, stream.cached_tokens)


async def _events(model: str, stream: GenerationStream) -> AsyncIterator[bytes]:
    """The Responses API's streamed events for one message: created, the text's deltas, done."""
    number = itertools.count()
    response_id, message_id, created = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}", int(time.time())
    where = {"item_id": message_id, "output_index": 0, "content_index": 0}

    def event(kind: str, **payload: object) -> bytes:
        body = orjson.dumps({"type": kind, "sequence_number": next(number), **payload})
        return b"event: " + kind.encode() + b"\ndata: " + body + b"\n\n"

    started = _response(response_id, created, model, "in_progress", [], None)
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    yield event("response.output_item.added", output_index=0, item=_message(message_id, None, "in_progress"))
    yield event(
        "response.content_part.added", **where, part={"type": "output_text", "text": "", "annotations": []}
    )
    text, finish = "", None
    async for piece in stream.events():  # a failure ends the stream with RESPONSES' error event
        if piece.text:
            text += piece.text
            yield event("response.output_text.delta", **where, delta=piece.text, logprobs=[])
        finish = piece.finish_reason
    status = "incomplete" if finish == "length" else "completed"
    yield event("response.output_text.done", **where, text=text, logprobs=[])
    yield event(
        "response.content_part.done", **where, part={"type": "output_text", "text": text, "annotations": []}
    )
    item = _message(message_id, text, status)
    yield event("response.output_item.done", output_index=0, item=item)
    final = _response(response_id, created, model, status, [item], _usage(stream))
    yield event(f"response.{status}", response=final)


class _ResponsesRoute:
    def __init__(self, exchange: Exchange) -> None:
        self._exchange = exchange

    async def respond(self, request: HttpRequest) -> HttpResponse:
        """Decode into a chat request, generate through the Exchange, encode as a response (the
        app finishes the request's scope with the answer, the stream's end or the error)."""
        exchange = self._exchange
        scope = begun(exchange, request, "", None, RESPONSES, generation=True)
        fields = _fields(request.body)
        parsed = codec.parse_chat(orjson.dumps(_chat_fields(fields)))
        scope.model = parsed.model
        streaming = fields.get("stream") is True
        if streaming and fields.get("tools"):
            raise InvalidField("stream", "stream: tool calls on /v1/responses come whole (stream on chat)")
        llm = exchange.llm(scope, parsed.model, None, request.text_header, parsed.fields, request.tenant)
        answer = await start_chat(llm, parsed)
        exchange.started(scope, request.tenant, llm, answer.streams)
        stream = answer.streams[0]
        if streaming:
            headers = [(b"cache-control", b"no-cache")]
            return HttpResponse(200, [], b"text/event-stream", headers, stream=_events(parsed.model, stream))
        chat = orjson.loads(await answer.body())
        choice = chat["choices"][0]
        status = "incomplete" if choice["finish_reason"] == "length" else "completed"
        output: list[object] = [
            {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
             "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": "completed"}
            for call in choice["message"].get("tool_calls") or []
        ]  # fmt: skip
        if choice["message"]["content"] or not output:
            output.insert(0, _message(f"msg_{uuid.uuid4().hex}", choice["message"]["content"] or "", status))
        body = _response(
            f"resp_{uuid.uuid4().hex}", int(time.time()), parsed.model, status, output, _usage(stream)
        )
        return json_response(200, orjson.dumps(body))


def add_responses_route(app: HttpApp) -> None:
    """Add ``POST /v1/responses``."""
    operation: Operation = {
        "operationId": "openai_responses",
        "summary": "OpenAI response (text; not stored; events when stream is true)",
        "tags": ["openai"],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}},
        "responses": {
            "200": {"description": "the response object"},
            "400": {"description": "invalid or unsupported field, OpenAI's error shape"},
            "404": {"description": "unknown model or not a generation model"},
            "429": {"description": "the generation queue or the tenant's quota is full (Retry-After)"},
        },
    }
    app.add_route("POST", "/v1/responses", _ResponsesRoute(app.exchange).respond, operation)
