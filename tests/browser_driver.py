"""Headless Chromium for browser tests: Debian's chromium driven by its chromium-driver over
the W3C WebDriver protocol (JSON over HTTP, spoken here with urllib).

Not Selenium: its client pulls in trio, whose Hypothesis plugin warns at start-up and so
stops a suite that runs with warnings as errors; the tests need five WebDriver commands.
A machine without the browser skips; under CI=true a missing browser fails (.ci/run installs
chromium and chromium-driver).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from ortserve.testing import free_port
from waiting import wait_until

__all__ = ["Browser", "chromium"]

_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--window-size=1400,1000",
]


def _call(url: str, method: str, body: object = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return json.loads(reply.read())["value"]
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")
        error.close()
        raise AssertionError(f"WebDriver {method} {url}: {error.code} {detail}") from None


class Browser:
    """One WebDriver session."""

    def __init__(self, base: str, session: str) -> None:
        self._url = f"{base}/session/{session}"

    def open(self, url: str) -> None:
        _call(f"{self._url}/url", "POST", {"url": url})

    def run(self, script: str, *args: object) -> Any:
        """Run ``script`` (a function body: ``return ...``) in the page; its value."""
        return _call(f"{self._url}/execute/sync", "POST", {"script": script, "args": list(args)})

    def text(self, css: str) -> str:
        """The text of the first element ``css`` matches ("" when none does)."""
        return str(
            self.run("const e = document.querySelector(arguments[0]); return e ? e.textContent : '';", css)
        )

    def console(self) -> list[dict[str, Any]]:
        """The browser console's entries since the last call (chromedriver's log endpoint)."""
        return list(_call(f"{self._url}/se/log", "POST", {"type": "browser"}))


def _missing(what: str) -> None:
    message = f"{what} not found: apt-get install chromium chromium-driver (.ci/run installs them)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium session that keeps the console's log; closed on exit."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        _missing("chromium or chromedriver")
        raise AssertionError("unreachable")
    port = free_port()
    process = subprocess.Popen(
        [driver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: _call(f"{base}/status", "GET").get("ready"),
            30,
            "chromedriver to start",
            (urllib.error.URLError, ConnectionError),
        )
        capabilities = {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": binary, "args": _ARGS},
            "goog:loggingPrefs": {"browser": "ALL"},
        }
        session = _call(f"{base}/session", "POST", {"capabilities": {"alwaysMatch": capabilities}})[
            "sessionId"
        ]
        try:
            yield Browser(base, session)
        finally:
            _call(f"{base}/session/{session}", "DELETE")
    finally:
        process.terminate()
        process.wait(30)
