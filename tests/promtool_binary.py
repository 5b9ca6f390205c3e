"""Where promtool is: a skip on a developer machine without it, a failure under CI=true
(.ci/run installs Debian's prometheus package, which ships it)."""

from __future__ import annotations

import os
import shutil

import pytest

__all__ = ["promtool"]


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool not found: apt-get install prometheus (.ci/run installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found
