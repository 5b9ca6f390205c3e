"""Structured output: ``response_format`` (json_object, json_schema, and the regex and Lark
grammar extensions) turned into a token constraint over the model's real tokenizer, with
llguidance (its Earley parser and token trie compute the allowed tokens per step, ~tens of
microseconds on small vocabularies).

Chosen over xgrammar and outlines-core because it installs as one small wheel with no torch,
builds a matcher in milliseconds (no ahead-of-time index per schema) and reads HF
``tokenizer.json`` directly. The grammar is compiled once per request (a bad schema is a 400
before anything runs); every choice gets its own matcher.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ortserve.errors import InvalidField
from ortserve.llm.sampler import TokenConstraint
from ortserve.llm.tokenizer import TextTokenizer

if TYPE_CHECKING:
    import llguidance

__all__ = ["Grammars", "GuidedTokens", "grammar_for", "grammars_of"]

_MAX_SCHEMA_BYTES = 64 * 1024
# A Metaspace decoder (sentencepiece-style BPE trained by ``tokenizers``) reads as Llama's.
_LLAMA_DECODER = {
    "type": "Sequence",
    "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0},
    ],
}


def grammar_for(response_format: object) -> str | None:
    """The llguidance grammar a ``response_format`` asks for (None: free text).

    Raises:
        InvalidField: naming ``response_format`` (unknown type, missing schema, too large).
    """
    if response_format is None:
        return None
    if not isinstance(response_format, dict) or not isinstance(response_format.get("type"), str):
        raise InvalidField("response_format", "response_format must be an object with a type")
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return _from_schema({"type": "object"})
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise InvalidField("response_format", "response_format.json_schema needs a name and a schema")
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise InvalidField("response_format", "response_format.json_schema.schema must be an object")
        return _from_schema(schema)
    import llguidance

    if kind == "regex" and isinstance(response_format.get("regex"), str):
        return _checked(llguidance.LLMatcher.grammar_from_regex(response_format["regex"]))
    if kind == "grammar" and isinstance(response_format.get("grammar"), str):
        return _checked(llguidance.LLMatcher.grammar_from_lark(response_format["grammar"]))
    raise InvalidField(
        "response_format",
        'response_format.type must be "text", "json_object", "json_schema", "regex" (with regex) '
        'or "grammar" (with a Lark grammar)',
    )


def _from_schema(schema: Mapping[str, object]) -> str:
    import llguidance

    text = json.dumps(schema)
    if len(text) > _MAX_SCHEMA_BYTES:
        raise InvalidField("response_format", f"the schema is over {_MAX_SCHEMA_BYTES} bytes")
    try:
        # no free whitespace: a small model would spend its max_tokens on spaces between items
        grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults={"whitespace_flexible": False})
    except ValueError as exc:
        raise InvalidField("response_format", f"response_format: the schema is not supported: {exc}") from exc
    return _checked(grammar)


def _checked(grammar: str) -> str:
    import llguidance

    message = llguidance.LLMatcher.validate_grammar(grammar)
    if message and not message.startswith("WARNING"):
        raise InvalidField("response_format", f"response_format: {message}")
    return grammar


class GuidedTokens(TokenConstraint):
    """One choice's constraint: an llguidance matcher fed the tokens chosen."""

    __slots__ = ("_end", "_matcher", "_vocab")

    def __init__(self, matcher: llguidance.LLMatcher, vocab: int, end: list[int]) -> None:
        self._matcher = matcher
        self._vocab = vocab
        self._end = [t for t in end if 0 <= t < vocab]

    def allowed(self, vocab_size: int) -> npt.NDArray[np.bool_]:
        mask = np.zeros(vocab_size, dtype=np.bool_)
        if not self._matcher.is_stopped():
            bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
            known = min(vocab_size, self._vocab)
            mask[:known] = np.unpackbits(bits, bitorder="little")[:known].astype(np.bool_)
        if not mask.any():  # done (ignore_eos goes on), or an error state: only the end remains
            mask[[t for t in self._end if t < vocab_size] or slice(None)] = True
        return mask

    def advance(self, token: int) -> None:
        self._matcher.consume_token(token)


class Grammars:
    """A version's grammar machinery: its llguidance tokenizer, built on first use.

    Args:
        tokenizer: the version's tokenizer.
        eos_ids: the tokens that end generation (allowed once the grammar is complete).
    """

    def __init__(self, tokenizer: TextTokenizer, eos_ids: tuple[int, ...]) -> None:
        self._tokenizer = tokenizer
        self._eos = list(eos_ids)
        self._built: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        import llguidance

        with self._lock:
            if self._built is None:
                spec = json.loads(self._tokenizer.to_json())
                if isinstance(spec.get("decoder"), dict) and spec["decoder"].get("type") == "Metaspace":
                    spec["decoder"] = _LLAMA_DECODER
                self._built = llguidance.LLTokenizer(json.dumps(spec), eos_token=self._eos or None)
            return self._built

    def constraint(self, grammar: str) -> Callable[[], TokenConstraint]:
        """A factory of fresh constraints (one per choice) for a checked grammar.

        Raises:
            InvalidField: the grammar does not compile against this tokenizer.
        """
        import llguidance

        tokenizer = self._llg_tokenizer()
        template = llguidance.LLMatcher(tokenizer, grammar, log_level=0)  # llguidance's default limits
        if template.is_error():
            raise InvalidField("response_format", f"response_format: {template.get_error()}")
        vocab = tokenizer.vocab_size
        return lambda: GuidedTokens(template.deep_copy(), vocab, self._eos)


_BY_TOKENIZER: weakref.WeakKeyDictionary[TextTokenizer, Grammars] = weakref.WeakKeyDictionary()
_BY_TOKENIZER_LOCK = threading.Lock()


def grammars_of(tokenizer: TextTokenizer, eos_ids: tuple[int, ...]) -> Grammars:
    """The grammar machinery of a version's tokenizer (one per tokenizer, dropped with it)."""
    with _BY_TOKENIZER_LOCK:
        grammars = _BY_TOKENIZER.get(tokenizer)
        if grammars is None:
            grammars = _BY_TOKENIZER[tokenizer] = Grammars(tokenizer, eos_ids)
        return grammars
