"""Structured output's constraint over the demo's real tokenizer: the mask allows only what the
grammar can continue with, and once it is complete only the end of text remains."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ortserve.errors import InvalidField
from ortserve.llm.demo import DEMO_LLM_NAME, EOS_TOKEN, write_demo_llm
from ortserve.llm.structured import grammar_for, grammars_of
from ortserve.llm.tokenizer import TextTokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    root = tmp_path_factory.mktemp("demo")
    write_demo_llm(root)
    folder = root / DEMO_LLM_NAME / "1"
    return TextTokenizer(folder, json.loads((folder / "tokenizer_config.json").read_text()))


def test_the_mask_spells_the_grammar_and_then_only_the_end(tokenizer: TextTokenizer) -> None:
    eos = tokenizer.token_id(EOS_TOKEN)
    assert eos is not None
    grammar = grammar_for({"type": "regex", "regex": "(yes|no) [0-9]{2}"})
    assert grammar is not None
    constraint = grammars_of(tokenizer, (eos,)).constraint(grammar)()
    text = ""
    for _ in range(20):
        allowed = np.flatnonzero(constraint.allowed(tokenizer.vocab_size + 3))  # a padded lm_head
        assert allowed.size and allowed.max() < tokenizer.vocab_size
        if allowed.tolist() == [eos]:
            break
        token = int(allowed[0]) if eos not in allowed else eos
        assert token != eos or text
        constraint.advance(token)
        text += tokenizer.token_text(token) if token != eos else ""
    assert np.flatnonzero(constraint.allowed(tokenizer.vocab_size)).tolist() == [eos]
    assert text.strip().split(" ")[0] in ("yes", "no")


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": "not a schema"}},
        {"type": "regex"},
        {"type": "xml"},
        "json",
    ],
)
def test_malformed_response_formats_name_the_field(response_format: object) -> None:
    with pytest.raises(InvalidField) as refused:
        grammar_for(response_format)
    assert refused.value.param == "response_format"


def test_text_asks_for_no_grammar() -> None:
    assert grammar_for({"type": "text"}) is None and grammar_for(None) is None
