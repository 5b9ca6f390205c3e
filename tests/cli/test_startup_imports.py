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

# Runs the CLI in this process; a thread waits for ready, then writes what is imported and
# whether the collector is back on (start-up runs with it off) and stops the server.
_PROBE = """
import gc, json, os, runpy, signal, sys, threading, time, urllib.request
out, port = sys.argv[1], sys.argv[2]
def watch():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        time.sleep(0.02)
    modules = sorted(sys.modules)
    for _ in range(250):  # the collector is turned on just after the models load
        if gc.isenabled():
            break
        time.sleep(0.02)
    with open(out, "w") as f:
        json.dump({"modules": modules, "gc": gc.isenabled()}, f)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=watch, daemon=True).start()
sys.argv = ["ortserve", *sys.argv[3:]]
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
        [sys.executable, "-c", _PROBE, str(out), port, *args], capture_output=True, text=True, timeout=120
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
