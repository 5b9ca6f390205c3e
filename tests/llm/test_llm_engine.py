"""The generation engine on the demo decoder: continuous batching gives every request the tokens
it gets alone, seeds reproduce, prefix-cache hits change nothing but the work, bounds hold."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ortserve.config.model import ModelConfig
from ortserve.errors import InvalidInput, Overloaded
from ortserve.llm.demo import DEMO_LLM_NAME, corpus_documents, write_demo_llm
from ortserve.llm.engine import GIL_SWITCH_S, EngineLimits, GenerationEngine
from ortserve.llm.loader import load_llm_version
from ortserve.llm.prefix_cache import PrefixCache
from ortserve.llm.sampler import SamplingParams, TokenSampler
from ortserve.llm.sequence import Sequence
from ortserve.llm.servable import LlmVersion, sampling_from
from ortserve.llm.tokenizer import Detokenizer, TextTokenizer
from ortserve.settings import ServerSettings


@pytest.fixture(scope="module")
def demo_llm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("llm")
    write_demo_llm(root)
    return root / DEMO_LLM_NAME / "1" / "model.onnx"


async def _load(model: Path, **llm: object) -> LlmVersion:
    config = ModelConfig.model_validate(
        {"kind": "llm", "intra_op_threads": 1, "llm": {"max_num_seqs": 16, **llm}}
    )
    return await load_llm_version("tiny", 1, model, config, ServerSettings(model_repository=model.parent))


@pytest.fixture
async def llm(demo_llm: Path) -> AsyncIterator[LlmVersion]:
    served = await _load(demo_llm)
    yield served
    await served.unload(1.0)


def _prompts() -> list[str]:
    """16 prompts of different lengths: corpus openings, cut at different words, and others."""
    documents = corpus_documents()
    prompts = [" ".join(doc.split()[: 2 + 3 * i]) for i, doc in enumerate(documents)]
    prompts += ["Hello there", "The", "A conversation", "ships at sea", "The river", "seven"]
    return prompts[:16]


async def _generate(llm: LlmVersion, prompt: str, **fields: object) -> tuple[list[int], str, str | None]:
    stream = llm.generate(llm.tokenizer.encode(prompt), sampling_from({"max_tokens": 24, **fields}, 16))
    result = await stream.collect()
    return result.token_ids, result.text, result.finish_reason


async def test_greedy_tokens_are_the_same_alone_and_in_a_batch_of_16(llm: LlmVersion) -> None:
    prompts = _prompts()
    assert len({len(llm.tokenizer.encode(p)) for p in prompts}) >= 8
    alone = [await _generate(llm, p, temperature=0) for p in prompts]
    steps_before = llm.engine.steps
    together = await asyncio.gather(*(_generate(llm, p, temperature=0) for p in prompts))
    assert together == alone
    # They really ran together: far fewer steps than one request after another.
    assert llm.engine.steps - steps_before < sum(len(t) for t, _, _ in alone) / 2
    assert any(reason == "stop" for _, _, reason in alone) and any(r == "length" for _, _, r in alone)


async def test_a_seed_reproduces_the_sample_alone_and_in_a_batch(llm: LlmVersion) -> None:
    prompt = "The keeper kept"
    alone = await _generate(llm, prompt, temperature=1.0, seed=7)
    others = [_generate(llm, p, temperature=1.0) for p in _prompts()[:6]]
    together = await asyncio.gather(_generate(llm, prompt, temperature=1.0, seed=7), *others)
    assert together[0] == alone
    draws = {tuple((await _generate(llm, prompt, temperature=1.5, seed=s))[0]) for s in range(6)}
    assert len(draws) > 1


async def test_a_prefix_cache_hit_gives_the_same_tokens_as_a_miss(demo_llm: Path) -> None:
    history = corpus_documents()[4] + " " + corpus_documents()[5]
    cached = await _load(demo_llm, kv_cache_bytes=64 << 20, prefix_block_tokens=8)
    uncached = await _load(demo_llm, kv_cache_bytes=0)
    try:
        first = llm_stream = cached.generate(
            cached.tokenizer.encode(history), SamplingParams(max_tokens=12, temperature=0)
        )
        first_result = await llm_stream.collect()
        assert first.cached_tokens == 0
        follow_up = history + first_result.text + " The"
        hit = cached.generate(
            cached.tokenizer.encode(follow_up), SamplingParams(max_tokens=12, temperature=0)
        )
        miss = uncached.generate(
            uncached.tokenizer.encode(follow_up), SamplingParams(max_tokens=12, temperature=0)
        )
        hit_result, miss_result = await hit.collect(), await miss.collect()
        assert hit.cached_tokens >= len(cached.tokenizer.encode(history)) - 8
        assert miss.cached_tokens == 0
        assert hit_result.token_ids == miss_result.token_ids
        assert cached.engine.cache.hit_ratio > 0
    finally:
        await cached.unload(1.0)
        await uncached.unload(1.0)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _kv(length: int) -> list[npt.NDArray[np.float32]]:
    return [np.full((2, length, 4), float(length), dtype=np.float32) for _ in range(2)]


def test_cached_prefixes_expire_after_their_ttl() -> None:
    clock = _Clock()
    cache = PrefixCache(1 << 20, ttl_s=60.0, clock=clock, block_tokens=4)
    tokens = list(range(12))
    cache.store(tokens, _kv(12))
    clock.now += 59.0
    hit = cache.lookup([*tokens, 99])
    assert hit is not None and hit.length == 12 and hit.kv[0].shape == (1, 2, 12, 4)
    clock.now += 59.0  # the lookup renewed it
    assert cache.lookup(tokens[:9]) is not None and cache.lookup(tokens[:9]).length == 8  # type: ignore[union-attr]
    clock.now += 61.0
    assert cache.lookup([*tokens, 99]) is None and len(cache) == 0 and cache.bytes_used == 0


def test_the_prefix_cache_keeps_its_byte_budget_least_recently_used_first() -> None:
    clock = _Clock()
    one = sum(part.nbytes for part in _kv(8))
    cache = PrefixCache(2 * one, ttl_s=1e9, clock=clock, block_tokens=4)
    a, b, c = [1] * 8, [2] * 8, [3] * 8
    cache.store(a, _kv(8))
    cache.store(b, _kv(8))
    assert cache.lookup([*a, 0]) is not None  # a is now the most recently used
    cache.store(c, _kv(8))
    assert cache.bytes_used <= 2 * one
    assert (
        cache.lookup([*b, 0]) is None
        and cache.lookup([*a, 0]) is not None
        and cache.lookup([*c, 0]) is not None
    )
    assert cache.lookup([1, 1, 1, 2, 0]) is None  # a different prefix within the first block


async def test_the_waiting_queue_is_bounded(llm: LlmVersion) -> None:
    engine = GenerationEngine(
        llm.engine.decoder, EngineLimits(1, 2, 64), PrefixCache(0, 1, _Clock()), lambda _: None
    )

    def sequence() -> Sequence:
        return Sequence([1, 2], SamplingParams(), llm.tokenizer, (), 64)

    engine.submit(sequence())
    engine.submit(sequence())  # never started: both wait
    with pytest.raises(Overloaded) as refused:
        engine.submit(sequence())
    assert refused.value.retry_after_s >= 1


async def test_prompts_beyond_the_context_and_bad_parameters_are_refused(llm: LlmVersion) -> None:
    with pytest.raises(InvalidInput, match="context"):
        llm.generate([5] * llm.max_context_len, SamplingParams())
    for fields in ({"temperature": 3}, {"top_p": 0}, {"max_tokens": 0}, {"stop": 5}, {"seed": "x"}):
        with pytest.raises(InvalidInput):
            sampling_from(fields, 16)


def test_top_k_one_is_greedy_and_penalties_move_away_from_repeats() -> None:
    logits = np.array([1.0, 3.0, 2.9, -1.0], dtype=np.float32)
    sampler = TokenSampler(SamplingParams(temperature=1.0, top_k=1, seed=3))
    assert [sampler.sample(logits)[0] for _ in range(5)] == [1] * 5
    penalised = TokenSampler(SamplingParams(temperature=0.0, frequency_penalty=1.0))
    assert [penalised.sample(logits)[0] for _ in range(2)] == [1, 2]
    nucleus = TokenSampler(SamplingParams(temperature=1.0, top_p=0.05, seed=1))
    assert {nucleus.sample(logits)[0] for _ in range(20)} == {1}


def test_detokenized_stream_never_splits_a_character(tmp_path: Path) -> None:
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=260, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    raw.train_from_iterator(["plain words only"], trainer)
    raw.save(str(tmp_path / "tokenizer.json"))
    tokenizer = TextTokenizer(tmp_path, {})
    text = "Grüße aus 東京 🌊 café"
    ids = tokenizer.encode(text)
    assert len(ids) > len(text)  # multi-byte characters span several tokens
    detokenizer = Detokenizer(tokenizer)
    pieces = [detokenizer.add(token) for token in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_stop_strings_are_cut_and_held_back_while_they_may_still_match(llm: LlmVersion) -> None:
    tokenizer = llm.tokenizer
    target = tokenizer.encode("the lamp and listened to the sea", special=False)
    sequence = Sequence(
        [1], SamplingParams(max_tokens=50, temperature=0, stop=("listened to",)), tokenizer, (), 512
    )
    sent = []
    for token in target:
        logits = np.full(tokenizer.vocab_size, -10.0, dtype=np.float32)
        logits[token] = 10.0
        sequence.accept(logits)
        event = sequence.take_event()
        assert event is not None
        sent.append(event.text)
        if sequence.finish_reason is not None:
            break
    assert sequence.finish_reason == "stop"
    assert "".join(sent).strip() == "the lamp and"


async def test_a_running_engine_hands_the_gil_back_within_a_millisecond(demo_llm: Path) -> None:
    """The decode thread takes the GIL back after every model call; at the interpreter's 5 ms
    default a busy event loop stretched each hand-over (issue 35's served ITL tail)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        served = await _load(demo_llm)
        try:
            assert sys.getswitchinterval() <= GIL_SWITCH_S
            sys.setswitchinterval(0.0002)  # already shorter: left as the process set it
            other = GenerationEngine(
                served.engine.decoder, EngineLimits(1, 2, 64), PrefixCache(0, 1, _Clock()), lambda _: None
            )
            other.start("other")
            other.close()
            other.join(5.0)
            assert sys.getswitchinterval() == pytest.approx(0.0002)
        finally:
            await served.unload(1.0)
    finally:
        sys.setswitchinterval(before)
