"""Helpers for the ``--workers`` tests: scrape the supervisor's metrics, infer on fresh connections."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

import waiting
from ortserve.testing import ServerProcess

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(server: ServerProcess, port: int | None = None) -> Samples:
    """Every sample of ``/metrics`` (the supervisor's metrics port unless ``port`` is given)."""
    url = f"http://{server.host}:{port or server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def matching(samples: Samples, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return {key: v for (sample, key), v in samples.items() if sample == name and wanted <= key}


def worker_pids(samples: Samples) -> dict[str, str]:
    """Worker index -> pid, from ``ortserve_worker_requests_total``."""
    return {
        dict(key)["worker"]: dict(key)["pid"] for key in matching(samples, "ortserve_worker_requests_total")
    }


def wait_until(condition: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition") -> None:
    """:func:`waiting.wait_until`, with a server that refuses or drops a check counting as "not yet"."""
    waiting.wait_until(
        condition, timeout_s, what, (OSError, urllib.error.URLError, http.client.HTTPException)
    )


def infer(server: ServerProcess, model: str, scale_input: float = 1.0) -> tuple[int, list[float]]:
    """One JSON infer on a new connection (so SO_REUSEPORT may pick any worker)."""
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [scale_input] * 4}]}
    )
    connection = http.client.HTTPConnection(server.host, server.http_port, timeout=30)
    try:
        connection.request("POST", f"/v2/models/{model}/infer", body, {"Connection": "close"})
        reply = connection.getresponse()
        answer = json.loads(reply.read() or b"{}")
    finally:
        connection.close()
    return reply.status, [float(x) for x in answer.get("outputs", [{}])[0].get("data", [])]


def ready_status(server: ServerProcess) -> int:
    connection = http.client.HTTPConnection(server.host, server.http_port, timeout=10)
    try:
        connection.request("GET", "/v2/health/ready", headers={"Connection": "close"})
        return connection.getresponse().status
    finally:
        connection.close()
