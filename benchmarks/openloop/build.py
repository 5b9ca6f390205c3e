"""Compile the open-loop generator (and the trivial HTTP/1.1 and h2c responders) with gcc, on demand, into
benchmarks/out/: binaries are named by a hash of their sources, so an edit rebuilds and nothing
compiled is ever committed.

    python benchmarks/openloop/build.py          # prints the generator's path
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).parent
OUT = HERE.parent / "out"
PROGRAMS = {
    "openloop": ("openloop.c", "http1.c", "http2.c", "hpack.c", "summary.c"),
    "responder": ("responder.c",),
    "h2responder": ("h2responder.c",),
}
HEADERS = ("openloop.h", "hpack_tables.h")


class BuildError(RuntimeError):
    """gcc is missing or the sources did not compile."""


def build(program: str = "openloop") -> Path:
    """The compiled ``program`` (built now unless this exact source already was).

    Raises:
        BuildError: no gcc on PATH, or compilation failed (gcc's message attached).
    """
    sources = [HERE / name for name in PROGRAMS[program]]
    digest = hashlib.sha256()
    for path in sorted([*sources, *(HERE / h for h in HEADERS)]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    binary = OUT / f"{program}-{digest.hexdigest()[:12]}"
    if binary.exists():
        return binary
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError("gcc is not installed")
    OUT.mkdir(exist_ok=True)
    partial = binary.with_suffix(f".{os.getpid()}.tmp")
    command = [gcc, "-O2", "-std=gnu11", "-Wall", "-Wextra", "-o", str(partial), *map(str, sources), "-lm"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"{' '.join(command)} failed:\n{done.stderr}")
    partial.replace(binary)  # atomic: a concurrent build of the same source is harmless
    return binary


if __name__ == "__main__":
    print(build())
