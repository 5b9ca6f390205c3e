"""Every field of an OpenAI request is honoured or refused by name: the field tables and the
sampling parameters' checks."""

from __future__ import annotations

import pytest

from ortserve.errors import InvalidField
from ortserve.protocol import openai_codec as codec
from ortserve.protocol.openai_fields import CHAT, COMPLETION, check_fields
from ortserve.protocol.openai_sampling import choice_count, sampling_params

_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("frobnicate", 1),  # unknown
        ("audio", {"voice": "alloy"}),
        ("modalities", ["text", "audio"]),
        ("functions", [{"name": "f"}]),
        ("store", True),
        ("service_tier", "flex"),
        ("stream_options", {"include_usage": True, "continuous_usage_stats": "yes"}),
        ("stream_options", {"include_usage": True, "obfuscation": False}),
        ("prediction", {"type": "content", "content": "x"}),
    ],
)
def test_a_chat_field_that_is_not_honoured_is_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(InvalidField) as refused:
        check_fields({**_CHAT, field: value}, CHAT)
    assert refused.value.param == field and field in refused.value.message


@pytest.mark.parametrize(
    ("field", "value"),
    [("user", "u1"), ("metadata", {"k": "v"}), ("store", False), ("service_tier", "auto"),
     ("modalities", ["text"]), ("seed", 3), ("temperature", None), ("top_k", 5)],
)  # fmt: skip
def test_informational_and_sampling_fields_are_accepted(field: str, value: object) -> None:
    check_fields({**_CHAT, field: value}, CHAT)


def test_chat_only_fields_are_refused_on_completions() -> None:
    with pytest.raises(InvalidField) as refused:
        check_fields({"model": "m", "prompt": "x", "messages": []}, COMPLETION)
    assert refused.value.param == "messages"


def test_a_message_key_the_template_would_drop_is_refused() -> None:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi", "audio": {"id": "a"}}]}'
    with pytest.raises(InvalidField) as refused:
        codec.parse_chat(body)
    assert refused.value.param == "messages[0].audio"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"logit_bias": {"999": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"stop_token_ids": [1, 1000]}, "stop_token_ids"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"top_logprobs": 3}, "top_logprobs"),  # without logprobs
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
    ],
)
def test_sampling_fields_out_of_range_name_the_field(fields: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidField) as refused:
        sampling_params(fields, 16, vocab_size=400, chat=True)
    assert refused.value.param == param


def test_sampling_fields_become_parameters() -> None:
    fields = {"max_completion_tokens": 7, "temperature": 0.5, "top_k": 4, "min_p": 0.1, "seed": 9,
              "logit_bias": {"12": 5, "30": -100}, "stop_token_ids": [3], "logprobs": True,
              "top_logprobs": 2, "repetition_penalty": 1.2}  # fmt: skip
    params = sampling_params(fields, 16, vocab_size=400, chat=True)
    assert (params.max_tokens, params.temperature, params.top_k) == (7, 0.5, 4)
    assert (params.min_p, params.seed) == (0.1, 9)
    assert params.logit_bias == ((12, 5.0), (30, -100.0)) and params.stop_token_ids == (3,)
    assert params.logprobs and params.top_logprobs == 2 and params.repetition_penalty == 1.2
    legacy = sampling_params({"logprobs": 3}, 16, vocab_size=400, chat=False)
    assert legacy.logprobs and legacy.top_logprobs == 3


def test_best_of_must_cover_n_and_cannot_stream() -> None:
    assert choice_count({"n": 2, "best_of": 4}) == (2, 4)
    with pytest.raises(InvalidField):
        choice_count({"n": 3, "best_of": 2})
    with pytest.raises(InvalidField):
        choice_count({"n": 1, "best_of": 2, "stream": True})
    with pytest.raises(InvalidField):
        choice_count({"n": 17})
