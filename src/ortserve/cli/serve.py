"""The ``serve`` command: check the flags together, build the settings, start the server."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import click

from ortserve.cli.errors import StartupFailure
from ortserve.cli.flag_settings import settings_from_flags
from ortserve.cli.serve_options import serve_options

__all__ = ["serve"]

logger = logging.getLogger("ortserve.cli")


@click.command()
@serve_options
def serve(**flags: Any) -> None:
    """Serve a model repository until SIGTERM/SIGINT, then drain and exit 0."""
    from ortserve.errors import RepositoryError
    from ortserve.logs import configure_logging
    from ortserve.ort_runtime import prepare_onnxruntime
    from ortserve.server.startup import StartupError

    # What the command reads itself; every flag goes on to the settings as it is.
    model_repository = flags["model_repository"]
    model_name = flags["model_name"]
    max_body_bytes = flags["max_body_bytes"]
    max_inflight_bytes = flags["max_inflight_bytes"]
    workers = flags["workers"]
    log_level = flags["log_level"]
    log_format = flags["log_format"]
    ort_telemetry = flags["ort_telemetry"]
    demo = flags["demo"]
    shared_memory_regions = flags["shared_memory_regions"]
    trusted_keys = flags["trusted_keys"]
    require_signed = flags["require_signed"]
    min_signed_version = flags["min_signed_version"]

    if require_signed and trusted_keys is None:
        raise click.BadParameter("needs --trusted-keys", param_hint="--require-signed")
    if min_signed_version and trusted_keys is None:
        raise click.BadParameter("needs --trusted-keys", param_hint="--min-signed-version")
    if workers > 1 and (shared_memory_regions or flags["cuda_shared_memory_regions"]):
        # Each worker is a process with its own registry: a region registered through one
        # connection was unknown to the other workers (a 400 on their connections).
        message = "is not available with --workers above 1 (each worker would have its own regions)"
        hint = "--shared-memory-regions" if shared_memory_regions else "--cuda-shared-memory-regions"
        raise click.BadParameter(message, param_hint=hint)
    if max_inflight_bytes < 2 * max_body_bytes:
        message = "must be at least twice --max-body-bytes (bodies held, and one being joined)"
        raise click.BadParameter(message, param_hint="--max-inflight-bytes")
    prepare_onnxruntime(ort_telemetry)  # before ONNX Runtime is first imported
    configure_logging(log_level, log_format)
    if demo and not (model_repository.is_dir() and any(model_repository.iterdir())):
        from ortserve.demo import write_demo_repository
        from ortserve.llm.demo import write_demo_llm

        logger.info("writing the demo models into %s (this takes a few seconds)", model_repository)
        names = [*write_demo_repository(model_repository), write_demo_llm(model_repository)]
        logger.info("wrote the demo models: %s", ", ".join(names))
    if model_name is not None:
        from ortserve.repository.single_model import single_model_view

        try:
            model_repository = single_model_view(model_repository, model_name)
        except RepositoryError as exc:
            raise StartupFailure(str(exc)) from None
    settings = settings_from_flags({**flags, "model_repository": model_repository})
    try:
        if workers > 1:
            from ortserve.supervisor import exec_supervisor

            exec_supervisor(settings, workers)  # does not return: this process becomes it
        else:
            from ortserve.server.lifecycle import serve as run_server

            _run(run_server(settings))
    except (StartupError, RepositoryError) as exc:  # an operator's to fix: one line, no traceback
        raise StartupFailure(str(exc)) from None


def _run(coro: object) -> None:
    try:
        import uvloop

        uvloop.run(coro)  # type: ignore[arg-type]
    except ImportError:
        asyncio.run(coro)  # type: ignore[arg-type]
