"""Choosing the next token of every row of a decode step: greedy, temperature, top-k, top-p,
min-p, logit bias, penalties, token constraints, and the log-probabilities a request reports.

Batched: one NumPy pass per step for all the rows that need a feature, nothing for the rows
that do not, so a request's parameters cost its batch companions nothing beyond their own share.
Each request owns its random generator (seeded when the request gives a seed), so its tokens do
not depend on which other requests share its batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from ortserve.errors import InvalidInput

__all__ = ["Draw", "SamplingParams", "TokenConstraint", "TokenSampler", "sample_batch"]

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
    guide: Callable[[], TokenConstraint] | None = field(default=None, compare=False)
    """Makes each choice's constraint (structured output); None: free text."""

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


class TokenConstraint(Protocol):
    """What structured output plugs into a request's sampler: the tokens allowed next."""

    def allowed(self, vocab_size: int) -> npt.NDArray[np.bool_]:
        """A mask over the vocabulary of the tokens that may come next."""
        ...

    def advance(self, token: int) -> None:
        """``token`` was chosen."""
        ...


class Draw(NamedTuple):
    """One row's choice: the token, its log-probability under the model's own distribution
    (log-softmax of the raw logits, as OpenAI and vLLM report it; 0.0 unless asked for) and the
    most likely alternatives (token, log-probability), best first."""

    token: int
    logprob: float = 0.0
    top: tuple[tuple[int, float], ...] = ()


class TokenSampler:
    """One request's sampling state: its generator, the counts the penalties need, its bias and
    its constraint. ``sample_batch`` reads many of them at once."""

    __slots__ = ("_counts", "_rng", "_seen", "constraint", "params")

    def __init__(
        self, params: SamplingParams, prompt: Sequence[int] = (), constraint: TokenConstraint | None = None
    ) -> None:
        self.params = params
        self.constraint = constraint if constraint is not None or params.guide is None else params.guide()
        self._rng = np.random.default_rng(params.seed)
        self._counts: dict[int, int] = {}
        self._seen: set[int] = set(prompt) if params.repetition_penalty != 1.0 else set()

    def sample(self, logits: F32) -> Draw:
        """The next token from one row of logits (prefill; decode steps use ``sample_batch``)."""
        return sample_batch([self], logits[None, :])[0]

    def _chose(self, token: int) -> None:
        self._counts[token] = self._counts.get(token, 0) + 1
        if self.params.repetition_penalty != 1.0:
            self._seen.add(token)
        if self.constraint is not None:
            self.constraint.advance(token)

    @property
    def penalised(self) -> bool:
        p = self.params
        return bool(self._counts) and (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0)


I64 = npt.NDArray[np.int64]


def _apply_bias(samplers: Sequence[TokenSampler], scores: F32) -> None:
    rows, ids, values = [], [], []
    for index, sampler in enumerate(samplers):
        for token, bias in sampler.params.logit_bias:
            rows.append(index)
            ids.append(token)
            values.append(bias)
    if rows:
        scores[np.array(rows), np.array(ids)] += np.array(values, dtype=np.float32)


def _apply_penalties(samplers: Sequence[TokenSampler], scores: F32) -> None:
    """presence/frequency (OpenAI: subtract per output count) and repetition (vLLM: divide a
    positive logit, multiply a negative one, for every token of the prompt or the output)."""
    rows: list[I64] = []
    ids: list[I64] = []
    amounts: list[npt.NDArray[np.float64]] = []
    for index, sampler in enumerate(samplers):
        if sampler.penalised:
            p = sampler.params
            tokens = np.fromiter(sampler._counts.keys(), dtype=np.int64, count=len(sampler._counts))
            counts = np.fromiter(sampler._counts.values(), dtype=np.float64, count=len(sampler._counts))
            rows.append(np.full(tokens.size, index))
            ids.append(tokens)
            amounts.append(p.presence_penalty + p.frequency_penalty * counts)
    if rows:
        r, t = np.concatenate(rows), np.concatenate(ids)
        scores[r, t] -= np.concatenate(amounts).astype(np.float32)
    rows, ids, factors = [], [], []
    for index, sampler in enumerate(samplers):
        if sampler._seen:
            tokens = np.fromiter(sampler._seen, dtype=np.int64, count=len(sampler._seen))
            rows.append(np.full(tokens.size, index))
            ids.append(tokens)
            factors.append(np.full(tokens.size, sampler.params.repetition_penalty))
    if rows:
        r, t, f = np.concatenate(rows), np.concatenate(ids), np.concatenate(factors).astype(np.float32)
        values = scores[r, t]
        scores[r, t] = np.where(values > 0, values / f, values * f)


def _apply_constraints(samplers: Sequence[TokenSampler], scores: F32) -> None:
    vocab = scores.shape[1]
    for index, sampler in enumerate(samplers):
        if sampler.constraint is not None:
            allowed = sampler.constraint.allowed(vocab)
            scores[index, ~allowed] = -np.inf


