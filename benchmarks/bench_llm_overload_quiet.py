"""Issue 35's served targets in one run of at most 12 minutes, for a quiet machine: mixed-length
open Poisson loops at 1.3x and 2x the closed loop's capacity on the served engine, and, when
llama.cpp's ``llama-server`` or vLLM-CPU is given, the same loads against each on the same weights.

Per server (pinned to CPU 0; ortserve with one ONNX Runtime thread, llama-server ``-t 1 -tb 1
-np 16``; this client on CPU 1): a lone 512-token prompt's time to first token (one prefill,
three times, the median), a closed loop of 16 streams (prompts 16-512, outputs 16-256 tokens,
``ignore_eos``, greedy; the first ``--warmup`` seconds not counted), then open loops at 1.3x
and 2x the closed loop's requests/s (arrivals for ``--duration`` s, the first ``--open-warmup``
not counted, then a drain of at most ``--drain`` s), and with ``--closed-after`` a second
closed loop (the open loops are then compared with the mean of the two). Reported against the
targets:

- output tokens/s of each open loop against the closed loop's (>= 0.95);
- admitted requests' TTFT p99 against ``max_queue_wait_s`` + one prefill at the engine's calm
  chunked pace (the lone prefill x (1 + 1 / PREFILL_SHARE)); llama-server has no such bound;
- ITL p99 against the engine's ITL target (``ortserve_llm_itl_target_seconds``);
- requests unfinished after the drain (0), and 429s.

The model is bench_llm.py's 30.6M decoder (random weights, seed 0) in the genai layout, fp32;
llama.cpp gets the same weights as GGUF F32 (bench_llm_peer.py's writer, under ``--gguf-python``),
and the greedy text of a probe must be equal from both (reported).

Usage (the lead's quiet run): ``taskset -c 1 .venv/bin/python benchmarks/bench_llm_overload_quiet.py
--llama-server /tmp/llama.cpp/build/bin/llama-server --gguf-python /tmp/peervenv/bin/python
--vllm-python /work/venvs/vllm/bin/python`` (each peer optional);
``--smoke`` runs every phase for a few seconds (a check that it runs). Writes
benchmarks/out/llm_overload_quiet.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_llm_mixed import Run, Sampler, _one, _per_cpu, closed_loop, open_loop, summary
from bench_llm_peer import MODEL, build, greedy_text, llama_server
from bench_llm_peers import vllm_server
from llm_checkpoint import write_hf_checkpoint
from machine import stamp as machine_stamp

from ortserve.llm.engine import PREFILL_SHARE
from ortserve.testing import run_server

OUT = Path(__file__).parent / "out"
CONFIG = "kind: llm\nintra_op_threads: 1\nllm:\n  max_num_seqs: 64\n  max_waiting: 256\n  max_queue_wait_s: {wait}\n{itl}"


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(f"{name}{{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _itl_target(url: str) -> float:
    return _metric(url, "ortserve_llm_itl_target_seconds")


def _one_prefill(url: str) -> float:
    """Seconds to the first token of a lone 512-token prompt (median of three)."""
    times = []
    for index in range(3):
        run = Run()
        asyncio.run(_one(url, [3 + (index * 7 + i) % 250 for i in range(512)], 1, run))
        times += [t.first - t.started for t in run.traces if t.ok and t.first is not None]
    return statistics.median(times) if times else 0.0


def measure(url: str, pid: int, args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, object]:
    """One server: the lone prefill, the closed loop, the open loops."""
    prefill = _one_prefill(url)
    sampler = Sampler(url, pid)
    sampler.start()
    run, start, stop = asyncio.run(closed_loop(url, 16, args.duration, 0, args.warmup))
    closed = summary(run, start, stop) | _per_cpu(run, sampler, start, stop) | sampler.medians()
    log(f"  closed 16: {json.dumps({k: round(v, 1) for k, v in closed.items()})}")
    phases: dict[str, object] = {"one_prefill_s": prefill, "closed": closed}
    for multiple in (1.3, 2.0):
        rate = multiple * max(closed["requests_per_s"], 0.05)
        sampler = Sampler(url, pid)
        sampler.start()
        run, start, stop, unfinished = asyncio.run(open_loop(url, rate, args.duration, 7, args.drain))
        counted = start + args.open_warmup
        opened = summary(run, counted, stop) | _per_cpu(run, sampler, counted, stop) | sampler.medians()
        opened |= {"rate": rate, "unfinished_after_drain": unfinished, "load_1m": os.getloadavg()[0]}
        opened["of_closed"] = opened["output_tokens_per_s"] / max(closed["output_tokens_per_s"], 1e-9)
        log(f"  open x{multiple}: {json.dumps({k: round(v, 2) for k, v in opened.items()})}")
        phases[f"open_x{multiple}"] = opened
    if args.closed_after:
        # The machine's speed drifts by 10% within minutes: a second closed loop after the open
        # ones makes the reference the capacity at their middle (the mean of the two), and the
        # two apart say how far it drifted during the run.
        sampler = Sampler(url, pid)
        sampler.start()
        run, start, stop = asyncio.run(closed_loop(url, 16, args.duration, 1, args.warmup))
        after = summary(run, start, stop) | _per_cpu(run, sampler, start, stop) | sampler.medians()
        log(f"  closed 16 after: {json.dumps({k: round(v, 1) for k, v in after.items()})}")
        phases["closed_after"] = after
        reference = (closed["output_tokens_per_s"] + after["output_tokens_per_s"]) / 2
        for multiple in (1.3, 2.0):
            phase = phases[f"open_x{multiple}"]
            assert isinstance(phase, dict)
            phase["of_closed_first"] = phase["of_closed"]
            phase["of_closed"] = phase["output_tokens_per_s"] / max(reference, 1e-9)
    return phases


def verdict(name: str, phases: dict[str, object], itl_target: float, bound: float | None) -> list[str]:
    lines = []
    for key in ("open_x1.3", "open_x2.0"):
        f = phases[key]
        assert isinstance(f, dict)
        row = (
            f"{name} {key}: tokens/s {f['output_tokens_per_s']:.1f} = {f['of_closed']:.2f} of closed"
            + (
                f" (before and after; before alone {f['of_closed_first']:.2f})"
                if "of_closed_first" in f
                else ""
            )
            + " (>= 0.95); "
            f"TTFT p99 {f['ttft_p99_ms'] / 1e3:.2f} s"
            + (f" (<= {bound:.2f} s)" if bound else "")
            + f"; ITL p50/p99 {f['itl_p50_ms']:.0f}/{f['itl_p99_ms']:.0f} ms"
            + (f" (p99 <= {itl_target * 1e3:.0f} ms)" if itl_target else "")
            + f"; unfinished {f['unfinished_after_drain']} (0); 429 {f['refused_429']}; "
            f"server CPU {f['server_cpu_share']:.2f}; running median {f['median_running_sequences']:.0f}"
        )
        lines.append(row)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-server", default="")
    parser.add_argument("--gguf-python", default="")
    parser.add_argument("--vllm-python", default="", help="vLLM-CPU's interpreter: measure it too")
    parser.add_argument("--duration", type=float, default=40.0, help="closed loop and open arrivals, s")
    parser.add_argument("--warmup", type=float, default=10.0, help="closed loop: seconds not counted")
    parser.add_argument("--open-warmup", type=float, default=10.0, help="open loop: seconds not counted")
    parser.add_argument("--drain", type=float, default=50.0, help="open loop: the most seconds to drain")
    parser.add_argument(
        "--max-queue-wait", type=float, default=30.0, help="ortserve's max_queue_wait_s (the TTFT bound)"
    )
    parser.add_argument(
        "--max-itl-ms",
        type=float,
        default=0.0,
        help="ortserve's max_itl_ms (0: the engine's measured default)",
    )
    parser.add_argument(
        "--closed-after",
        action="store_true",
        help="a second closed loop after the open ones; the open loops' ratio is to the mean of both",
    )
    parser.add_argument("--smoke", action="store_true", help="a few seconds per phase: does it run")
    args = parser.parse_args()
    if args.smoke:
        args.duration, args.warmup, args.open_warmup, args.drain = 4.0, 1.0, 1.0, 20.0
    os.sched_setaffinity(0, {1})
    OUT.mkdir(exist_ok=True)
    began = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - began:6.1f} s] {line}", flush=True)

    peer = bool(args.llama_server and args.gguf_python)
    document: dict[str, object] = {
        "machine": machine_stamp(),
        "args": vars(args),
        "load_before": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        weights, _ = build(root, args.gguf_python if peer else "", ["fp32"] if peer else [], 4)
        (root / "ort_fp32" / MODEL / "config.yaml").write_text(
            CONFIG.format(
                wait=args.max_queue_wait, itl=f"  max_itl_ms: {args.max_itl_ms}\n" if args.max_itl_ms else ""
            )
        )
        log("ortserve (genai layout, fp32, one ORT thread, CPU 0)")
        with run_server(
            root / "ort_fp32", root / "ortserve.log", ["--intra-op-threads", "1"], pin_cpu=0
        ) as server:
            text = greedy_text(server.http_url)
            target = _itl_target(server.http_url)
            phases = measure(server.http_url, server.process.pid, args, log)
            # The engine's own view over the whole run (warm-ups included): a share of gaps past
            # the target far below the clients' says the tail is in the delivery.
            seen = _metric(server.http_url, "ortserve_llm_engine_itl_gaps_total")
            past = _metric(server.http_url, "ortserve_llm_engine_itl_gaps_over_target_total")
            phases["engine_gaps_over_target_share"] = past / seen if seen else 0.0
            phases["itl_guard_scale_at_end"] = _metric(server.http_url, "ortserve_llm_itl_guard_scale")
            log(f"engine view: {past:.0f} of {seen:.0f} gaps past the target; guard scale "
                f"{phases['itl_guard_scale_at_end']:.2f}")  # fmt: skip
        prefill = phases["one_prefill_s"]
        assert isinstance(prefill, float)
        bound = args.max_queue_wait + prefill * (1.0 + 1.0 / PREFILL_SHARE)
        document["ortserve"] = phases | {"itl_target_s": target, "ttft_bound_s": bound}
        lines = verdict("ortserve", phases, target, bound)
        peers: dict[str, dict[str, object]] = {}
        if peer:
            log("llama-server (GGUF F32, -t 1 -tb 1 -np 16, CPU 0)")
            pids: list[int] = []
            with llama_server(args.llama_server, root / "F32.gguf", root / "llama.log", pids) as url:
                document["text_equal_llama.cpp"] = greedy_text(url) == text
                peers["llama.cpp"] = measure(url, pids[0], args, log)
        if args.vllm_python:
            log("vLLM-CPU (Hugging Face folder, fp32, OMP bound to CPU 0)")
            write_hf_checkpoint(root / "ort_fp32" / MODEL / "1", weights, root / "hf")
            vllm_pids: list[int] = []
            with vllm_server(args.vllm_python, root / "hf", root / "vllm.log", vllm_pids) as url:
                document["text_equal_vllm"] = greedy_text(url) == text
                # taskset's pid is the API server's (exec): its engine core is a child
                # process, so the CPU share reported for vLLM is the API process's alone.
                peers["vllm"] = measure(url, vllm_pids[0], args, log)
        for name, found in peers.items():
            document[name] = found
            lines += verdict(name, found, 0.0, None)
            lines.append(f"greedy text equal ({name}): {document[f'text_equal_{name}']}")
            for key in ("closed", "open_x1.3", "open_x2.0", "closed_after"):
                if key not in phases:
                    continue
                ours, theirs = phases[key], found[key]
                assert isinstance(ours, dict) and isinstance(theirs, dict)
                ratio = (
                    ours["output_tokens_per_s"] / theirs["output_tokens_per_s"]
                    if theirs["output_tokens_per_s"]
                    else 0
                )
                lines.append(f"{key}: ortserve / {name} output tokens/s {ratio:.2f} (0: none counted)")
    document["verdict"] = lines
    document["load_after"] = os.getloadavg()
    document["seconds"] = time.monotonic() - began
    (OUT / "llm_overload_quiet.json").write_text(json.dumps(document, indent=2))
    print("\n".join(lines))
    log(f"done; load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
