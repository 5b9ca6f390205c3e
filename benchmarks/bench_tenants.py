"""Tenants: what admission costs per request, and whether a flooding tenant hurts a quiet one.

1. Admission cost: ``TenantGate.admit`` in a loop (API key + quota, key only, quota only).
2. Fairness: a quiet tenant (X-Tenant-Id: quiet, one request at a time) alone, then beside a
   flooding tenant (``ortserve bench -c 32``, tenant ``default``), with and without
   ``--tenant-quota``; the quiet tenant's p99 against its solo p99.

Run from the repo root (server on CPU 0, clients on CPU 1):
    taskset -c 1 .venv/bin/python benchmarks/bench_tenants.py --seconds 8
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

import numpy as np

from ortserve.demo import write_demo_repository
from ortserve.tenancy.buckets import QuotaPolicy, TenantQuotas
from ortserve.tenancy.gate import TenantGate
from ortserve.tenancy.keys import ApiKeys
from ortserve.testing import ServerProcess, run_server

BODY = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]})


def admission_ns() -> dict[str, float]:
    headers = {"authorization": "Bearer k-acme", "x-tenant-id": "acme"}.get
    quotas = TenantQuotas(QuotaPolicy(requests_per_s=1e12, request_burst=1e12), time.monotonic)
    keys = ApiKeys({"k-acme": "acme", "k-globex": "globex"})
    gates = {
        "key+quota": TenantGate(keys, quotas),
        "key only": TenantGate(keys, None),
        "quota only (tenant header)": TenantGate(None, quotas),
    }
    found = {}
    for name, gate in gates.items():
        runs = [timeit.timeit(lambda gate=gate: gate.admit(headers), number=100_000) for _ in range(5)]  # type: ignore[misc]
        found[name] = round(min(runs) / 100_000 * 1e9, 1)
    return found


def quiet_p99(server: ServerProcess, seconds: float) -> tuple[float, int]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port)
    headers = {"Content-Type": "application/json", "X-Tenant-Id": "quiet"}
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        connection.request("POST", "/v2/models/small_mlp/infer", BODY, headers)
        reply = connection.getresponse()
        reply.read()
        if reply.status == 200:
            latencies.append(time.perf_counter() - started)
    connection.close()
    return float(np.percentile(latencies, 99) * 1e3), len(latencies)


def flood(server: ServerProcess, seconds: float) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "ortserve", "bench", server.http_url, "-m", "small_mlp", "-c", "32"]
    command += ["-d", str(seconds + 3), "--warmup", "0.5", "--no-progress"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def fairness(root: Path, quota: str | None, seconds: float) -> dict[str, float]:
    args = ["--intra-op-threads", "1"] + (["--tenant-quota", quota] if quota else [])
    with run_server(root / "models", root / "server.log", args, pin_cpu=0) as server:
        quiet_p99(server, 1.0)  # warm
        solo, solo_n = quiet_p99(server, seconds)
        flooding = flood(server, seconds)
        time.sleep(1.0)
        shared, shared_n = quiet_p99(server, seconds)
        flooding.wait()
    return {
        "solo_p99_ms": round(solo, 3),
        "with_flood_p99_ms": round(shared, 3),
        "ratio": round(shared / solo, 2),
        "quiet_requests_solo": solo_n,
        "quiet_requests_flood": shared_n,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--quota", default="requests=200,burst=50")
    args = parser.parse_args()
    result: dict[str, object] = {"admission_ns": admission_ns()}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_demo_repository(root / "models")
        result["no_quota"] = fairness(root, None, args.seconds)
        result["quota " + args.quota] = fairness(root, args.quota, args.seconds)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
