"""What every benchmark result is stamped with: machine, versions, git revision, date."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

import onnxruntime as ort


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (or whatever the platform says)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def git_revision() -> str:
    """The short revision of the checkout being measured."""
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


def stamp() -> dict[str, object]:
    """The common header of a result JSON."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "onnxruntime": ort.__version__,
        "python": platform.python_version(),
        "git": git_revision(),
    }
