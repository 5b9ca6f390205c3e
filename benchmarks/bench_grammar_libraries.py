"""The per-token cost of a JSON-schema mask in llguidance, xgrammar and outlines-core, over the
same tokenizer and schema, 16 matchers stepped together as the engine steps its rows.

Per step and row: the allowed tokens as a boolean mask over the vocabulary (each library's own
way: llguidance's bitmask, xgrammar's bitmask into a tensor, outlines-core's allowed-id list),
the mask applied to a row of random logits, the best allowed token chosen and fed back. Compile
time is reported apart (once per schema). Run in an environment holding the three libraries
and ``transformers`` (xgrammar needs PyTorch), with a Hugging Face tokenizer folder:

    python benchmarks/bench_grammar_libraries.py --tokenizer <folder with tokenizer.json> --steps 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 6}},
        "required": ["word"],
        "additionalProperties": False,
    },
    "minItems": 40,
    "maxItems": 40,
}
"""bench_llm_api.py's schema (40 short words, so 64 steps never reach its end), closed to other
keys: xgrammar and outlines-core refuse additional properties by default, llguidance allows them
as JSON Schema does, and the three must constrain the same language to be compared."""

_LLAMA_DECODER = {
    "type": "Sequence",
    "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0},
    ],
}
"""A Metaspace decoder spelled as llguidance reads it (llm/structured.py's)."""

Row = tuple[Callable[[], np.ndarray], Callable[[int], None]]
"""(allowed mask now, feed the chosen token) of one matcher."""


def _llguidance(folder: Path, rows: int, vocab: int, eos: int) -> tuple[float, list[Row]]:
    import llguidance

    spec = json.loads((folder / "tokenizer.json").read_text())
    if isinstance(spec.get("decoder"), dict) and spec["decoder"].get("type") == "Metaspace":
        spec["decoder"] = _LLAMA_DECODER  # as llm/structured.py does: llguidance wants the steps
    started = time.perf_counter()
    tokenizer = llguidance.LLTokenizer(json.dumps(spec), eos_token=[eos])
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(SCHEMA), defaults={"whitespace_flexible": False}
    )
    template = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    compiled = time.perf_counter() - started
    out = []
    for _ in range(rows):
        matcher = template.deep_copy()

        def allowed(m: llguidance.LLMatcher = matcher) -> np.ndarray:
            bits = np.frombuffer(m.compute_bitmask(), dtype=np.uint8)
            return np.unpackbits(bits, bitorder="little")[:vocab].astype(np.bool_)

        out.append((allowed, matcher.consume_token))
    return compiled, out


def _xgrammar(folder: Path, rows: int, vocab: int, eos: int) -> tuple[float, list[Row]]:
    import torch
    import xgrammar
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    started = time.perf_counter()
    spec = json.loads((folder / "tokenizer.json").read_text())
    if isinstance(spec.get("decoder"), dict) and spec["decoder"].get("type") == "Metaspace":
        # from_huggingface takes this tokenizer for a byte-level one (its masks came out empty)
        pieces = [str(hf.convert_ids_to_tokens(token)) for token in range(vocab)]
        info = xgrammar.TokenizerInfo(pieces, xgrammar.VocabType.BYTE_FALLBACK, vocab_size=vocab,
                                      stop_token_ids=[eos], add_prefix_space=True)  # fmt: skip
    else:
        info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=[eos])
    compiled_grammar = xgrammar.GrammarCompiler(info).compile_json_schema(
        json.dumps(SCHEMA), any_whitespace=False
    )
    compiled = time.perf_counter() - started
    out = []
    for _ in range(rows):
        matcher = xgrammar.GrammarMatcher(compiled_grammar)
        bitmask = xgrammar.allocate_token_bitmask(1, vocab)

        def allowed(m: xgrammar.GrammarMatcher = matcher, b: torch.Tensor = bitmask) -> np.ndarray:
            m.fill_next_token_bitmask(b, 0)
            bits = b[0].numpy().view(np.uint8)
            return np.unpackbits(bits, bitorder="little")[:vocab].astype(np.bool_)

        out.append((allowed, matcher.accept_token))
    return compiled, out


def _outlines(folder: Path, rows: int, vocab: int, eos: int) -> tuple[float, list[Row]]:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    started = time.perf_counter()
    pieces: dict[str, list[int]] = {}
    for token in range(vocab):
        if token != eos:
            piece = str(hf.convert_ids_to_tokens(token)).replace("\u2581", " ")  # the text it adds
            pieces.setdefault(piece, []).append(token)
    index = Index(build_regex_from_schema(json.dumps(SCHEMA), r"[\n ]?"), Vocabulary(eos, pieces))
    compiled = time.perf_counter() - started
    out = []
    for _ in range(rows):
        guide = Guide(index)

        def allowed(g: Guide = guide) -> np.ndarray:
            mask = np.zeros(vocab, dtype=np.bool_)
            mask[g.get_tokens()] = True
            return mask

        out.append((allowed, guide.advance))
    return compiled, out


LIBRARIES = {"llguidance": _llguidance, "xgrammar": _xgrammar, "outlines-core": _outlines}


def _step_cost(rows: list[Row], vocab: int, steps: int, seed: int) -> tuple[float, float]:
    """(microseconds per row and step: mask, apply, choose, advance; mean tokens allowed)."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(0, 1, (steps, len(rows), vocab)).astype(np.float32)
    allowed_total = 0
    started = time.perf_counter()
    for step in range(steps):
        for index, (allowed, feed) in enumerate(rows):
            mask = allowed()
            allowed_total += int(mask.sum())
            feed(int(np.argmax(np.where(mask, scores[step, index], -np.inf))))
    elapsed = time.perf_counter() - started
    return elapsed / (steps * len(rows)) * 1e6, allowed_total / (steps * len(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="a folder holding tokenizer.json")
    parser.add_argument("--eos", default="<|endoftext|>")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-o", "--output", type=Path)
    args = parser.parse_args()
    spec = json.loads((args.tokenizer / "tokenizer.json").read_text())
    ids = [*spec["model"]["vocab"].values(), *(t["id"] for t in spec.get("added_tokens", []))]
    vocab = max(ids) + 1
    eos = next(t["id"] for t in spec.get("added_tokens", []) if t["content"] == args.eos)
    report: dict[str, object] = {"vocab": vocab, "rows": args.rows, "steps": args.steps}
    for name, build in LIBRARIES.items():
        try:
            compiles, costs = [], []
            for seed in range(args.rounds):  # libraries interleaved would share caches: one at a time
                compiled, rows = build(args.tokenizer, args.rows, vocab, eos)
                compiles.append(compiled * 1e3)
                cost, allowed = _step_cost(rows, vocab, args.steps, seed)
                costs.append(cost)
            report[name] = {"compile_ms": statistics.median(compiles), "us_per_token": statistics.median(costs),
                            "us_per_token_rounds": costs, "mean_allowed_tokens": allowed}  # fmt: skip
            print(f"{name:14s} compile {statistics.median(compiles):8.2f} ms   mask {statistics.median(costs):8.2f} "
                  f"us/token   {allowed:.1f} tokens allowed per step")  # fmt: skip
        except Exception as exc:  # a library that fails here is a finding, reported
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{name:14s} failed: {type(exc).__name__}: {exc}")
    if args.output:
        args.output.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
