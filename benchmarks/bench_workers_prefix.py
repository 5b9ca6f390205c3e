"""Follow-up turns with ``--workers 2``: does the next turn find its history, and what does the
forward to the worker holding it cost?

The 30.6M decoder of bench_llm.py (seed 0, one ONNX Runtime thread per worker), served by
``ortserve serve --workers 2`` on CPUs 0-1 (the machine has two; this client shares them, but
sends one request at a time). Each conversation: a first turn of a 512-token history (nothing
cached anywhere), then the history plus 16 new tokens; every turn on a new connection, so the
kernel picks the worker. Then each follow-up is repeated ``--repeats`` times on new
connections: the answers relayed from the other worker (``x-ortserve-prefix-worker``) against
those answered where they landed give the forward's cost, on TTFT and on the inter-token
latency of a streamed answer (``--tokens`` tokens). ``--workers 1`` is run too, as the
reference of a follow-up with no worker to choose. First, the forward's CPU cost in one
process: the router relaying a holder's 128-event stream over a Unix socket, against asking
the holder directly, for answers of 1 and 128 events (``--hop-only``: that alone).

Usage: ``python benchmarks/bench_workers_prefix.py [--conversations 8] [--repeats 6]``;
writes benchmarks/out/workers_prefix.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).parent))
from bench_llm import build_model
from machine import stamp as machine_stamp

from ortserve.testing import ServerProcess, run_server

OUT = Path(__file__).parent / "out"
MODEL = "llm30m"


@dataclass(slots=True)
class Turn:
    ttft_s: float
    itl_s: list[float] = field(default_factory=list)
    cached_tokens: int = 0
    forwarded: bool = False


async def turn(server: ServerProcess, prompt: list[int], tokens: int) -> Turn:
    """One streamed completion on a new connection."""
    body = orjson.dumps(
        {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection(server.host, server.http_port)
    try:
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        status = int((await reader.readline()).split()[1])
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        assert status == 200, status
        arrivals: list[float] = []
        cached = 0
        buffer = b""
        while size := int((await reader.readline()).strip(), 16):
            buffer += (await reader.readexactly(size + 2))[:-2]
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if not event.startswith(b"data: {"):
                    continue
                data = orjson.loads(event[6:])
                if data.get("usage"):
                    cached = int(data["usage"]["prompt_tokens_details"]["cached_tokens"])
                if data["choices"] and data["choices"][0].get("text"):
                    arrivals.append(time.perf_counter())
    finally:
        writer.close()
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return Turn(arrivals[0] - started, gaps, cached, b"x-ortserve-prefix-worker" in headers)


async def conversations(
    server: ServerProcess, count: int, repeats: int, tokens: int, seed: int
) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    firsts, follow_ups, repeated = [], [], []
    for _ in range(count):
        history = [int(t) for t in rng.integers(3, 256, 512)]
        firsts.append(await turn(server, history, 16))
        follow_up = history + [int(t) for t in rng.integers(3, 256, 16)]
        follow_ups.append(await turn(server, follow_up, 16))
        for _ in range(repeats):
            repeated.append(await turn(server, follow_up, tokens))
    forwarded = [t for t in repeated if t.forwarded]
    local = [t for t in repeated if not t.forwarded]

    def med(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    return {
        "first_ttft_ms": [round(t.ttft_s * 1e3, 1) for t in firsts],
        "follow_up_ttft_ms": [round(t.ttft_s * 1e3, 1) for t in follow_ups],
        "follow_up_cached_tokens": [t.cached_tokens for t in follow_ups],
        "follow_up_forwarded": [t.forwarded for t in follow_ups],
        "ratio_of_medians": med([t.ttft_s for t in follow_ups]) / med([t.ttft_s for t in firsts]),  # type: ignore[operator]
        "repeats": {
            "forwarded": len(forwarded),
            "local": len(local),
            "all_cached": all(t.cached_tokens >= 512 for t in repeated),
            "ttft_ms_forwarded": _ms(med([t.ttft_s for t in forwarded])),
            "ttft_ms_local": _ms(med([t.ttft_s for t in local])),
            "itl_ms_forwarded": _ms(med([g for t in forwarded for g in t.itl_s])),
            "itl_ms_local": _ms(med([g for t in local for g in t.itl_s])),
        },
    }


async def hop_cost(requests: int, tokens: int) -> dict[str, float]:
    """The forward's own cost, in one process: a router (worker 0) relays ``requests`` streamed
    answers of ``tokens`` SSE events from a holder (worker 1) on a Unix socket, against the
    same holder asked directly; microseconds per request and per relayed event."""
    from ortserve.server.http.messages import HttpRequest, HttpResponse
    from ortserve.supervisor.prefix_route import PrefixDirectory, PrefixRouter, prefix_hashes

    folder = Path(tempfile.mkdtemp())
    body = orjson.dumps({"model": MODEL, "prompt": list(range(3, 515)), "stream": True})
    event = b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" the"}]}\n\n'

    async def holder(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for _ in range(tokens):
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(holder, str(folder / "worker-1.sock"))
    PrefixDirectory(folder, 1, 2).record(prefix_hashes("/v1/completions", body))
    router = PrefixRouter(PrefixDirectory(folder, 0, 2), lambda i: folder / f"worker-{i}.sock", "t")

    async def local(request: HttpRequest) -> HttpResponse:
        raise AssertionError("the holder answers")

    handler = router.wrap("/v1/completions", local)

    async def direct() -> None:
        reader, writer = await asyncio.open_unix_connection(str(folder / "worker-1.sock"))
        writer.write(b"POST / HTTP/1.1\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        while await reader.read(1 << 16):
            pass
        writer.close()

    async def relayed() -> None:
        response = await handler(HttpRequest("POST", "/v1/completions", "", {}, body))
        assert response.stream is not None
        async for _ in response.stream:
            pass

    figures = {}
    for name, call in (
        ("direct", direct),
        ("relayed", relayed),
        ("direct_again", direct),
        ("relayed_again", relayed),
    ):
        started = time.process_time()
        for _ in range(requests):
            await call()
        figures[name] = (time.process_time() - started) / requests * 1e6
    server.close()
    extra = (figures["relayed"] + figures["relayed_again"] - figures["direct"] - figures["direct_again"]) / 2
    return {
        "cpu_us_per_request_direct": round((figures["direct"] + figures["direct_again"]) / 2, 1),
        "cpu_us_per_request_relayed": round((figures["relayed"] + figures["relayed_again"]) / 2, 1),
        "forward_cpu_us_per_request": round(extra, 1),
        "forward_cpu_us_per_event": round(extra / tokens, 2),
        "forwarded": router.forwarded,
    }


def wait_all_ready(server: ServerProcess, timeout_s: float = 120.0) -> None:
    """Until the supervisor's merged model state says ready (every worker has the model)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(
                f"http://{server.host}:{server.metrics_port}/metrics", timeout=5
            ) as reply:
                text = reply.read().decode()
        except OSError:
            text = ""
        for line in text.splitlines():
            ready = f'model="{MODEL}"' in line and 'state="ready"' in line and line.endswith(" 1.0")
            if line.startswith("ortserve_model_state{") and ready:
                return
        time.sleep(0.2)
    raise TimeoutError("the model is not ready on every worker")


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1e3, 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--hop-only", action="store_true", help="only the in-process forward cost")
    args = parser.parse_args()
    summary: dict[str, object] = {"machine": machine_stamp()}
    for events in (1, 128):
        summary[f"hop_cost_{events}_events"] = hop = asyncio.run(hop_cost(300, events))
        print(f"forward cost in process, {events} events: {json.dumps(hop)}", flush=True)
    if args.hop_only:
        return
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        build_model(root / "models" / MODEL)
        for workers, seed in ((2, 11), (1, 12), (2, 13)):
            extra = ["--workers", str(workers), "--intra-op-threads", "1"]
            with run_server(root / "models", root / f"server{workers}.log", extra, pin_cpu="0-1") as server:
                wait_all_ready(server)
                asyncio.run(turn(server, list(range(3, 40)), 4))  # warm-up (both workers may get one)
                asyncio.run(turn(server, list(range(4, 41)), 4))
                result = asyncio.run(
                    conversations(server, args.conversations, args.repeats, args.tokens, seed)
                )
            summary[f"workers{workers}_seed{seed}"] = result
            print(f"--workers {workers} (seed {seed}): {json.dumps(result)}", flush=True)
    OUT.mkdir(exist_ok=True)
    (OUT / "workers_prefix.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
