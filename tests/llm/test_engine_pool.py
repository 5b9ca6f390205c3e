"""The engine on real ONNX Runtime sessions, driven step by step: greedy tokens do not depend on
batch companions, prefill chunking, pool layout, a chunk run with the decode (the step graph)
or preemption; prefixes are shared only within one cache salt."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ortserve.llm.demo import train_tokenizer, write_llm_version
from ortserve.llm.engine import DecoderSession, EngineLimits, GenerationEngine
from ortserve.llm.fusion import step_session
from ortserve.llm.kv_backend import PooledBackend
from ortserve.llm.layout import check_graph, read_llm_files
from ortserve.llm.prefix_cache import PrefixCache
from ortserve.llm.sampler import SamplingParams
from ortserve.llm.sequence import GenerationEvent, Sequence
from ortserve.llm.tokenizer import TextTokenizer
from ortserve.llm.weights import DecoderShape, random_weights

_CONTEXT = 256


def _write(folder: Path, layout: str) -> Path:
    tokenizer = train_tokenizer(["the quick brown fox jumps over the lazy dog " * 4], 96)
    shape = DecoderShape(tokenizer.get_vocab_size(), 64, 2, 4, 2, 96, 10000.0, 1e-5, _CONTEXT)
    write_llm_version(folder, random_weights(shape, seed=3), tokenizer, layout=layout)
    return folder


@dataclass(frozen=True)
class _Model:
    folder: Path
    fused: bool
    """Steps run the decode and the first prompt chunk as one run of the step graph."""


@pytest.fixture(scope="module", params=["genai", "genai-fused", "optimum"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> _Model:
    layout = request.param.split("-")[0]
    return _Model(_write(tmp_path_factory.mktemp(request.param), layout), request.param.endswith("fused"))


class _Harness:
    def __init__(self, model: _Model, limits: EngineLimits, cache_bytes: int = 0) -> None:
        folder = model.folder
        files = read_llm_files(folder)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1

        def build(graph: bytes) -> ort.InferenceSession:
            return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])

        session = build((folder / "model.onnx").read_bytes())

        def signature(args: list[ort.NodeArg]) -> dict[str, tuple[str, list[object]]]:
            return {a.name: (a.type, list(a.shape)) for a in args}

        layout = check_graph(files, signature(session.get_inputs()), signature(session.get_outputs()))
        self.tokenizer = TextTokenizer(folder, files.tokenizer_config)
        self.vocab = files.vocab_size
        self.events: list[tuple[Sequence, GenerationEvent]] = []
        cache = PrefixCache(cache_bytes, 600.0, lambda: 0.0, 4)
        decoder = DecoderSession(session, layout)
        if model.fused:
            decoder.fused = step_session(decoder, (folder / "model.onnx").read_bytes(), files.config, build)
            assert decoder.fused is not None
        self.engine = GenerationEngine(decoder, limits, cache, self.events.extend)
        self.engine.tune(0.001, 0.0001)

    def sequence(self, prompt: list[int], max_tokens: int, salt: str = "", top: int = 0) -> Sequence:
        params = SamplingParams(
            max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=top > 0, top_logprobs=top
        )
        sequence = Sequence(prompt, params, self.tokenizer, (), _CONTEXT)
        sequence.cache_salt = salt
        return sequence

    def run(self, arrivals: list[tuple[int, Sequence]]) -> None:
        """Submit each sequence at its step and step until all are finished."""
        pending = sorted(arrivals, key=lambda pair: pair[0])
        for step in range(10_000):
            while pending and pending[0][0] <= step:
                self.engine.submit(pending.pop(0)[1])
            if not pending and all(s.finish_reason is not None for _, s in arrivals):
                return
            self.engine.step()
        raise AssertionError("the engine did not finish")


def _limits(chunk: int, pool_bytes: int = 1 << 26) -> EngineLimits:
    return EngineLimits(
        max_num_seqs=16, max_waiting=64, max_context_len=_CONTEXT, prefill_chunk_tokens=chunk,
        max_itl_ms=60_000.0, kv_pool_bytes=pool_bytes,
    )  # fmt: skip


_requests = st.lists(
    st.tuples(st.integers(1, 60), st.integers(1, 24), st.integers(0, 12), st.integers(0, 2**31)),
    min_size=2,
    max_size=8,
)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=_requests, chunk=st.sampled_from([3, 8, 17, 4096]))
def test_greedy_tokens_are_the_same_alone_and_with_any_companions_and_chunking(
    model: _Model, requests: list[tuple[int, int, int, int]], chunk: int
) -> None:
    alone = _Harness(model, _limits(4096))
    together = _Harness(model, _limits(chunk))
    singles, arrivals = [], []
    for prompt_len, max_tokens, step, seed in requests:
        prompt = [int(t) for t in np.random.default_rng(seed).integers(3, alone.vocab, prompt_len)]
        single = alone.sequence(prompt, max_tokens, top=2)
        alone.run([(0, single)])
        singles.append(single)
        arrivals.append((step, together.sequence(prompt, max_tokens)))
    together.run(arrivals)
    tops = _top_logprobs(alone.events)
    for single, (_, batched) in zip(singles, arrivals):
        assert len(batched.output) == len(single.output) == single.params.max_tokens
        _same_but_for_a_tie(single.output, batched.output, tops[id(single)])


def _top_logprobs(
    events: list[tuple[Sequence, GenerationEvent]],
) -> dict[int, list[tuple[tuple[int, float], ...]]]:
    """Each sequence's two most likely tokens and their log-probabilities, token by token."""
    tops: dict[int, list[tuple[tuple[int, float], ...]]] = {}
    for sequence, event in events:
        tops.setdefault(id(sequence), []).extend(event.top_logprobs)
    return tops


