"""The batched sampler: every feature has its effect on the rows that ask for it, and a row's
draws do not depend on what its batch companions ask."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ortserve.llm.sampler import SamplingParams, TokenSampler, sample_batch

_VOCAB = 50


def _logits(rows: int, seed: int = 0) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).normal(0, 2, (rows, _VOCAB)).astype(np.float32)


def _log_softmax(row: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    x = row.astype(np.float64)
    shifted: npt.NDArray[np.float64] = x - x.max() - np.log(np.exp(x - x.max()).sum())
    return shifted


def test_logprobs_are_the_log_softmax_of_the_model_logits_whatever_the_sampling() -> None:
    logits = _logits(3)
    params = [
        SamplingParams(temperature=0.0, logprobs=True, top_logprobs=5),
        SamplingParams(temperature=0.7, top_k=3, logprobs=True, top_logprobs=2, seed=1),
        SamplingParams(temperature=1.0),  # asks for none
    ]
    draws = sample_batch([TokenSampler(p) for p in params], logits)
    for row in (0, 1):
        reference = _log_softmax(logits[row])
        assert np.isclose(draws[row].logprob, reference[draws[row].token], atol=1e-5)
        best = np.argsort(-reference)[: params[row].top_logprobs]
        assert [t for t, _ in draws[row].top] == best.tolist()
        assert np.allclose([lp for _, lp in draws[row].top], reference[best], atol=1e-5)
    assert draws[0].token == int(np.argmax(logits[0]))
    assert draws[2].logprob == 0.0 and draws[2].top == ()


def test_a_logit_bias_of_100_makes_its_token_come_out() -> None:
    logits = _logits(2)
    worst = int(np.argmin(logits[0]))
    params = [SamplingParams(temperature=0.0, logit_bias=((worst, 100.0),)),
              SamplingParams(temperature=1.0, seed=5, logit_bias=((worst, 100.0),))]  # fmt: skip
    samplers = [TokenSampler(p) for p in params]
    for _ in range(5):
        assert [d.token for d in sample_batch(samplers, logits[[0, 0]])] == [worst, worst]
    banned = TokenSampler(SamplingParams(temperature=0.0, logit_bias=((int(np.argmax(logits[1])), -100.0),)))
    assert banned.sample(logits[1]).token == int(np.argsort(-logits[1])[1])


def test_a_seeded_row_draws_the_same_alone_or_beside_any_companions() -> None:
    logits = _logits(4, seed=2)
    seeded = SamplingParams(temperature=1.0, seed=42)
    alone = TokenSampler(seeded)
    alone_tokens = [alone.sample(logits[0]).token for _ in range(8)]
    companions = [
        SamplingParams(temperature=0.9, top_k=5, min_p=0.1, seed=1, logit_bias=((3, 5.0),)),
        SamplingParams(temperature=0.0, presence_penalty=1.0, repetition_penalty=1.5, logprobs=True),
        SamplingParams(temperature=1.3, top_p=0.5),
    ]
    batch = [TokenSampler(seeded), *(TokenSampler(p, prompt=[1, 2, 3]) for p in companions)]
    batched_tokens = [sample_batch(batch, logits)[0].token for _ in range(8)]
    assert batched_tokens == alone_tokens


def test_top_k_and_min_p_keep_only_the_likely_tokens() -> None:
    logits = _logits(1, seed=3)[0]
    order = np.argsort(-logits)
    top_two = TokenSampler(SamplingParams(temperature=2.0, top_k=2, seed=0))
    assert {top_two.sample(logits).token for _ in range(60)} <= set(order[:2].tolist())
    only_best = TokenSampler(SamplingParams(temperature=2.0, min_p=1.0, seed=0))
    assert {only_best.sample(logits).token for _ in range(20)} == {int(order[0])}
    free = TokenSampler(SamplingParams(temperature=2.0, seed=0))
    assert len({free.sample(logits).token for _ in range(60)}) > 2


def test_penalties_move_away_from_what_was_seen() -> None:
    logits = np.array([3.0, 2.9, 1.0, -1.0], dtype=np.float32)
    repeated = TokenSampler(SamplingParams(temperature=0.0, repetition_penalty=1.2), prompt=[0])
    assert repeated.sample(logits).token == 1  # 3.0 / 1.2 < 2.9
    present = TokenSampler(SamplingParams(temperature=0.0, presence_penalty=0.5))
    assert [present.sample(logits).token for _ in range(3)] == [0, 1, 0]


class _OnlyOdd:
    def __init__(self) -> None:
        self.chosen: list[int] = []

    def allowed(self, vocab_size: int) -> npt.NDArray[np.bool_]:
        mask: npt.NDArray[np.bool_] = np.arange(vocab_size) % 2 == 1
        return mask

    def advance(self, token: int) -> None:
        self.chosen.append(token)


def test_a_constraint_masks_the_tokens_it_does_not_allow() -> None:
    logits = _logits(2, seed=4)
    constraint = _OnlyOdd()
    samplers = [TokenSampler(SamplingParams(temperature=1.0, seed=3), constraint=constraint),
                TokenSampler(SamplingParams(temperature=0.0))]  # fmt: skip
    for _ in range(10):
        draws = sample_batch(samplers, logits)
        assert draws[0].token % 2 == 1 and draws[1].token == int(np.argmax(logits[1]))
    assert len(constraint.chosen) == 10
