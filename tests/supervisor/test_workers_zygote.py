"""The zygote of ``--workers N``: it imports the server with ONNX Runtime deferred and no thread
but its own, forks the workers and exits (the supervisor adopts them); a worker restarted later
is forked from a fresh zygote, which exits too; workers stop when the supervisor dies."""

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


def _children(pid: int) -> set[int]:
    return {
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    }


def _adopted(server: ServerProcess, pids: set[int]) -> bool:
    """``pids`` are the supervisor's only children: no zygote is left."""
    return _children(server.process.pid) == pids and all(_parent(pid) == server.process.pid for pid in pids)


@pytest.mark.e2e
def test_the_zygote_forks_the_workers_then_exits_and_the_supervisor_adopts_them(
    workers: ServerProcess,
) -> None:
    pids = {int(pid) for pid in worker_pids(scrape(workers)).values()}
    assert len(pids) == 2
    wait_until(lambda: _adopted(workers, pids), what="the zygote gone, its workers adopted")
    for pid in pids:  # forked from the zygote forked from the supervisor: not a fresh interpreter
        assert _command(pid) == _command(workers.process.pid) == ["-m", "ortserve.supervisor"]
    log = workers.log()
    assert "zygote pid" in log and "retired: 2 workers adopted" in log
    assert all(infer(workers, "scaled") == (200, [2.0] * 4) for _ in range(10))


@pytest.mark.e2e
def test_a_killed_worker_is_forked_from_a_fresh_zygote_that_exits_too(workers: ServerProcess) -> None:
    old = worker_pids(scrape(workers))
    wait_until(lambda: _adopted(workers, {int(pid) for pid in old.values()}), what="the first zygote gone")
    os.kill(int(old["0"]), signal.SIGKILL)

    def replaced() -> bool:
        samples = scrape(workers)
        now = worker_pids(samples)
        return now.get("0") not in (None, old["0"]) and value(samples, "ortserve_workers_ready") == 2

    wait_until(replaced, timeout_s=90, what="worker 0 forked again")
    now = worker_pids(scrape(workers))
    assert now["1"] == old["1"]
    assert _command(int(now["0"])) == ["-m", "ortserve.supervisor.zygote"]  # a fresh zygote's
    wait_until(lambda: _adopted(workers, {int(pid) for pid in now.values()}), what="the fresh zygote gone")
    assert all(infer(workers, "scaled") == (200, [2.0] * 4) for _ in range(10))
    assert ready_status(workers) == 200


@pytest.mark.e2e
def test_workers_stop_when_the_supervisor_is_killed(workers: ServerProcess) -> None:
    pids = {int(pid) for pid in worker_pids(scrape(workers)).values()}
    wait_until(lambda: _adopted(workers, pids), what="the zygote gone")
    workers.process.kill()  # no signal to pass on: the workers see its pidfd become readable
    workers.process.wait(10)

    def gone(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    wait_until(lambda: all(gone(pid) for pid in pids), timeout_s=30, what="the orphaned workers stopped")
    assert "the supervisor has died: this worker stops" in workers.log()


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
