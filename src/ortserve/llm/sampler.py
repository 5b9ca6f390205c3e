"""Choosing the next token from one row of logits: greedy, temperature, top-k, top-p, penalties.

Each request owns its random generator (seeded when the request gives a seed), so its tokens do
not depend on which other requests share its batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ortserve.errors import InvalidInput

__all__ = ["SamplingParams", "TokenSampler"]

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What a request asks of generation (OpenAI's names and ranges)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0: no top-k cut."""
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = field(default=())
    min_p: float = 0.0
    """0: off; else tokens below ``min_p`` times the top token's probability are cut."""
    repetition_penalty: float = 1.0
    """1: off; else the logits of tokens seen (prompt or output) are divided (positive) or
    multiplied (negative) by it, as in vLLM and transformers."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias added to its logit) pairs."""
    top_logprobs: int = 0
    """Alternatives reported per token (with ``logprobs``)."""

    def check(self) -> None:
        """Raise InvalidInput for a value outside OpenAI's ranges."""
        if self.max_tokens < 1:
            raise InvalidInput("max_tokens must be at least 1")
        if not 0.0 <= self.temperature <= 2.0:
            raise InvalidInput("temperature must be between 0 and 2")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidInput("top_p must be greater than 0 and at most 1")
        if self.top_k < 0:
            raise InvalidInput("top_k must be 0 (off) or positive")
        for name, value in (
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ):
            if not -2.0 <= value <= 2.0:
                raise InvalidInput(f"{name} must be between -2 and 2")
        if len(self.stop) > 4 or any(not s for s in self.stop):
            raise InvalidInput("stop takes at most 4 non-empty strings")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise InvalidInput("seed must be between 0 and 2^64 - 1")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidInput("min_p must be between 0 and 1")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise InvalidInput("repetition_penalty must be greater than 0 and at most 2")
        if any(not -100.0 <= bias <= 100.0 for _, bias in self.logit_bias):
            raise InvalidInput("logit_bias values must be between -100 and 100")
        if not 0 <= self.top_logprobs <= 20:
            raise InvalidInput("top_logprobs must be between 0 and 20")


class TokenSampler:
    """Samples one request's tokens; keeps its generator and the counts the penalties need."""

    __slots__ = ("_counts", "_params", "_rng")

    def __init__(self, params: SamplingParams) -> None:
        self._params = params
        self._rng = np.random.default_rng(params.seed)
        self._counts: dict[int, int] = {}

    def sample(self, logits: F32) -> tuple[int, float]:
        """The next token and its log-probability under the distribution it was drawn from."""
        p = self._params
        scores = logits.astype(np.float64)
        if self._counts and (p.presence_penalty or p.frequency_penalty):
            ids = np.fromiter(self._counts.keys(), dtype=np.int64)
            counts = np.fromiter(self._counts.values(), dtype=np.float64)
            scores[ids] -= p.presence_penalty + p.frequency_penalty * counts
        if p.temperature == 0.0:
            token = int(np.argmax(scores))
            logprob = float(scores[token] - _logsumexp(scores)) if p.logprobs else 0.0
        else:
            token, logprob = self._draw(scores / p.temperature)
        self._counts[token] = self._counts.get(token, 0) + 1
        return token, logprob

    def _draw(self, scores: npt.NDArray[np.float64]) -> tuple[int, float]:
        p = self._params
        candidates = np.arange(scores.size)
        if 0 < p.top_k < scores.size:
            candidates = np.argpartition(-scores, p.top_k - 1)[: p.top_k]
        chosen = scores[candidates]
        order = np.argsort(-chosen, kind="stable")
        candidates, chosen = candidates[order], chosen[order]
        probs = np.exp(chosen - chosen[0])
        probs /= probs.sum()
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
            candidates, probs = candidates[:keep], probs[:keep] / probs[:keep].sum()
        index = int(self._rng.choice(probs.size, p=probs))
        return int(candidates[index]), float(np.log(probs[index]))


def _logsumexp(scores: npt.NDArray[np.float64]) -> float:
    top = float(scores.max())
    return top + float(np.log(np.exp(scores - top).sum()))
