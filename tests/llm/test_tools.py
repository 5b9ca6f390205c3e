"""Tool requests are checked by name, constrained calls have a schema, and calls are read back
out of the model's text (Hermes blocks, bare JSON, the constrained list)."""

from __future__ import annotations

import json

import pytest

from ortserve.errors import InvalidField
from ortserve.llm.tools import StreamedCalls, chat_message, parse_tool_calls, tool_request

_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
_TIME = {"type": "function", "function": {"name": "get_time"}}


def test_calls_are_read_from_hermes_blocks_bare_json_and_lists() -> None:
    request = tool_request({"tools": [_WEATHER, _TIME]})
    hermes = 'Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    calls, rest = parse_tool_calls(hermes, request)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]
    assert rest == "Sure."
    calls, rest = parse_tool_calls('[{"name": "get_time", "arguments": {}}, {"name": "get_weather", '
                                   '"arguments": {"city": "Rome"}}]', request)  # fmt: skip
    assert [c.name for c in calls] == ["get_time", "get_weather"] and rest == ""
    assert parse_tool_calls('{"name": "unknown", "arguments": {}}', request) == (
        [],
        '{"name": "unknown", "arguments": {}}',
    )
    assert parse_tool_calls("just words", request)[0] == []


def test_a_whole_answer_with_calls_becomes_tool_calls() -> None:
    request = tool_request({"tools": [_WEATHER], "tool_choice": "required"})
    message, finish = chat_message(
        '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]', "stop", request
    )
    assert finish == "tool_calls" and message["content"] is None
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"  # type: ignore[index]


def test_streamed_text_is_held_only_while_it_may_be_a_call() -> None:
    request = tool_request({"tools": [_WEATHER]})
    prose = StreamedCalls(request)
    assert prose.feed("The") == "The" and prose.feed(" end") == " end"
    call = StreamedCalls(request)
    assert call.feed('{"name": "get_weather", ') == "" and call.feed('"arguments": {"city": "X"}}') == ""
    rest, deltas, finish = call.finish("stop")
    assert rest == "" and finish == "tool_calls" and deltas[0]["index"] == 0


def test_the_constrained_schema_names_the_forced_function_only() -> None:
    named = tool_request(
        {"tools": [_WEATHER, _TIME], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    )
    schema = named.grammar_schema()
    assert schema["maxItems"] == 1 and schema["items"]["properties"]["name"] == {"const": "get_time"}  # type: ignore[index]
    both = tool_request({"tools": [_WEATHER, _TIME], "tool_choice": "required"}).grammar_schema()
    assert len(both["items"]["anyOf"]) == 2 and "maxItems" not in both  # type: ignore[index]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
        ({"tools": [_WEATHER, _WEATHER]}, "tools"),
        ({"tools": "x"}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": [_WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": [_WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ],
)
def test_bad_tool_fields_are_refused_by_name(fields: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidField) as refused:
        tool_request(fields)
    assert refused.value.param == param
