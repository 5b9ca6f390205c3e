"""How much prompt prefill one engine step carries beside its decode, and what a chunk costs.

A step's length is every running stream's inter-token gap, so the prefill it carries is bounded
by the latency target ``max_itl``. Within that bound two aims pull apart: the gap's spread (a
step with a chunk against one without: ITL p99 / p50) and the prompts' time to first token (the
share of the core prefill gets). The room follows the prompts' need:

- **calm** (no prompt has been waiting beyond what its own prefill takes at the calm pace):
  a step that prefills is at most ``1 + prefill_share`` decode steps of the width the running
  set is heading for, so the slow steps stay within a small multiple of the plain ones;
- **behind** (the oldest prompt has waited longer than that): all the slack between the
  target and the decode step, so the queue of prompts drains at the fastest pace the streams'
  target allows. A fixed share of 1.5 held prefill to 60% of the core however long the
  prompts had waited, and the closed loop's TTFT p99 rose from 1.72 s to 2.14 s on the fake
  clock (RESULTS.md); the slack alone gives it back while no step exceeds the target.

A chunk's cost is fitted as ``fixed + per_token · tokens`` (:class:`ChunkCost`): each chunk
reads all the weights once whatever its length, so a step that prefills two prompts pays that
twice. Priced per token at the average, a step with two chunks overran the target by the
second chunk's fixed part (ITL p99 154 ms against a 145 ms target).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["ChunkCost", "prefill_room"]

F64 = npt.NDArray[np.float64]


class ChunkCost:
    """Seconds of one prefill chunk ~ ``fixed + per_token · tokens`` (decayed least squares).

    Args:
        fixed_s: the part paid once per chunk (the prior; about a one-row decode step).
        token_s: the part paid per prompt token (the prior).
        decay: weight kept by old observations at each new one.
    """

    def __init__(self, fixed_s: float, token_s: float, decay: float = 0.98) -> None:
        self.decay = decay
        prior = np.array([max(fixed_s, 0.0), max(token_s, 1e-7)])
        # The prior weighs as a twentieth of a chunk: chunks of one length cannot separate the two parts,
        # and the fit then keeps the prior's split while it follows their total.
        self._ridge = np.diag([0.05, 0.05 * 64.0**2])
        self._anchor = self._ridge @ prior
        self._gram = np.zeros((2, 2))
        self._moment = np.zeros(2)
        self.coef: F64 = prior

    @property
    def fixed_s(self) -> float:
        return float(self.coef[0])

    @property
    def token_s(self) -> float:
        return float(self.coef[1])

    def observe(self, tokens: int, seconds: float) -> None:
        x = np.array([1.0, float(tokens)])
        self._gram = self.decay * self._gram + np.outer(x, x)
        self._moment = self.decay * self._moment + x * seconds
        coef = np.linalg.solve(self._gram + self._ridge, self._moment + self._anchor)
        if coef[0] < 0.0:  # a noisy core can fit a negative fixed part; a chunk is never free
            coef = np.array([0.0, max(self._moment[1] + self._anchor[1], 0.0)])
            coef[1] /= self._gram[1, 1] + self._ridge[1, 1]
        self.coef = np.array([coef[0], max(coef[1], 1e-7)])

    def seconds(self, tokens: int) -> float:
        return self.fixed_s + self.token_s * tokens if tokens > 0 else 0.0

    def tokens_within(self, seconds: float) -> int:
        """Prompt tokens one chunk can prefill in ``seconds`` (0 when not even its fixed part)."""
        return max(0, int((seconds - self.fixed_s) / self.token_s))


def prefill_room(plain_s: float, heading_s: float, decode_s: float, target_s: float, share: float) -> float:
    """Seconds of prefill a step may carry beside its decode: at most ``1 + share`` decode
    steps of the width the running set is heading for, and no step beyond the target.

    Args:
        plain_s: the predicted decode step of the rows decoding now.
        heading_s: the predicted decode step once the prefilling rows have joined.
        decode_s: the decode step just run. The step is bounded by ``target_s`` on it; the
            share is priced on the prediction, so a decode stretched by a neighbour on a
            shared core does not stretch the prefill after it.
        target_s: the streams' inter-token latency target.
        share: the prefill allowed, in decode steps of ``heading_s`` (the calm share, or the
            larger one when a prompt is behind).
    """
    return max(min((1.0 + share) * heading_s - plain_s, target_s - decode_s), 0.0)
