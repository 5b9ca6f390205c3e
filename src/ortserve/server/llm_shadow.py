"""Shadow generations: a sampled copy of an LLM request also runs on the policy's shadow
version, and the two answers are compared once both are done.

The copy takes the primary's prompt, sampling parameters and cache salt (a seeded or greedy
request is comparable token for token), costs the shadow version's engine a place in its
queue (refused or over ``max_inflight``: dropped and counted, never waited for), and never
changes the primary's answer. Agreement lands in the router's divergence book under output
``text``: ``top1_agreement`` is the fraction of pairs whose texts are equal, ``topk_agreement``
the mean fraction of token positions that agree, ``max_abs_diff`` one minus the latter.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from ortserve.errors import ModelNotFound, ModelNotReady, OrtServeError, Overloaded
from ortserve.llm.servable import GenerationStream, LlmVersion
from ortserve.routing.compare import OutputDivergence
from ortserve.routing.router import ModelRouter
from ortserve.server.deferred import attempt, settle

__all__ = ["TEXT_OUTPUT", "mirror_generation", "token_agreement"]

TEXT_OUTPUT = "text"
"""The output name LLM shadow comparisons are recorded under."""


def token_agreement(primary: list[int], shadow: list[int]) -> float:
    """The fraction of positions (of the longer answer) where both chose the same token."""
    longest = max(len(primary), len(shadow))
    if longest == 0:
        return 1.0
    return sum(a == b for a, b in zip(primary, shadow, strict=False)) / longest


def mirror_generation(
    router: ModelRouter,
    routed: asyncio.Future[Any],
    primary: LlmVersion,
    stream: GenerationStream,
) -> None:
    """Maybe run a copy of ``stream``'s request on the shadow version; compare once both ended.

    ``routed`` settles when the primary request finishes (cancelled: the client left, and
    the copy is withdrawn).
    """
    config = router.policy.config.shadow
    version = primary.info.version
    if config is None or config.version == version or router.env.draw() >= config.fraction:
        return
    lane = router.shadow
    if lane.inflight >= config.max_inflight:
        lane.dropped["full"] += 1
        return
    try:
        served = router.env.resolver.resolve(router.name, config.version)
    except (ModelNotFound, ModelNotReady):
        served = None
    if not isinstance(served, LlmVersion):
        lane.dropped["refused"] += 1
        return
    sequence = stream.sequence
    copy = attempt(served.generate, sequence.prompt, sequence.params, sequence.cache_salt)
    if isinstance(copy, Exception):  # refused by the shadow version: dropped, and counted
        lane.dropped["full" if isinstance(copy, Overloaded) else "refused"] += 1
        if not isinstance(copy, OrtServeError):
            settle(copy)  # a bug: logged once
        return
    lane.sent[config.version] += 1
    lane.inflight += 1
    shadow = asyncio.ensure_future(copy.collect())
    compare = functools.partial(_compare, router, primary, served, stream, copy)
    routed.add_done_callback(functools.partial(_primary_done, shadow, compare))


def _primary_done(shadow: asyncio.Future[Any], compare: Any, routed: asyncio.Future[Any]) -> None:
    if routed.cancelled() or routed.exception() is not None:
        shadow.cancel()  # nothing to compare with; the copy's sequence is cancelled
    shadow.add_done_callback(compare)


def _compare(
    router: ModelRouter,
    primary: LlmVersion,
    served: LlmVersion,
    stream: GenerationStream,
    copy: GenerationStream,
    shadow: asyncio.Future[Any],
) -> None:
    lane = router.shadow
    lane.inflight -= 1
    if shadow.cancelled() or shadow.exception() is not None:
        lane.dropped["failed"] += 1
        return
    ours, theirs = stream.sequence.output, copy.sequence.output
    agreement = token_agreement(ours, theirs)
    same_text = primary.tokenizer.decode(ours) == served.tokenizer.decode(theirs)
    found = OutputDivergence(TEXT_OUTPUT, 1.0 - agreement, 1.0 - agreement, float(same_text), agreement, 1)
    router.book.add(primary.info.version, served.info.version, [found])
    lane.compared[served.info.version] += 1
