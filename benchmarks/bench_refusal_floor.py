"""The floor under a refusal: ortserve's 429 against the least a Python server can do (issue 10).

The goodput bound of ``bench_refusal_cost.py`` depends on what one refusal costs. This asks
how much of that is unavoidable in Python: a bare uvloop + httptools protocol that parses each
request and writes one canned 429 (no routing, no admission, no accounting) is the floor for
any server on this stack. Both run on CPU 0 and take the same wrk load (c=64, CPU 1) in
alternating rounds; server CPU per response from /proc, medians.

    .venv/bin/python benchmarks/bench_refusal_floor.py --rounds 5 --seconds 3
    .venv/bin/python benchmarks/bench_refusal_floor.py --old-src /tmp/old/src  # and an older ortserve
    .venv/bin/python benchmarks/bench_refusal_floor.py --serve-bare 18555   # the floor alone
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).parent))

CANNED = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b'content-length: 21\r\n\r\n{"error": "overload"}'
)


def serve_bare(port: int) -> None:
    """The floor: parse with httptools, answer every request with the same bytes."""
    import httptools
    import uvloop

    class Bare(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
            self.parser = httptools.HttpRequestParser(self)

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_message_complete(self) -> None:
            self.transport.write(CANNED)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(Bare, "127.0.0.1", port, backlog=4096)
        await asyncio.Event().wait()

    uvloop.run(main())


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk_responses(url: str, path: str, body: dict[str, object], seconds: int) -> int:
    from bench_refusal_cost import POST_LUA

    with tempfile.NamedTemporaryFile("w", suffix=".json") as handle:
        json.dump(body, handle)
        handle.flush()
        env = {**os.environ, "BODY": handle.name, "URL_PATH": path, "HEADER_LENGTH": ""}
        command = ["taskset", "-c", "1", "wrk", "-t1", "-c64", f"-d{seconds}s", "-s", str(POST_LUA), url]
        output = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return int(output.split(" requests in ")[0].split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--serve-bare", type=int, metavar="PORT", help="only run the floor server")
    parser.add_argument("--old-src", type=Path, help="also time this ortserve source tree (PYTHONPATH)")
    args = parser.parse_args()
    if args.serve_bare:
        serve_bare(args.serve_bare)
        return
    from bench_refusal_cost import OUT, http_run, repository
    from machine import stamp

    from ortserve.testing import run_server

    OUT.mkdir(exist_ok=True)
    port = 18555
    bare = subprocess.Popen(["taskset", "-c", "0", sys.executable, __file__, "--serve-bare", str(port)])
    body: dict[str, object] = {
        "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]
    }
    cells: dict[str, list[float]] = {"bare": [], "ortserve": []}
    try:
        time.sleep(1.5)
        repo = repository(OUT / "refusal-floor-models")
        server_args = ["--intra-op-threads", "1", "--metrics-port", "-1", "--log-level", "WARNING"]
        with contextlib.ExitStack() as servers:
            arms = {
                "ortserve": servers.enter_context(
                    run_server(repo, OUT / "refusal-floor.log", server_args, pin_cpu=0)
                )
            }
            if args.old_src is not None:
                cells["old"] = []
                env = {"PYTHONPATH": str(args.old_src.resolve())}
                arms["old"] = servers.enter_context(
                    run_server(repo, OUT / "refusal-floor-old.log", server_args, env=env, pin_cpu=0)
                )
            bare_url = f"http://127.0.0.1:{port}"
            for server in arms.values():
                http_run(server, "small_mlp_refusing", 1)
            wrk_responses(bare_url, "/v2/models/small_mlp/infer", body, 1)
            for _ in range(args.rounds):
                before = cpu_s(bare.pid)
                count = wrk_responses(bare_url, "/v2/models/small_mlp/infer", body, args.seconds)
                cells["bare"].append(1e6 * (cpu_s(bare.pid) - before) / count)
                for name, server in arms.items():
                    answers, refused, used = http_run(server, "small_mlp_refusing", args.seconds)
                    assert refused == answers, "every ortserve answer must be a refusal"
                    cells[name].append(1e6 * used / answers)
    finally:
        bare.kill()
    medians = {key: round(statistics.median(values), 1) for key, values in cells.items()}
    report = {"machine": stamp(), "args": vars(args), "us_per_response": cells, "medians": medians}
    (OUT / "refusal_floor.json").write_text(json.dumps(report, indent=2, default=str))
    print("server CPU per 429, medians (us):", medians)


if __name__ == "__main__":
    main()
