"""Which fields of OpenAI's chat-completion and completion requests ortserve honours, and the
400 (naming the field, OpenAI's ``param``) for every other one.

A field that is accepted and then ignored is the worst answer a server can give: the client
believes it got a bias, JSON or a tool call and did not. So every field is in one of three
tables: honoured, informational (it cannot change the output: ``user``, ``metadata``...), or
refused with the reason; a field in none of them is refused as unknown.
"""

from __future__ import annotations

from collections.abc import Mapping

from ortserve.errors import InvalidField

__all__ = ["CHAT", "COMPLETION", "check_fields", "refusal_reasons"]

_SAMPLING = frozenset(
    {
        "model", "stream", "stream_options", "n", "max_tokens", "temperature", "top_p", "seed",
        "stop", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
        # vLLM's extensions, honoured the same way
        "top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids", "cache_salt",
        "priority",  # the queue lane, as for classic models (LlmVersion.generate)
    }
)  # fmt: skip
_INFORMATIONAL = frozenset({"user", "metadata", "safety_identifier", "prompt_cache_key"})
_ROUTING = frozenset({"ab_tag", "user_id"})
"""A model's routing policy reads these (its default override parameter and sticky field):
they choose the version, not the output."""

CHAT = _SAMPLING | _INFORMATIONAL | _ROUTING | {
    "messages", "max_completion_tokens", "top_logprobs", "store", "service_tier",
    "response_format", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
}  # fmt: skip
"""Fields of ``POST /v1/chat/completions`` that are honoured (some values may still be refused)."""

COMPLETION = _SAMPLING | _INFORMATIONAL | _ROUTING | {"prompt", "echo", "best_of"}
"""Fields of ``POST /v1/completions`` that are honoured."""

_REFUSED = {
    "audio": "audio output is not supported (text models only)",
    "modalities": 'only ["text"] output is supported',
    "prediction": "predicted outputs are not supported",
    "reasoning_effort": "this server runs no reasoning models",
    "verbosity": "this server runs no reasoning models",
    "web_search_options": "web search is not supported",
    "functions": "the deprecated functions field is not supported; use tools",
    "function_call": "the deprecated function_call field is not supported; use tool_choice",
    "suffix": "suffix (insertion) is not supported",
}


def refusal_reasons() -> dict[str, str]:
    """Every field refused by name, with why (the docs' table)."""
    return dict(_REFUSED)


def _check_value(name: str, value: object) -> None:
    """Informational fields and fields honoured only for some values."""
    if name == "store" and value not in (None, False):
        raise InvalidField(name, "store: completions are not stored by this server (false only)")
    if name == "service_tier" and value not in (None, "auto", "default"):
        raise InvalidField(name, 'service_tier: only "auto" and "default" are served')
    if name == "parallel_tool_calls" and not isinstance(value, bool):
        raise InvalidField(name, "parallel_tool_calls must be a boolean")
    if name == "metadata" and value is not None and not isinstance(value, dict):
        raise InvalidField(name, "metadata must be an object")
    if name in ("user", "safety_identifier", "prompt_cache_key") and not isinstance(value, str | None):
        raise InvalidField(name, f"{name} must be a string")
    if name == "stream_options" and value is not None:
        if not isinstance(value, dict) or set(value) - {"include_usage", "continuous_usage_stats"}:
            raise InvalidField(
                name, "stream_options: only include_usage and continuous_usage_stats are supported"
            )
        if not isinstance(value.get("continuous_usage_stats", False), bool):
            raise InvalidField(name, "stream_options.continuous_usage_stats must be a boolean")
        if not isinstance(value.get("include_usage", False), bool):
            raise InvalidField(name, "stream_options.include_usage must be a boolean")


def check_fields(fields: Mapping[str, object], honoured: frozenset[str]) -> None:
    """Refuse (400 naming it) the first field that is not honoured.

    Raises:
        InvalidField: an unknown field, a refused one, or an informational one with a value
            that would change what the server does.
    """
    for name, value in fields.items():
        if value is None and name not in ("model", "messages", "prompt"):
            continue  # the openai client's NOT_GIVEN never arrives; an explicit null means "default"
        if name == "modalities" and value == ["text"]:
            continue
        if name in _REFUSED:
            raise InvalidField(name, f"{name}: {_REFUSED[name]}")
        if name not in honoured:
            raise InvalidField(name, f"{name}: unknown field (the supported fields are in docs/llm-api.md)")
        _check_value(name, value)
