"""Tool calls: the request's ``tools`` and ``tool_choice`` checked, the grammar that makes a
``required`` or named call always parse, and the calls read back out of the model's text.

Text format: with ``required`` or a named function the answer is constrained to a JSON list of
``{"name": ..., "arguments": {...}}`` (vLLM's choice), validated against each function's
``parameters``; with ``auto`` the model's own text is read for Hermes-style
``<tool_call>{...}</tool_call>`` blocks or a bare JSON call, as most open chat templates ask.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ortserve.errors import InvalidField

__all__ = ["ToolCall", "ToolRequest", "parse_tool_calls", "tool_request"]

_MAX_TOOLS = 128
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call: its id, the function's name and its arguments as a JSON string (OpenAI's shape)."""

    id: str
    name: str
    arguments: str

    def body(self, index: int | None = None) -> dict[str, object]:
        call: dict[str, object] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """What a chat request asks of tools."""

    tools: list[dict[str, object]]
    """As the chat template receives them (OpenAI's objects)."""
    choice: str
    """"none", "auto", "required" or "named"."""
    names: dict[str, dict[str, object]]
    """Function name -> its parameters' schema."""
    forced: str | None = None
    """The named function (``choice == "named"``)."""
    parallel: bool = True

    @property
    def constrained(self) -> bool:
        return self.choice in ("required", "named")

    @property
    def parsed(self) -> bool:
        """Whether the answer is read for calls."""
        return self.choice != "none" and bool(self.tools)

    def grammar_schema(self) -> dict[str, object]:
        """The JSON schema a constrained answer follows: a list of calls."""
        names = [self.forced] if self.forced is not None else list(self.names)
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": self.names[name]},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for name in names
        ]
        item: dict[str, object] = calls[0] if len(calls) == 1 else {"anyOf": calls}
        bound = {"maxItems": 1} if not self.parallel or self.forced is not None else {}
        return {"type": "array", "items": item, "minItems": 1, **bound}


def _function(tool: object, index: int) -> tuple[str, dict[str, object]]:
    where = f"tools[{index}]"
    if (
        not isinstance(tool, dict)
        or tool.get("type") != "function"
        or not isinstance(tool.get("function"), dict)
    ):
        raise InvalidField("tools", f'{where} must be {{"type": "function", "function": {{...}}}}')
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidField("tools", f"{where}.function.name must match [A-Za-z0-9_-]{{1,64}}")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise InvalidField("tools", f"{where}.function.parameters must be a JSON schema object")
    return name, parameters


def tool_request(fields: dict[str, object]) -> ToolRequest:
    """The request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, checked.

    Raises:
        InvalidField: naming the field that is wrong.
    """
    raw = fields.get("tools") or []
    if not isinstance(raw, list) or len(raw) > _MAX_TOOLS:
        raise InvalidField("tools", f"tools must be a list of at most {_MAX_TOOLS} functions")
    names: dict[str, dict[str, object]] = {}
    for index, tool in enumerate(raw):
        name, parameters = _function(tool, index)
        if name in names:
            raise InvalidField("tools", f"tools: {name!r} is declared twice")
        names[name] = parameters
    choice = fields.get("tool_choice") or ("auto" if raw else "none")
    parallel = fields.get("parallel_tool_calls", True) is not False
    if choice in ("none", "auto", "required"):
        if choice == "required" and not raw:
            raise InvalidField("tool_choice", "tool_choice required needs tools")
        return ToolRequest(list(raw), str(choice), names, None, parallel)
    if (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("function"), dict)
    ):
        forced = choice["function"].get("name")
        if forced not in names:
            raise InvalidField("tool_choice", f"tool_choice names {forced!r}, which is not in tools")
        return ToolRequest(list(raw), "named", names, str(forced), parallel)
    raise InvalidField(
        "tool_choice",
        'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
    )


def _call(value: object, known: dict[str, dict[str, object]]) -> ToolCall | None:
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    arguments = value.get("arguments", value.get("parameters", {}))
    if not isinstance(name, str) or name not in known:
        return None
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(f"call_{uuid.uuid4().hex[:24]}", name, text)


def parse_tool_calls(text: str, request: ToolRequest) -> tuple[list[ToolCall], str]:
    """The calls in the model's ``text`` and the text left around them ("" when all of it was calls)."""
    candidates: list[object] = []
    rest = text
    blocks = _HERMES.findall(text)
    if blocks:
        for block in blocks:
            try:
                candidates.append(json.loads(block))
            except json.JSONDecodeError:
                return [], text
        rest = _HERMES.sub("", text).strip()
    else:
        stripped = text.strip()
        if not stripped.startswith(("{", "[")):
            return [], text
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError:
            return [], text
        candidates = value if isinstance(value, list) else [value]
        rest = ""
    calls = [_call(c, request.names) for c in candidates]
    if not calls or any(c is None for c in calls):
        return [], text
    return [c for c in calls if c is not None], rest


def chat_message(text: str, finish: str | None, request: ToolRequest) -> tuple[dict[str, object], str | None]:
    """A whole answer's ``message`` and ``finish_reason``: its calls, when it made some."""
    calls, rest = parse_tool_calls(text, request) if request.parsed else ([], text)
    if not calls:
        return {"role": "assistant", "content": text}, finish
    message: dict[str, object] = {
        "role": "assistant",
        "content": rest or None,
        "tool_calls": [c.body() for c in calls],
    }
    return message, "tool_calls" if finish == "stop" else finish


class StreamedCalls:
    """One streamed choice's text while it may still turn out to be tool calls: held back as long
    as it reads like the start of a call, released as content as soon as it cannot be one."""

    __slots__ = ("_held", "_released", "_request")

    def __init__(self, request: ToolRequest) -> None:
        self._request = request
        self._held = ""
        self._released = not request.parsed

    def feed(self, text: str) -> str:
        """The content to send now."""
        if self._released:
            return text
        self._held += text
        head = self._held.lstrip()
        if (
            self._request.constrained
            or head.startswith(("{", "[", "<tool_call>"))
            or "<tool_call>".startswith(head[:11])
        ):
            return ""
        self._released = True
        held, self._held = self._held, ""
        return held

    def finish(self, finish: str | None) -> tuple[str, list[dict[str, object]], str | None]:
        """At the end: (content still to send, tool-call deltas, finish reason)."""
        held, self._held = self._held, ""
        if self._released or not held:
            return held, [], finish
        calls, rest = parse_tool_calls(held, self._request)
        if not calls:
            return held, [], finish
        deltas = [c.body(index) for index, c in enumerate(calls)]
        return rest, deltas, "tool_calls" if finish == "stop" else finish


def template_variables(fields: dict[str, object], request: ToolRequest) -> dict[str, object]:
    """What the chat template receives beside the messages: ``tools`` and ``chat_template_kwargs``.

    Raises:
        InvalidField: ``chat_template_kwargs`` is not an object of string keys.
    """
    extra = fields.get("chat_template_kwargs") or {}
    if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra):
        raise InvalidField("chat_template_kwargs", "chat_template_kwargs must be an object")
    return {**extra, "tools": request.tools or None}
