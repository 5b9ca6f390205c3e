"""OpenAI's completion and chat-completion requests, usage and server-sent events: pure functions.

Requests are checked field by field with errors naming the field; answers are built as the
official ``openai`` client parses them (ids, ``object`` names, ``usage`` with
``prompt_tokens_details.cached_tokens``, ``data: [DONE]``; the choices in ``openai_choices``).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from ortserve.errors import InvalidField, InvalidInput
from ortserve.protocol.openai_fields import CHAT, COMPLETION, check_fields

__all__ = [
    "DONE",
    "ChatRequest",
    "CompletionRequest",
    "Usage",
    "error_body",
    "models_body",
    "parse_chat",
    "parse_completion",
    "parse_messages",
    "sse",
]

DONE = b"data: [DONE]\n\n"
_ROLES = {"system", "developer", "user", "assistant", "tool"}


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    def body(self) -> dict[str, object]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str
    messages: list[dict[str, object]]
    stream: bool
    include_usage: bool
    fields: dict[str, object]
    """Every field, for the sampling parameters."""


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    model: str
    prompt: str | list[int]
    stream: bool
    include_usage: bool
    echo: bool
    fields: dict[str, object]


def _object(body: bytes) -> dict[str, object]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"the body is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise InvalidInput("the body must be a JSON object")
    return value


def _common(fields: dict[str, object]) -> tuple[str, bool, bool]:
    model = fields.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidInput("model: a model name is required")
    stream = fields.get("stream", False)
    if not isinstance(stream, bool | None):
        raise InvalidInput("stream must be a boolean")
    options = fields.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    return model, bool(stream), include_usage


def _content(message: dict[str, object], index: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise InvalidInput(f"messages[{index}].content: only text parts are supported")
            texts.append(str(part["text"]))
        return "".join(texts)
    raise InvalidInput(f"messages[{index}].content must be a string or a list of text parts")


def _message(message: dict[str, object], index: int) -> dict[str, object]:
    """The message as the chat template sees it; a key it would drop is refused by name."""
    rendered: dict[str, object] = {"role": message["role"], "content": _content(message, index)}
    for key, value in message.items():
        if key in ("role", "content") or (key == "refusal" and value is None):
            continue
        if (key == "name" and isinstance(value, str)) or (key == "tool_call_id" and isinstance(value, str)):
            rendered[key] = value
            continue
        if key == "tool_calls" and isinstance(value, list) and message["role"] == "assistant":
            rendered[key] = value  # as the client sent them back: the template renders them
            continue
        raise InvalidField(f"messages[{index}].{key}", f"messages[{index}].{key} is not supported")
    return rendered


def parse_chat(body: bytes) -> ChatRequest:
    """A chat-completion request.

    Raises:
        InvalidInput: naming the field that is wrong.
    """
    fields = _object(body)
    check_fields(fields, CHAT)
    model, stream, include_usage = _common(fields)
    messages = parse_messages(fields.get("messages"))
    return ChatRequest(model, messages, stream, include_usage, fields)


def parse_messages(raw: object) -> list[dict[str, object]]:
    """The conversation as the chat template sees it.

    Raises:
        InvalidInput: naming the message and key that is wrong.
    """
    if not isinstance(raw, list) or not raw:
        raise InvalidField("messages", "messages: a non-empty list of messages is required")
    messages = []
    for index, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise InvalidInput(f"messages[{index}].role must be one of {sorted(_ROLES)}")
        messages.append(_message(message, index))
    return messages


def parse_completion(body: bytes) -> CompletionRequest:
    """A (legacy) completion request: ``prompt`` is a string, token ids, or a list of one string.

    Raises:
        InvalidInput: naming the field that is wrong.
    """
    fields = _object(body)
    check_fields(fields, COMPLETION)
    model, stream, include_usage = _common(fields)
    prompt = fields.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        tokens: str | list[int] = [int(t) for t in prompt]
    elif isinstance(prompt, str):
        tokens = prompt
    else:
        raise InvalidInput("prompt must be a string or a list of token ids (one prompt per request)")
    return CompletionRequest(model, tokens, stream, include_usage, fields.get("echo") is True, fields)


def sse(payload: dict[str, object]) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def models_body(names: list[tuple[str, int]]) -> bytes:
    """``GET /v1/models``: (name, created) of every generation model."""
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "ortserve"} for name, created in names
    ]
    return orjson.dumps({"object": "list", "data": data})


def error_body(message: str, kind: str, code: str | None) -> dict[str, object]:
    """OpenAI's error object (``{"error": {...}}``)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