def _same_but_for_a_tie(
    alone: list[int], batched: list[int], tops: list[tuple[tuple[int, float], ...]]
) -> None:
    """Greedy outputs are equal up to where the alone run's top two tokens tie within float error
    (a sum in another order may then pick the other one: a tie, not a wrong token); the rest
    follows from another token, so it is not compared."""
    for k, (a, b) in enumerate(zip(alone, batched)):
        if a != b:
            (first, p1), (second, p2) = tops[k]
            assert {a, b} == {first, second} and abs(p1 - p2) < 1e-4, (k, alone, batched, tops[k])
            return


def test_preempted_sequences_resume_with_identical_greedy_output(model: _Model) -> None:
    rng = np.random.default_rng(5)
    alone = _Harness(model, _limits(4096))
    prompts = [[int(t) for t in rng.integers(3, alone.vocab, int(n))] for n in rng.integers(20, 60, 8)]
    expected = []
    for prompt in prompts:
        single = alone.sequence(prompt, 40)
        alone.run([(0, single)])
        expected.append(single.output)
    # Room for about three rows of 128 tokens: eight sequences must take turns.
    token_bytes = 2 * 2 * 2 * 16 * 4
    tight = _Harness(model, _limits(16, pool_bytes=4 * 128 * token_bytes))
    arrivals = [(0, tight.sequence(p, 40)) for p in prompts]
    tight.run(arrivals)
    assert [s.output for _, s in arrivals] == expected
    if isinstance(tight.engine.backend, PooledBackend):
        assert tight.engine.preemptions > 0
    assert (tight.engine.riding_steps > 0) == model.fused
    assert not tight.engine.backend.decoding() and tight.engine.backend.nbytes == 0


def test_a_cached_prefix_is_reported_only_within_the_same_salt(model: _Model) -> None:
    harness = _Harness(model, _limits(4096), cache_bytes=1 << 24)
    secret = [int(t) for t in np.random.default_rng(9).integers(3, harness.vocab, 48)]
    owner = harness.sequence([*secret, 5], 4, salt="tenant-a")
    harness.run([(0, owner)])
    probe_other = harness.sequence([*secret, 7], 4, salt="tenant-b")
    harness.run([(0, probe_other)])
    probe_unsalted = harness.sequence([*secret, 7], 4)
    harness.run([(0, probe_unsalted)])
    same = harness.sequence([*secret, 7], 4, salt="tenant-a")
    harness.run([(0, same)])
    assert probe_other.cached_tokens == 0 and probe_unsalted.cached_tokens == 0
    assert same.cached_tokens >= 44
    alone = _Harness(model, _limits(4096))
    reference = alone.sequence([*secret, 7], 4)
    alone.run([(0, reference)])
    assert same.output == reference.output == probe_other.output


def test_prompts_read_from_the_prefix_cache_while_others_decode_say_what_they_say_alone(
    model: _Model,
) -> None:
    """Later prompts sharing a cached prefix start from it while the first still decodes (with
    the step graph, their chunks ride with its decode)."""
    rng = np.random.default_rng(13)
    harness = _Harness(model, _limits(16), cache_bytes=1 << 24)
    shared = [int(t) for t in rng.integers(3, harness.vocab, 40)]
    first = harness.sequence([*shared, 5], 30)
    later = [harness.sequence([*shared, 7 + i, 9], 10) for i in range(3)]
    harness.run([(0, first), *((4 + 3 * i, s) for i, s in enumerate(later))])
    alone = _Harness(model, _limits(4096))
    for sequence in (first, *later):
        reference = alone.sequence(sequence.prompt, len(sequence.output))
        alone.run([(0, reference)])
        assert sequence.output == reference.output
    assert all(s.cached_tokens >= 32 for s in later)
    assert (harness.engine.riding_steps > 0) == model.fused
