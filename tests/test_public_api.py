"""The public API: every module's ``__all__`` names things that exist, and the package imports
no web or gRPC library into its core."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import ortserve

MODULES = sorted(
    name
    for _, name, _ in pkgutil.walk_packages(ortserve.__path__, "ortserve.")
    if "_pb2" not in name and not name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_every_name_in_all_exists(name: str) -> None:
    module = importlib.import_module(name)
    for exported in getattr(module, "__all__", []):
        assert hasattr(module, exported), f"{name}.__all__ names {exported!r}, which is not defined"


def test_the_core_imports_no_transport_or_cli_library() -> None:
    code = (
        "import sys; import ortserve.core.dataplane, ortserve.core.scheduler, ortserve.repository.registry; "
        "print(sorted(m for m in ('grpc', 'click', 'httptools', 'uvloop', 'starlette') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