def _draw(samplers: Sequence[TokenSampler], scores: F32) -> I64:
    """Temperature, top-k, top-p and min-p for the sampled rows (``scores``: theirs, one per
    sampler, a copy), then one draw per row from its own generator (inverse CDF over the kept
    probabilities). Sorting and min-p touch only the rows that ask for them."""
    params = [s.params for s in samplers]
    temperature = np.array([p.temperature for p in params], dtype=np.float32)[:, None]
    logits = scores / temperature
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    vocab = probs.shape[1]
    cut = np.array([0 < p.top_k < vocab or p.top_p < 1.0 for p in params])
    if cut.any():
        sub = probs[cut]
        ordered = -np.sort(-sub, axis=1)
        top_k = np.array([p.top_k if 0 < p.top_k < vocab else vocab for p in params])[cut]
        top_p = np.array([p.top_p for p in params])[cut]
        cumulative = np.cumsum(ordered, axis=1) / ordered.sum(axis=1, keepdims=True)
        keep = np.minimum((cumulative < top_p[:, None]).sum(axis=1) + 1, top_k)
        threshold = ordered[np.arange(sub.shape[0]), keep - 1]
        probs[cut] = np.where(sub >= threshold[:, None], sub, 0.0)
    min_p = np.array([p.min_p for p in params], dtype=np.float32)
    floor = min_p > 0
    if floor.any():
        sub = probs[floor]
        probs[floor] = np.where(sub >= min_p[floor, None] * sub.max(axis=1, keepdims=True), sub, 0.0)
    cumulative = np.cumsum(probs, axis=1, dtype=np.float64)
    uniform = np.array([s._rng.random() for s in samplers]) * cumulative[:, -1]
    chosen: I64 = np.minimum((cumulative < uniform[:, None]).sum(axis=1), vocab - 1)
    return chosen


def _logprobs(samplers: Sequence[TokenSampler], logits: F32, tokens: I64) -> list[Draw]:
    chosen_tokens: list[int] = tokens.tolist()
    draws = [Draw(t) for t in chosen_tokens]
    rows = [i for i, s in enumerate(samplers) if s.params.logprobs]
    if not rows:
        return draws
    raw = logits[rows]  # float32, as vLLM reports them: half the work of float64, ~1e-6 apart
    top = raw.max(axis=1, keepdims=True)
    normal = top + np.log(np.exp(raw - top).sum(axis=1, keepdims=True))
    chosen = (np.take_along_axis(raw, tokens[rows][:, None], axis=1) - normal)[:, 0].tolist()
    wanted = min(max(samplers[i].params.top_logprobs for i in rows), raw.shape[1])
    best: list[list[int]] = [[] for _ in rows]
    values: list[list[float]] = [[] for _ in rows]
    if wanted:
        candidates = np.argpartition(-raw, wanted - 1, axis=1)[:, :wanted]
        order = np.argsort(-np.take_along_axis(raw, candidates, axis=1), axis=1, kind="stable")
        ranked = np.take_along_axis(candidates, order, axis=1)
        best, values = ranked.tolist(), (np.take_along_axis(raw, ranked, axis=1) - normal).tolist()
    for j, i in enumerate(rows):  # plain lists from here: NumPy scalars cost per element
        k = samplers[i].params.top_logprobs
        draws[i] = Draw(chosen_tokens[i], chosen[j], tuple(zip(best[j][:k], values[j][:k], strict=True)))
    return draws


def _processed(samplers: Sequence[TokenSampler], logits: F32) -> tuple[list[int], F32 | None]:
    """The rows whose logits a bias, a penalty or a constraint changes, and their changed copy
    (the other rows are read in place: one request's features copy nothing of the others')."""
    touched = [
        i
        for i, s in enumerate(samplers)
        if s.params.logit_bias or s.penalised or s._seen or s.constraint is not None
    ]
    if not touched:
        return touched, None
    group = [samplers[i] for i in touched]
    scores: F32 = logits[touched].astype(np.float32)  # a copy: the raw logits stay for the logprobs
    _apply_bias(group, scores)
    _apply_penalties(group, scores)
    _apply_constraints(group, scores)
    return touched, scores


def sample_batch(samplers: Sequence[TokenSampler], logits: F32) -> list[Draw]:
    """The next token of every row of ``logits`` [rows, vocab], row i for ``samplers[i]``."""
    touched, processed = _processed(samplers, logits)
    tokens = np.argmax(logits, axis=1)
    if processed is not None:
        tokens[touched] = np.argmax(processed, axis=1)
    sampled = [i for i, s in enumerate(samplers) if s.params.temperature > 0.0]
    if sampled:
        scores = logits[sampled]  # a copy of the sampled rows (their own work)
        if processed is not None:
            changed = {row: j for j, row in enumerate(touched)}
            for k, row in enumerate(sampled):
                if row in changed:
                    scores[k] = processed[changed[row]]
        tokens[sampled] = _draw([samplers[i] for i in sampled], scores)
    draws = _logprobs(samplers, logits, tokens)
    for sampler, draw in zip(samplers, draws, strict=True):
        sampler._chose(draw.token)
    return draws
