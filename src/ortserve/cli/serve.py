"""The ``serve`` command: check the flags together, build the settings, start the server."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import click

from ortserve.cli.errors import StartupFailure
from ortserve.cli.flag_settings import command_and_settings
from ortserve.cli.serve_options import serve_options

__all__ = ["serve"]

logger = logging.getLogger("ortserve.cli")


@click.command()
@serve_options
def serve(**flags: Any) -> None:
    """Serve a model repository until SIGTERM/SIGINT, then drain and exit 0.

    The flags become one ``ServerSettings`` (and the command's own few); the server is
    given that object."""
    from ortserve.errors import RepositoryError
    from ortserve.logs import configure_logging
    from ortserve.ort_runtime import prepare_onnxruntime
    from ortserve.server.startup import StartupError

    command, settings = command_and_settings(flags)  # each flag declared once (settings.py)
    model_repository = settings.model_repository
    if settings.require_signed and settings.trusted_keys is None:
        raise click.BadParameter("needs --trusted-keys", param_hint="--require-signed")
    if settings.min_signed_version and settings.trusted_keys is None:
        raise click.BadParameter("needs --trusted-keys", param_hint="--min-signed-version")
    if command.workers > 1 and (settings.shared_memory_regions or settings.cuda_shared_memory_regions):
        # Each worker is a process with its own registry: a region registered through one
        # connection was unknown to the other workers (a 400 on their connections).
        message = "is not available with --workers above 1 (each worker would have its own regions)"
        hint = "--shared-memory-regions" if settings.shared_memory_regions else "--cuda-shared-memory-regions"
        raise click.BadParameter(message, param_hint=hint)
    if settings.max_inflight_bytes < 2 * settings.max_body_bytes:
        message = "must be at least twice --max-body-bytes (bodies held, and one being joined)"
        raise click.BadParameter(message, param_hint="--max-inflight-bytes")
    prepare_onnxruntime(command.ort_telemetry)  # before ONNX Runtime is first imported
    configure_logging(settings.log_level, settings.log_format)
    if command.demo and not (model_repository.is_dir() and any(model_repository.iterdir())):
        from ortserve.demo import write_demo_repository
        from ortserve.llm.demo import write_demo_llm

        logger.info("writing the demo models into %s (this takes a few seconds)", model_repository)
        names = [*write_demo_repository(model_repository), write_demo_llm(model_repository)]
        logger.info("wrote the demo models: %s", ", ".join(names))
    if command.model_name is not None:
        from ortserve.repository.single_model import single_model_view

        try:
            view = single_model_view(model_repository, command.model_name)
        except RepositoryError as exc:
            raise StartupFailure(str(exc)) from None
        settings = dataclasses.replace(settings, model_repository=view)
    try:
        if command.workers > 1:
            from ortserve.supervisor import exec_supervisor

            exec_supervisor(settings, command.workers)  # does not return: this process becomes it
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
