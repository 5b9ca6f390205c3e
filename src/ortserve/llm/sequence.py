"""One generation request as the engine sees it: its tokens, sampler, text and stop rules."""

from __future__ import annotations

import threading
from collections.abc import Sequence as Tokens
from dataclasses import dataclass, field

from ortserve.llm.sampler import F32, Draw, SamplingParams, TokenConstraint, TokenSampler
from ortserve.llm.tokenizer import Detokenizer, TextTokenizer

__all__ = ["GenerationEvent", "Sequence"]


@dataclass(slots=True)
class GenerationEvent:
    """What one step produced for one sequence: new text (stop strings held back), the new
    tokens and their log-probabilities, and the finish reason once it is over."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    """Per token, when asked for: the most likely alternatives (token, log-probability)."""
    finish_reason: str | None = None
    """"stop" (EOS or a stop string), "length" (max_tokens or the context), "abort", "error"."""
    error: str | None = None


class Sequence:
    """A request being generated; written by the engine thread, except ``cancel``.

    Args:
        prompt: the prompt's token ids.
        params: sampling and stopping.
        tokenizer: for incremental detokenization.
        eos_ids: tokens that end generation (unless ``params.ignore_eos``).
        max_context_len: prompt plus output tokens at most.
        constraint: the tokens allowed at each step (structured output), if any.
    """

    def __init__(
        self,
        prompt: Tokens[int],
        params: SamplingParams,
        tokenizer: TextTokenizer,
        eos_ids: tuple[int, ...],
        max_context_len: int,
        constraint: TokenConstraint | None = None,
    ) -> None:
        self.prompt = list(prompt)
        self.params = params
        self.output: list[int] = []
        self.cached_tokens = 0
        self.finish_reason: str | None = None
        self.priority = 0
        """Higher waits less (as for classic models)."""
        self.deadline: float | None = None
        """Engine-clock time by which the first token must come, else refused or dropped."""
        self.cache_salt = ""
        """Prefixes are shared only between sequences of the same salt (tenant, API key)."""
        self.kv_tokens = 0
        """Tokens whose keys and values the engine holds for this sequence (prefill progress)."""
        self.preempted = 0
        self.admitted_at = 0.0
        """Engine-clock time it last entered the running set (how long its prefill has taken)."""
        """Times its keys and values were given up for others; it resumes where it was."""
        self.forks: list[Sequence] = []
        """The request's other choices (``n``): when this one's prefill ends the engine starts
        them from a copy of its keys and values and its logits, with no prefill of their own."""
        self.sampler = TokenSampler(params, self.prompt, constraint)
        """Its sampling state, read by ``sample_batch`` for the whole batch at once."""
        self._detokenizer = Detokenizer(tokenizer, self.prompt)
        self._stop_ids = frozenset(params.stop_token_ids) | (
            frozenset() if params.ignore_eos else frozenset(eos_ids)
        )
        self._max_context = max_context_len
        self._text = ""
        self._sent = 0
        self._cancelled = threading.Event()
        self.pending = GenerationEvent()

    def cancel(self) -> None:
        """The client went away: the engine drops the sequence at its next step (any thread)."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def length(self) -> int:
        """Tokens whose keys and values the model has (or will have after this step)."""
        return len(self.prompt) + len(self.output)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def prefill_target(self) -> int:
        """The tokens its prefill reads: the prompt, or, resumed after a pause, all but the
        last token (sampled already; the next decode step reads it)."""
        return len(self.prompt) if not self.output else self.length - 1

    @property
    def last_token(self) -> int:
        return self.output[-1]

    def accept(self, logits: F32) -> None:
        """Sample the next token from ``logits`` and apply the stop rules."""
        self.accept_draw(self.sampler.sample(logits))

    def accept_draw(self, draw: Draw) -> None:
        """Take the token sampled for this sequence (``sample_batch``) and apply the stop rules."""
        token = draw.token
        if token in self._stop_ids:
            self._finish("stop")
            return
        self.output.append(token)
        self.pending.token_ids.append(token)
        if self.params.logprobs:
            self.pending.logprobs.append(draw.logprob)
            self.pending.top_logprobs.append(draw.top)
        self._text += self._detokenizer.add(token)
        if self.params.stop and self._cut_at_stop():
            self._finish("stop")
            return
        if len(self.output) >= self.params.max_tokens or self.length >= self._max_context:
            self._finish("length")
            return
        self._release(self._safe_end())

    def abort(self, reason: str = "abort", error: str | None = None) -> None:
        self.pending.error = error
        self._finish(reason)

    def take_event(self) -> GenerationEvent | None:
        """The event accumulated since the last call, if it says anything."""
        event = self.pending
        if not event.text and not event.token_ids and event.finish_reason is None:
            return None
        self.pending = GenerationEvent()
        return event

    def _cut_at_stop(self) -> bool:
        longest = max(len(s) for s in self.params.stop)
        start = max(0, self._sent - longest)
        found = [i for s in self.params.stop if (i := self._text.find(s, start)) >= 0]
        if not found:
            return False
        self._text = self._text[: min(found)]
        return True

    def _safe_end(self) -> int:
        """How much text can be sent: not a tail that may still grow into a stop string."""
        end = len(self._text)
        for stop in self.params.stop:
            for size in range(min(len(stop) - 1, end), 0, -1):
                if self._text.endswith(stop[:size]):
                    end = min(end, len(self._text) - size)
                    break
        return end

    def _release(self, end: int) -> None:
        if end > self._sent:
            self.pending.text += self._text[self._sent : end]
            self._sent = end

    def _finish(self, reason: str) -> None:
        self._release(len(self._text))
        self.finish_reason = reason
        self.pending.finish_reason = reason

    @property
    def text(self) -> str:
        return self._text
