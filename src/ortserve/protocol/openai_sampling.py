"""OpenAI's (and vLLM's) sampling fields -> ``SamplingParams``, each checked for type and range
with a 400 naming the field."""

from __future__ import annotations

from collections.abc import Mapping

from ortserve.errors import InvalidField
from ortserve.llm.sampler import SamplingParams

__all__ = ["choice_count", "sampling_params"]

_MAX_CHOICES = 16
_MAX_BIAS_ENTRIES = 300  # OpenAI's bound: logit_bias is not a way to ship a vocabulary


def _number(fields: Mapping[str, object], key: str, default: float, low: float, high: float) -> float:
    value = fields.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidField(key, f"{key} must be a number")
    if not low <= value <= high:
        raise InvalidField(key, f"{key} must be between {low:g} and {high:g}")
    return float(value)


def _integer(fields: Mapping[str, object], key: str, low: int, high: int) -> int | None:
    value = fields.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidField(key, f"{key} must be an integer")
    if not low <= value <= high:
        raise InvalidField(key, f"{key} must be between {low} and {high}")
    return value


def _stops(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise InvalidField("stop", "stop must be a non-empty string or a list of at most 4 of them")
    return tuple(stops)


def _token_ids(fields: Mapping[str, object], key: str, vocab_size: int) -> tuple[int, ...]:
    value = fields.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > _MAX_BIAS_ENTRIES:
        raise InvalidField(key, f"{key} must be a list of at most {_MAX_BIAS_ENTRIES} token ids")
    if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size for t in value):
        raise InvalidField(key, f"{key}: token ids must be integers in [0, {vocab_size})")
    return tuple(value)


def _logit_bias(value: object, vocab_size: int) -> tuple[tuple[int, float], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or len(value) > _MAX_BIAS_ENTRIES:
        raise InvalidField(
            "logit_bias", f"logit_bias must be an object of at most {_MAX_BIAS_ENTRIES} entries"
        )
    pairs = []
    for key, bias in value.items():
        token = int(key) if isinstance(key, str) and key.isdigit() and len(key) < 10 else -1
        if not 0 <= token < vocab_size:
            raise InvalidField("logit_bias", f"logit_bias: {key!r} is not a token id in [0, {vocab_size})")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise InvalidField("logit_bias", f"logit_bias[{key}] must be a number between -100 and 100")
        pairs.append((token, float(bias)))
    return tuple(pairs)


def _logprobs(fields: Mapping[str, object], chat: bool) -> tuple[bool, int]:
    """(report logprobs, alternatives per token): chat's bool + top_logprobs, or completions' int."""
    value = fields.get("logprobs")
    if chat:
        if not isinstance(value, bool | None):
            raise InvalidField("logprobs", "logprobs must be a boolean")
        top = _integer(fields, "top_logprobs", 0, 20) or 0
        if top and not value:
            raise InvalidField("top_logprobs", "top_logprobs needs logprobs: true")
        return bool(value), top
    alternatives = _integer(fields, "logprobs", 0, 20)
    return alternatives is not None, alternatives or 0


def choice_count(fields: Mapping[str, object]) -> tuple[int, int]:
    """(n, best_of): choices returned, and generated (best_of >= n; completions only).

    Raises:
        InvalidField: out of [1, 16], or best_of below n.
    """
    n = _integer(fields, "n", 1, _MAX_CHOICES) or 1
    best_of = _integer(fields, "best_of", 1, _MAX_CHOICES) or n
    if best_of < n:
        raise InvalidField("best_of", "best_of must be at least n")
    if best_of > n and fields.get("stream") is True:
        raise InvalidField("best_of", "best_of cannot be streamed (the best are known at the end)")
    return n, best_of


def sampling_params(
    fields: Mapping[str, object], default_max_tokens: int, vocab_size: int, chat: bool
) -> SamplingParams:
    """The sampling parameters of one choice.

    Raises:
        InvalidField: naming the first field of the wrong type or out of range.
    """
    max_tokens = _integer(fields, "max_completion_tokens", 1, 2**31) if chat else None
    if max_tokens is None:
        max_tokens = _integer(fields, "max_tokens", 1, 2**31) or default_max_tokens
    logprobs, top_logprobs = _logprobs(fields, chat)
    ignore_eos = fields.get("ignore_eos")
    if not isinstance(ignore_eos, bool | None):
        raise InvalidField("ignore_eos", "ignore_eos must be a boolean")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(fields, "temperature", 1.0, 0.0, 2.0),
        top_p=max(_number(fields, "top_p", 1.0, 0.0, 1.0), 1e-6),  # 0: the top token only
        top_k=max(0, _integer(fields, "top_k", -1, vocab_size) or 0),
        seed=_integer(fields, "seed", 0, 2**64 - 1),
        presence_penalty=_number(fields, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(fields, "frequency_penalty", 0.0, -2.0, 2.0),
        stop=_stops(fields.get("stop")),
        logprobs=logprobs,
        ignore_eos=bool(ignore_eos),
        stop_token_ids=_token_ids(fields, "stop_token_ids", vocab_size),
        min_p=_number(fields, "min_p", 0.0, 0.0, 1.0),
        repetition_penalty=_number(fields, "repetition_penalty", 1.0, 0.01, 2.0),
        logit_bias=_logit_bias(fields.get("logit_bias"), vocab_size),
        top_logprobs=top_logprobs,
    )
