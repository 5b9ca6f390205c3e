"""The zygote of ``--workers N``: it imports the server with ONNX Runtime deferred and no thread
but its own, forks every worker (restarted ones too), and is replaced if it dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from model_builders import write_scaled_version
from ortserve.testing import ServerProcess, run_server
from workers_helpers import infer, ready_status, scrape, value, wait_until, worker_pids

_PRELOAD = """
import sys
from ortserve.supervisor.zygote import preload, thread_count
placeholder = preload()
print(thread_count(), sys.modules["onnxruntime"] is placeholder, "onnxruntime.capi" in sys.modules)
placeholder.load()
print(placeholder.InferenceSession.__name__, sys.modules["onnxruntime"] is not placeholder)
"""


def test_preload_imports_the_server_without_onnxruntime_or_a_thread() -> None:
    environment = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", _PRELOAD], capture_output=True, text=True, env=environment, check=True
    )
    assert result.stdout.split("\n")[:2] == ["1 True False", "InferenceSession True"], result.stderr


def test_a_deferred_module_is_imported_at_its_first_use_only(tmp_path: Path) -> None:
    (tmp_path / "heavy.py").write_text("import sys\nsys.stdout.write('imported ')\nVALUE = 42\n")
    script = (
        "from ortserve.supervisor.zygote import DeferredModule\n"
        "DeferredModule.install('heavy')\n"
        "import heavy as h\n"
        "print('bound', end=' ')\n"
        "print(h.VALUE, h.__name__)\n"
    )
    environment = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=environment, check=True
    )
    assert result.stdout.strip() == "bound imported 42 heavy"


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _command(pid: int) -> list[str]:
    """The ``-m module`` of a process's command line."""
    arguments = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    at = arguments.index("-m")
    return arguments[at : at + 2]


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[ServerProcess]:
    write_scaled_version(tmp_path / "models", "scaled", 1, 2.0)
    with run_server(tmp_path / "models", tmp_path / "server.log", ["--workers", "2"]) as server:
        wait_until(lambda: value(scrape(server), "ortserve_workers_ready") == 2, what="both workers ready")
        yield server


@pytest.mark.e2e
def test_workers_are_forked_from_one_zygote_child_of_the_supervisor(workers: ServerProcess) -> None:
    pids = [int(pid) for pid in worker_pids(scrape(workers)).values()]
    zygotes = {_parent(pid) for pid in pids}
    assert len(zygotes) == 1
    (zygote,) = zygotes
    assert _parent(zygote) == workers.process.pid  # the supervisor, exec'd in the same process
    # Forked from the supervisor (same command line), not a fresh interpreter.
    assert _command(zygote) == _command(workers.process.pid) == ["-m", "ortserve.supervisor"]
    assert len(os.listdir(f"/proc/{zygote}/task")) == 1
    assert "zygote pid" in workers.log()


@pytest.mark.e2e
def test_a_killed_zygote_is_replaced_and_its_workers_started_again(workers: ServerProcess) -> None:
    old = worker_pids(scrape(workers))
    (zygote,) = {_parent(int(pid)) for pid in old.values()}
    os.kill(zygote, signal.SIGKILL)  # its workers get SIGTERM (their death signal) and drain

    def replaced() -> bool:
        samples = scrape(workers)
        now = worker_pids(samples)
        return (
            sorted(now) == ["0", "1"]
            and not set(now.values()) & set(old.values())
            and all(_parent(int(pid)) not in (zygote, 1) for pid in now.values())
            and value(samples, "ortserve_workers_ready") == 2
        )

    wait_until(replaced, timeout_s=90, what="both workers forked again")
    assert all(infer(workers, "scaled") == (200, [2.0] * 4) for _ in range(10))
    assert ready_status(workers) == 200
    new_zygotes = {_parent(int(pid)) for pid in worker_pids(scrape(workers)).values()}
    assert len(new_zygotes) == 1 and zygote not in new_zygotes
    assert _command(new_zygotes.pop()) == ["-m", "ortserve.supervisor.zygote"]  # a fresh one
    assert "the zygote exited" in workers.log()


def test_a_supervisor_that_cannot_start_says_why_in_one_line_and_exits_1(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    result = subprocess.run(
        [sys.executable, "-m", "ortserve", "serve", "--model-repository", str(missing), "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(f"model repository {missing} is not a folder"), lines
