"""``ortserve serve`` of an ONNX-only repository starts without what only other models need.

Each heavy library below cost tens of milliseconds of a start (benchmarks/RESULTS.md, "time to
ready"), and a top-level import anywhere on the server's import path brings it back: so a real
server is started in a subprocess and its ``sys.modules`` read once it answers ready.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from model_builders import write_scaled_version
from ortserve.testing import free_port

# Imported only when a model, a flag or a subcommand needs them.
HEAVY = (
    "jinja2",  # chat templates (kind: llm)
    "tokenizers",  # kind: llm
    "llguidance",  # structured output
    "cryptography",  # --trusted-keys
    "scipy",
    "jieba",  # the hotword app
    "grpc",  # grpcio: the load generator's gRPC client
    "ortserve.quantization",
    "ortserve.cli.loadtest",
    "ortserve.llm.engine",
    "ortserve.llm.loader",
    "ortserve.supervisor.supervisor",  # --workers N only
    "ortserve.supervisor.zygote",
)

# Runs the CLI in this process and records what is imported when start-up turns the collector
# back on (it runs with it off), then stops the server. That call comes once the models are
# loaded, inside the callback that ends with the server ready: the record is taken right after
# that callback, so at ready, with no polling. Never turned on, the server is stopped after 60 s
# with nothing recorded, and the test fails.
_PROBE = """
import asyncio, gc, json, os, runpy, signal, sys, threading
out = sys.argv[1]
enable = gc.enable
def record():
    with open(out, "w") as f:
        json.dump({"modules": sorted(sys.modules), "gc": gc.isenabled()}, f)
    os.kill(os.getpid(), signal.SIGTERM)
def enabled():
    enable()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # the command's own end turns it on too, with no loop running
    loop.call_soon(record)
gc.enable = enabled
stop = threading.Timer(60, os.kill, (os.getpid(), signal.SIGTERM))
stop.daemon = True
stop.start()
sys.argv = ["ortserve", *sys.argv[2:]]
runpy.run_module("ortserve", run_name="__main__")
"""


def _modules_at_ready(tmp_path: Path, *flags: str) -> dict[str, object]:
    repository = tmp_path / "models"
    write_scaled_version(repository, "small", 1, 2.0)
    out = tmp_path / "modules.json"
    port = str(free_port())
    args = ["serve", "--model-repository", str(repository), "--http-port", port]
    args += ["--metrics-port", "-1", "--shutdown-delay", "0", *flags]
    completed = subprocess.run(
        [sys.executable, "-c", _PROBE, str(out), *args], capture_output=True, text=True, timeout=120
    )
    assert out.exists(), completed.stderr[-3000:]
    result: dict[str, object] = json.loads(out.read_text())
    return result


def _imported(modules: object, name: str) -> bool:
    assert isinstance(modules, list)
    return any(m == name or m.startswith(name + ".") for m in modules)


def test_an_onnx_only_repository_starts_without_heavy_modules(tmp_path: Path) -> None:
    seen = _modules_at_ready(tmp_path, "--grpc-port", str(free_port()))
    assert _imported(seen["modules"], "onnxruntime")  # the probe saw a served model
    assert _imported(seen["modules"], "ortserve.server.grpc")  # and the gRPC listener
    assert [name for name in HEAVY if _imported(seen["modules"], name)] == []
    assert seen["gc"] is True  # off for the start only


def test_serve_starts_with_the_collector_off_until_the_heap_is_frozen() -> None:
    import gc

    import click
    from click.testing import CliRunner

    from ortserve.cli.main import main
    from ortserve.server.collector import freeze_startup_heap

    try:
        assert main.callback is not None
        with click.Context(main) as ctx:
            ctx.invoked_subcommand = "demo"
            ctx.invoke(main.callback)
            assert gc.isenabled()  # other commands keep it
        with click.Context(main) as ctx:
            ctx.invoked_subcommand = "serve"
            ctx.invoke(main.callback)
            assert not gc.isenabled()
            freeze_startup_heap()  # what Server.load calls once the models are loaded
            assert gc.isenabled()
            gc.disable()
        assert gc.isenabled()  # and the command's end, however it ends
        assert CliRunner().invoke(main, ["serve", "--workers", "nonsense"]).exit_code != 0
        assert gc.isenabled()  # a refused serve does not leave it off
    finally:
        gc.enable()
        gc.unfreeze()


def test_the_supervisor_of_workers_does_not_import_onnxruntime() -> None:
    # Its zygote defers ONNX Runtime (the import starts a thread, and a fork copies one):
    # imported in the supervisor, every --workers N start failed ("already imported").
    probe = "import sys, ortserve.supervisor.supervisor; print('onnxruntime' in sys.modules)"
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert completed.stdout.strip() == "False", completed.stderr[-3000:]


def test_the_zygote_imports_the_server_without_using_onnxruntime() -> None:
    # The zygote of --workers imports every worker's modules with ONNX Runtime deferred; a
    # module that reads an ONNX Runtime name at import (a type alias, say) breaks every start.
    probe = "from ortserve.supervisor.zygote import preload; preload(); print('forkable')"
    environment = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=environment
    )
    assert completed.stdout.strip() == "forkable", completed.stderr[-3000:]
