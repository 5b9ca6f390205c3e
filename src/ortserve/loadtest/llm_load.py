"""Load for text generation: streaming ``/v1/completions`` requests over keep-alive HTTP/1.1,
timing the first token, every later chunk and the end; closed loop at given concurrencies.

Prompts are token ids (OpenAI's completions accept them), so a prompt has exactly the length
asked for whatever the tokenizer; ``ignore_eos`` makes every answer ``max_tokens`` long.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np
import orjson

__all__ = ["LlmLevel", "LlmRequestSpec", "StreamTrace", "run_llm_level", "stream_completion"]


@dataclass(frozen=True, slots=True)
class LlmRequestSpec:
    """What every request asks for."""

    model: str
    prompt_tokens: int = 128
    max_tokens: int = 128
    vocab_low: int = 3
    vocab_high: int = 256
    seed: int = 0
    """Seeds the prompts, mixed with the concurrency: every level sends prompts of its own, so a
    level never replays an earlier one's into the server's prefix cache (runs that repeat a level
    on one server must vary the seed)."""


@dataclass(slots=True)
class StreamTrace:
    """One request: when it started, its chunks' arrival times, tokens generated, outcome."""

    started: float
    first: float | None = None
    chunks: list[float] = field(default_factory=list)
    output_tokens: int = 0
    cached_tokens: int = 0
    status: int = 0
    ended: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.first is not None


class _Connection:
    """One keep-alive connection reading chunked server-sent events."""

    def __init__(self, host: str, port: int) -> None:
        self._host, self._port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        return self._reader, self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def post_stream(self, path: str, body: bytes, trace: StreamTrace) -> None:
        reader, writer = await self._open()
        head = f"POST {path} HTTP/1.1\r\nhost: {self._host}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)
        status_line = await reader.readline()
        trace.status = int(status_line.split()[1])
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding") != "chunked":
            await reader.readexactly(int(headers.get("content-length", "0")))
            return
        buffer = b""
        while True:
            size = int((await reader.readline()).strip(), 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            buffer += data[:-2]
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                self._event(event, trace)

    @staticmethod
    def _event(event: bytes, trace: StreamTrace) -> None:
        if not event.startswith(b"data: ") or event == b"data: [DONE]":
            return
        now = time.perf_counter()
        payload = orjson.loads(event[6:])
        usage = payload.get("usage")
        if usage:
            trace.output_tokens = int(usage.get("completion_tokens", 0))
            trace.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
        for choice in payload.get("choices") or ():
            # One chunk per step (its text may be empty: a token that completes no character).
            if choice.get("text") or choice.get("finish_reason") is None:
                if trace.first is None:
                    trace.first = now
                trace.chunks.append(now)


def _body(spec: LlmRequestSpec, prompt: list[int]) -> bytes:
    return orjson.dumps(
        {
            "model": spec.model,
            "prompt": prompt,
            "max_tokens": spec.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )


async def stream_completion(url: str, spec: LlmRequestSpec, prompt: list[int]) -> StreamTrace:
    """One streamed completion on a connection of its own (follow-up turns, probes)."""
    parts = urlsplit(url)
    connection = _Connection(parts.hostname or "127.0.0.1", parts.port or 80)
    trace = StreamTrace(time.perf_counter())
    try:
        await connection.post_stream("/v1/completions", _body(spec, prompt), trace)
    finally:
        connection.close()
    trace.ended = time.perf_counter()
    return trace


@dataclass(slots=True)
class LlmLevel:
    """The figures of one concurrency level."""

    concurrency: int
    seconds: float
    requests: int
    failures: int
    output_tokens: int
    ttft_s: dict[str, float]
    itl_s: dict[str, float]
    e2e_s: dict[str, float]

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "seconds": self.seconds,
            "requests": self.requests,
            "failures": self.failures,
            "output_tokens": self.output_tokens,
            "output_tokens_per_s": self.tokens_per_s,
            "requests_per_s": self.requests_per_s,
            "ttft_s": self.ttft_s,
            "itl_s": self.itl_s,
            "e2e_s": self.e2e_s,
        }


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    array = np.asarray(values)
    return {
        "mean": float(array.mean()),
        **{f"p{q}": float(np.percentile(array, q)) for q in (50, 90, 99)},
    }


async def run_llm_level(
    url: str, spec: LlmRequestSpec, concurrency: int, duration_s: float, warmup_s: float
) -> LlmLevel:
    """``concurrency`` clients send one streamed request after another; counts what finishes
    within ``duration_s`` after ``warmup_s``."""
    parts = urlsplit(url)
    rng = random.Random(spec.seed * 1_000_003 + concurrency)
    traces: list[StreamTrace] = []
    start = time.perf_counter() + warmup_s
    stop = start + duration_s

    async def client() -> None:
        connection = _Connection(parts.hostname or "127.0.0.1", parts.port or 80)
        try:
            while time.perf_counter() < stop:
                prompt = [rng.randrange(spec.vocab_low, spec.vocab_high) for _ in range(spec.prompt_tokens)]
                trace = StreamTrace(time.perf_counter())
                try:
                    await connection.post_stream("/v1/completions", _body(spec, prompt), trace)
                except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                    connection.close()
                    trace.status = 0
                trace.ended = time.perf_counter()
                traces.append(trace)
        finally:
            connection.close()

    await asyncio.gather(*(client() for _ in range(concurrency)))
    # Tokens are counted as they arrive inside the window (requests straddle its edges); a
    # chunk carries one step's text, scaled by the tokens per chunk the usage reports.
    done = [t for t in traces if t.ok]
    chunks = sum(len(t.chunks) for t in done)
    per_chunk = sum(t.output_tokens for t in done) / chunks if chunks else 1.0
    in_window = sum(1 for t in done for c in t.chunks if start <= c <= stop)
    # Every request that started during warm-up or measurement: at high concurrency one
    # request outlasts the window, and the first wave's TTFT is the figure of interest.
    measured = [t for t in traces if start - warmup_s <= t.started <= stop]
    ok = [t for t in measured if t.ok]
    gaps = [b - a for t in done for a, b in zip(t.chunks, t.chunks[1:]) if start <= b <= stop]
    return LlmLevel(
        concurrency,
        duration_s,
        sum(1 for t in done if start <= t.ended <= stop),
        len(measured) - len(ok),
        round(in_window * per_chunk),
        _percentiles([t.first - t.started for t in ok if t.first is not None]),
        _percentiles(gaps),
        _percentiles([t.ended - t.started for t in ok]),
    )
