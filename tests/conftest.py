"""Shared fixtures: the demo repository and one real server process for end-to-end tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory
from pathlib import Path

import pytest

from model_builders import ERROR_SERVER_MAX_BODY, ERROR_SERVER_SHM_REGIONS, write_error_repository
from ortserve.demo import write_demo_repository
from ortserve.testing import ServerProcess, run_server


@pytest.fixture(scope="session")
def demo_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    write_demo_repository(root)
    return root


@pytest.fixture(scope="session")
def server(demo_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One ``ortserve serve`` on the demo models, shared by the end-to-end tests."""
    log = tmp_path_factory.mktemp("logs") / "server.log"
    with run_server(demo_repository, log) as process:
        yield process


@pytest.fixture(scope="session")
def error_repository_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server on the error-path repository (slow, failing, typed, broken, bad_config models)."""
    root = tmp_path_factory.mktemp("error-models")
    write_error_repository(root)
    log = tmp_path_factory.mktemp("error-logs") / "server.log"
    args = [
        "--no-strict-readiness",
        "--max-body-bytes",
        str(ERROR_SERVER_MAX_BODY),
        "--intra-op-threads",
        "1",
        "--shared-memory-regions",
        str(ERROR_SERVER_SHM_REGIONS),
    ]
    with run_server(root, log, args) as process:
        yield process


@pytest.fixture
def block() -> Iterator[shared_memory.SharedMemory]:
    """A fresh 64 KiB POSIX shared-memory object, as tritonclient creates them; removed after."""
    created = shared_memory.SharedMemory(f"ortserve-test-{uuid.uuid4().hex}", create=True, size=65536)
    yield created
    created.close()
    created.unlink()
