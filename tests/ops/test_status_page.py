"""The status page in a real headless Chromium: it renders every model, its charts move under
load, a routing change shows in the version shares, a model unloaded through the control API
disappears, it loads nothing from outside and the console stays clean. Also: the JSON endpoint
obeys --http-restricted-api, and with --workers 2 the page shows the whole server."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from browser_driver import chromium
from model_builders import write_scaled_version
from ops.conftest import post
from ortserve.testing import ServerProcess, run_server
from waiting import wait_until

pytestmark = pytest.mark.e2e

ROW = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}]}


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    """Poll ``check`` (a page read through the driver) until it returns something truthy."""
    return wait_until(check, timeout_s, what, poll_s=0.1)


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as reply:
            return int(reply.status), bytes(reply.read())
    except urllib.error.HTTPError as error:
        body = error.read()
        error.close()
        return int(error.code), body


class Load:
    """Requests to two models from a thread until stopped."""

    def __init__(self, server: ServerProcess) -> None:
        self._urls = [f"{server.http_url}/v2/models/{m}/infer" for m in ("small", "routed")]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for url in self._urls:
                post(url, ROW)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("status-models")
    for name in ("small", "spare"):
        write_scaled_version(root, name, 1, 1.0)
    for version in (1, 2):
        write_scaled_version(root, "routed", version, float(version))
    (root / "routed" / "config.yaml").write_text(
        'version_policy: all\nrouting:\n  split: {"1": 100}\n', encoding="utf-8"
    )
    args = ["--model-control-mode", "explicit", "--load-model", "*", "--intra-op-threads", "1"]
    with run_server(root, tmp_path_factory.mktemp("status-logs") / "server.log", args) as running:
        yield running


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def test_the_page_renders_moves_follows_routing_and_unloads_with_a_clean_console(
    server: ServerProcess,
) -> None:
    status, body = get(f"{server.http_url}/")
    assert status == 200 and b"<script>" in body and b"src=" not in body
    with chromium() as driver:
        driver.open(f"{server.http_url}/status")
        small = 'section[data-model="small"]'
        wait_for(lambda: driver.text(f"{small} h2") == "small", "the page to show model small")
        assert driver.text('section[data-model="spare"] tr[data-version="1"] td:nth-child(2)') == "ready"
        assert "CPUExecutionProvider" in driver.text(f"{small} table")
        with Load(server):
            wait_for(lambda: number(driver.text(f"{small} .figure.qps .value")) > 0, "a QPS above zero")
            chart = f"{small} .qps-chart polyline"
            points = "return document.querySelector(arguments[0]).getAttribute('points');"
            first = wait_for(lambda: driver.run(points, chart), "a chart")
            wait_for(lambda: driver.run(points, chart) != first, "the chart to move")
            assert number(driver.text(f"{small} .figure.p99 .value")) > 0
            policy = json.dumps({"split": {"2": 100}}).encode()
            request = urllib.request.Request(
                f"{server.http_url}/v2/routing/models/routed", policy, method="PUT"
            )
            with urllib.request.urlopen(request, timeout=30) as reply:
                assert reply.status == 200
            share = 'section[data-model="routed"] tr[data-version="2"] .share'
            wait_for(lambda: driver.text(share) == "100.0%", "version 2 to take all of routed's traffic")
        assert post(f"{server.http_url}/v2/repository/models/spare/unload", {}) == 200
        wait_for(
            lambda: (
                not driver.run("return document.querySelector('section[data-model=\"spare\"]') !== null;")
            ),
            "spare to leave the page",
        )
        resources = driver.run("return performance.getEntriesByType('resource').map(e => e.name)")
        assert all(name.startswith(server.http_url) for name in resources), resources
        errors = [entry for entry in driver.console() if entry["level"] in ("SEVERE", "WARNING")]
        assert errors == []


def test_the_status_document_obeys_the_restriction_and_shows_every_worker(tmp_path: Path) -> None:
    write_scaled_version(tmp_path / "models", "small", 1, 1.0)
    args = ["--workers", "2", "--http-restricted-api", "status:x-status-key=opens", "--intra-op-threads", "1"]
    with run_server(tmp_path / "models", tmp_path / "server.log", args) as running:
        url = f"{running.http_url}/v2/status.json"
        assert get(url)[0] == 403
        for _ in range(20):
            assert post(f"{running.http_url}/v2/models/small/infer", ROW) == 200
        status, body = get(url, {"x-status-key": "opens"})
        assert status == 200
        document = json.loads(body)
        assert document["workers"] == 2
        assert [m["name"] for m in document["models"]] == ["small"]
        assert get(f"{running.http_url}/status")[0] == 200  # the page itself holds no data
