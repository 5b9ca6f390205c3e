"""The choices of OpenAI's answers, several per request (``n``), with their log-probabilities in
the chat shape (``logprobs.content[]`` with ``top_logprobs``) or the legacy completion shape
(``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``): pure functions over text."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from ortserve.protocol.openai_codec import Usage, sse

__all__ = [
    "TokenLogprob",
    "chat_body",
    "chat_chunk",
    "chat_logprobs",
    "completion_body",
    "completion_chunk",
    "completion_logprobs",
]


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's text and log-probability, and the alternatives (text, logprob)."""

    text: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@functools.lru_cache(maxsize=1 << 16)
def _utf8(text: str) -> list[int]:
    """A token's bytes, built once per token text (shared, never changed: only serialised)."""
    return list(text.encode())


def _entry(text: str, logprob: float) -> dict[str, object]:
    return {"token": text, "logprob": logprob, "bytes": _utf8(text)}


def chat_logprobs(tokens: Sequence[TokenLogprob]) -> dict[str, object]:
    """A chat choice's ``logprobs``: ``{"content": [...], "refusal": null}``."""
    content = [
        {**_entry(t.text, t.logprob), "top_logprobs": [_entry(text, lp) for text, lp in t.top]}
        for t in tokens
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(tokens: Sequence[TokenLogprob], offset: int) -> dict[str, object]:
    """A completion choice's legacy ``logprobs``; ``offset``: characters before the first token
    (the echoed prompt)."""
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token.text)
    return {
        "tokens": [t.text for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [dict(t.top) for t in tokens],
        "text_offset": offsets,
    }


def _head(request_id: str, created: int, model: str, kind: str) -> dict[str, object]:
    return {"id": request_id, "object": kind, "created": created, "model": model}


def chat_body(
    request_id: str, created: int, model: str, choices: Sequence[Mapping[str, object]], usage: Usage
) -> bytes:
    """A whole chat completion; each choice has ``index``, ``message``, ``logprobs``, ``finish_reason``."""
    head = _head(request_id, created, model, "chat.completion")
    return orjson.dumps({**head, "choices": choices, "usage": usage.body()})


def completion_body(
    request_id: str, created: int, model: str, choices: Sequence[Mapping[str, object]], usage: Usage
) -> bytes:
    head = _head(request_id, created, model, "text_completion")
    return orjson.dumps({**head, "choices": choices, "usage": usage.body()})


def chat_chunk(
    request_id: str,
    created: int,
    model: str,
    choices: Sequence[Mapping[str, object]],
    usage: Usage | None = None,
) -> bytes:
    """One ``chat.completion.chunk`` event; the usage chunk has no choices."""
    payload = {**_head(request_id, created, model, "chat.completion.chunk"), "choices": choices}
    if usage is not None:
        payload["usage"] = usage.body()
    return sse(payload)


def completion_chunk(
    request_id: str,
    created: int,
    model: str,
    choices: Sequence[Mapping[str, object]],
    usage: Usage | None = None,
) -> bytes:
    payload = {**_head(request_id, created, model, "text_completion"), "choices": choices}
    if usage is not None:
        payload["usage"] = usage.body()
    return sse(payload)
