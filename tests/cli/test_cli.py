"""The command line: one clean line (JSON when asked) and an exit code for every startup error."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ortserve.cli.main import main
from ortserve.server.lifecycle import Server, StartupError
from ortserve.settings import ServerSettings
from ortserve.testing import free_port


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def test_an_invalid_flag_value_is_one_json_line_with_exit_code_2(tmp_path: Path) -> None:
    result = invoke(
        "serve", "--model-repository", str(tmp_path), "--http-port", "99999", "--log-format", "json"
    )
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    entry = json.loads(line)
    assert entry["level"] == "ERROR"
    assert "--http-port" in entry["message"] and "0<=x<=65535" in entry["message"]


def test_a_missing_repository_is_one_line_with_exit_code_1(tmp_path: Path) -> None:
    result = invoke("serve", "--model-repository", str(tmp_path / "typo"), "--http-port", "0")
    assert result.exit_code == 1
    (line,) = result.stderr.splitlines()
    assert line.endswith(f"ERROR ortserve.cli: model repository {tmp_path / 'typo'} is not a folder")


async def test_the_repository_is_checked_before_any_port_is_bound(tmp_path: Path) -> None:
    server = Server(ServerSettings(tmp_path / "typo", http_port=0, grpc_port=0, metrics_port=0))
    with pytest.raises(StartupError, match="is not a folder"):
        await server.start()
    assert server.bound is None


def test_a_port_in_use_is_one_json_line_and_exit_code_1_from_the_real_command(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["--model-repository", str(tmp_path), "--http-port", str(port), "--log-format", "json"]
        args += ["--grpc-port", str(free_port()), "--metrics-port", "-1"]
        done = subprocess.run(
            [sys.executable, "-m", "ortserve", "serve", *args], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert (
        json.loads(line)["message"] == f"cannot listen for HTTP on 127.0.0.1:{port}: Address already in use"
    )


def test_help_names_each_options_environment_variable_and_h_is_help() -> None:
    result = invoke("serve", "-h")
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for variable in ("ORTSERVE_MODEL_REPOSITORY", "ORTSERVE_HTTP_PORT", "ORTSERVE_CAPTURE_RATE"):
        assert f"env var: {variable}" in text
    assert "env var: ORTSERVE_BENCH_" in " ".join(invoke("bench", "-h").output.split())
    assert invoke("-h").exit_code == 0


def test_serve_demo_says_what_it_is_doing_while_it_builds_the_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ortserve.demo

    def write(root: Path) -> list[str]:  # the real one trains for seconds; its output is not the point
        root.mkdir()
        return ["small_mlp", "hotword"]

    monkeypatch.setattr(ortserve.demo, "write_demo_repository", write)
    with socket.socket() as taken:  # then stop at once: the HTTP port is taken
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        repository = tmp_path / "models"
        result = invoke(
            "serve",
            "--demo",
            "--model-repository",
            str(repository),
            "--http-port",
            str(taken.getsockname()[1]),
        )
    assert result.exit_code == 1
    writing, wrote, failed = result.stderr.splitlines()
    assert writing.endswith(f"writing the demo models into {repository} (this takes a few seconds)")
    assert wrote.endswith("wrote the demo models: small_mlp, hotword, tiny_llm")
    assert "Address already in use" in failed


def test_a_bare_ortserve_shows_its_help_not_an_error_line() -> None:
    result = invoke()
    assert result.exit_code == 2
    assert result.output.startswith("Usage: ") and "ERROR" not in result.output


def test_shared_memory_with_several_workers_is_refused_naming_both_flags(tmp_path: Path) -> None:
    """Each worker is a process with its own registry: a region registered through one was a
    400 on the others' connections. Refused at start rather than half working."""
    result = invoke(
        "serve", "--model-repository", str(tmp_path), "--workers", "2", "--shared-memory-regions", "4"
    )
    assert result.exit_code == 2
    assert "--shared-memory-regions" in result.stderr and "--workers above 1" in result.stderr
