"""``ortserve replay`` of captured generation requests (OpenAI chat and completions, streamed or
not): each is sent again on its recorded schedule (scaled by ``speed``), and the report is the
generation one: time to first token, inter-token latency, end to end, tokens per second.

A streamed request's chunks are timed as they arrive; a plain JSON answer has its first token
when the whole answer does.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

from ortserve.capture_records import CapturedRequest
from ortserve.loadtest.llm_load import LlmLevel, StreamTrace, _Connection, _percentiles

__all__ = ["GENERATION_PATHS", "is_generation", "replay_generation"]

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")


def is_generation(record: CapturedRequest) -> bool:
    """A captured OpenAI generation request (replayed with a TTFT/ITL report)."""
    return record.path in GENERATION_PATHS


async def _send(url: str, record: CapturedRequest, delay_s: float, timeout_s: float) -> StreamTrace:
    await asyncio.sleep(delay_s)
    parts = urlsplit(url)
    connection = _Connection(parts.hostname or "127.0.0.1", parts.port or 80)
    trace = StreamTrace(time.perf_counter())
    try:
        await asyncio.wait_for(connection.post_stream(record.path, record.body, trace), timeout_s)
    except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
        trace.status = 0
    finally:
        connection.close()
    trace.ended = time.perf_counter()
    if trace.status == 200 and trace.first is None:  # a JSON answer: its first token came with it
        trace.first = trace.ended
    return trace


async def replay_generation(
    records: list[CapturedRequest], url: str, speed: float = 1.0, timeout_s: float = 300.0
) -> LlmLevel:
    """Send every record at ``(arrival - first arrival) / speed`` and measure the generations.

    The level's ``concurrency`` is the most requests that were in flight at once.
    """
    first = records[0].arrival
    started = time.perf_counter()
    traces = await asyncio.gather(*(_send(url, r, (r.arrival - first) / speed, timeout_s) for r in records))
    seconds = time.perf_counter() - started
    good = [t for t in traces if t.ok]
    itl = [b - a for t in good for a, b in zip(t.chunks, t.chunks[1:], strict=False)]
    return LlmLevel(
        concurrency=_most_in_flight(traces),
        seconds=seconds,
        requests=len(good),
        failures=len(traces) - len(good),
        output_tokens=sum(t.output_tokens or len(t.chunks) for t in good),
        ttft_s=_percentiles([t.first - t.started for t in good if t.first is not None]),
        itl_s=_percentiles(itl),
        e2e_s=_percentiles([t.ended - t.started for t in good]),
    )


def _most_in_flight(traces: list[StreamTrace]) -> int:
    events = sorted([(t.started, 1) for t in traces] + [(t.ended, -1) for t in traces])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most
