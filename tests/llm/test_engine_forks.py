"""``n`` choices as one request (``Sequence.forks``, ``LlmVersion.generate_choices``), on real ONNX
Runtime sessions in both KV layouts: the prompt is prefilled once, the other choices start from a
copy of its keys and values and sample exactly as single requests would; a choice with no place
waits and prefills itself; choices whose first one ends before its prefill end with it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from ortserve.llm.demo import train_tokenizer, write_llm_version
from ortserve.llm.engine import DecoderSession, EngineLimits, GenerationEngine
from ortserve.llm.layout import check_graph, read_llm_files
from ortserve.llm.prefix_cache import PrefixCache
from ortserve.llm.sampler import F32, SamplingParams
from ortserve.llm.sequence import GenerationEvent, Sequence
from ortserve.llm.servable import LlmVersion, llm_info
from ortserve.llm.tokenizer import TextTokenizer
from ortserve.llm.weights import DecoderShape, random_weights

_CONTEXT = 256


@pytest.fixture(scope="module", params=["genai", "optimum"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp(request.param)
    tokenizer = train_tokenizer(["the quick brown fox jumps over the lazy dog " * 4], 96)
    shape = DecoderShape(tokenizer.get_vocab_size(), 64, 2, 4, 2, 96, 10000.0, 1e-5, _CONTEXT)
    write_llm_version(folder, random_weights(shape, seed=3), tokenizer, layout=request.param)
    return folder


class _Engine:
    """An engine over the model, stepped by hand, counting the prompt tokens it prefills."""

    def __init__(self, folder: Path, max_num_seqs: int = 16, sink: object = None) -> None:
        files = read_llm_files(folder)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(
            str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )

        def signature(args: list[ort.NodeArg]) -> dict[str, tuple[str, list[object]]]:
            return {a.name: (a.type, list(a.shape)) for a in args}

        layout = check_graph(files, signature(session.get_inputs()), signature(session.get_outputs()))
        self.tokenizer = TextTokenizer(folder, files.tokenizer_config)
        self.vocab = files.vocab_size
        self.events: list[tuple[Sequence, GenerationEvent]] = []
        limits = EngineLimits(
            max_num_seqs=max_num_seqs,
            max_context_len=_CONTEXT,
            max_itl_ms=60_000.0,
            prefill_chunk_tokens=4096,
        )
        cache = PrefixCache(0, 600.0, lambda: 0.0, 4)  # no prefix cache: only a fork shares a prompt
        self.engine = GenerationEngine(
            DecoderSession(session, layout),
            limits,
            cache,
            sink or self.events.extend,  # type: ignore[arg-type]
        )
        self.engine.tune(0.001, 0.0001)
        self.prefilled = 0
        prefill = self.engine.backend.prefill

        def counting(sequence: Sequence, start: int, stop: int, prefix: list[F32] | None) -> F32:
            self.prefilled += stop - start
            return prefill(sequence, start, stop, prefix)

        self.engine.backend.prefill = counting  # type: ignore[method-assign]

    def sequence(
        self, prompt: list[int], max_tokens: int, temperature: float = 0.0, seed: int | None = None
    ) -> Sequence:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, ignore_eos=True)
        return Sequence(prompt, params, self.tokenizer, (), _CONTEXT)

    def run(self, *sequences: Sequence) -> None:
        everyone = [*sequences, *(f for s in sequences for f in s.forks)]
        for sequence in sequences:
            self.engine.submit(sequence)
        for _ in range(10_000):
            if all(s.finish_reason is not None for s in everyone):
                return
            self.engine.step()
        raise AssertionError("the engine did not finish")


def _prompt(vocab: int, seed: int, length: int = 40) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, vocab, length)]


def test_forked_choices_prefill_once_and_sample_as_single_requests(model: Path) -> None:
    alone = _Engine(model)
    prompt = _prompt(alone.vocab, 1)
    singles = [alone.sequence(prompt, 12, temperature=1.0, seed=70 + i) for i in range(4)]
    for single in singles:
        alone.run(single)
    assert alone.prefilled == 4 * len(prompt)

    forked = _Engine(model)
    first, *others = (forked.sequence(prompt, 12, temperature=1.0, seed=70 + i) for i in range(4))
    first.forks = others
    forked.run(first)
    assert forked.prefilled == len(prompt)  # one prefill for the four choices
    assert [s.output for s in [first, *others]] == [s.output for s in singles]
    assert len({tuple(s.output) for s in singles}) > 1  # the seeds differ: so do the choices
    assert not forked.engine.backend.decoding() and forked.engine.backend.nbytes == 0


def test_a_choice_with_no_place_waits_and_prefills_itself(model: Path) -> None:
    alone = _Engine(model)
    prompt = _prompt(alone.vocab, 2)
    reference = alone.sequence(prompt, 10)
    alone.run(reference)
    tight = _Engine(model, max_num_seqs=2)
    first, *others = (tight.sequence(prompt, 10) for _ in range(3))
    first.forks = others
    tight.run(first)
    assert [s.output for s in [first, *others]] == [reference.output] * 3
    assert tight.prefilled == 2 * len(prompt)  # the third choice had no place: its own prefill


def test_choices_end_with_a_first_one_cancelled_before_its_prefill(model: Path) -> None:
    async def scenario() -> list[GenerationEvent]:
        loop = asyncio.get_running_loop()
        holder: list[LlmVersion] = []
        harness = _Engine(model, sink=lambda events: holder[0].sink(events))
        llm = LlmVersion(llm_info("m", "1", ()), harness.engine, harness.tokenizer, (), _CONTEXT, 8, loop)
        holder.append(llm)
        params = [SamplingParams(max_tokens=8, temperature=0.0) for _ in range(3)]
        streams = llm.generate_choices(_prompt(harness.vocab, 3), params)
        assert [s.sequence for s in streams[1:]] == streams[0].sequence.forks
        streams[0].sequence.cancel()  # the client left before the first step
        harness.engine.step()
        return [await asyncio.wait_for(s.collect(), 5) for s in streams]

    ends = asyncio.run(scenario())
    assert [e.finish_reason for e in ends] == ["abort"] * 3 and not any(e.token_ids for e in ends)
