"""The ``serve`` command: check the flags together, build the settings, start the server."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import click

from ortserve.cli.errors import StartupFailure
from ortserve.cli.serve_options import serve_options

__all__ = ["serve"]

logger = logging.getLogger("ortserve.cli")


@click.command()
@serve_options
def serve(
    model_repository: Path,
    model_name: str | None,
    host: str,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    max_body_bytes: int,
    max_inflight_bytes: int,
    max_connections: int,
    header_timeout: float,
    intake_lag_ms: float,
    keepalive_timeout: float,
    request_timeout: float,
    request_min_rate: float,
    max_connections_per_peer: int,
    grpc_max_message_bytes: int | None,
    grpc_keepalive_time: float,
    grpc_keepalive_timeout: float,
    grpc_max_concurrent_streams: int,
    intra_op_threads: int | None,
    inter_op_threads: int | None,
    shutdown_grace: float,
    shutdown_delay: float,
    workers: int,
    log_level: str,
    log_format: str,
    access_log: bool,
    metrics: bool,
    metrics_buckets: tuple[float, ...] | None,
    trace_sampling_ratio: float,
    trace_exporter: str,
    ort_telemetry: bool,
    strict_readiness: bool,
    demo: bool,
    capture_dir: Path | None,
    capture_rate: float,
    capture_redact: Path | None,
    shared_memory_regions: int,
    model_control_mode: str,
    repository_poll_secs: float,
    require_complete_marker: bool,
    load_models: tuple[str, ...],
    http_restricted_api: str | None,
    grpc_restricted_protocol: str | None,
    trusted_keys: Path | None,
    require_signed: bool,
    min_signed_version: int,
    enable_fault_injection: bool,
    api_key: tuple[str, ...],
    api_key_file: Path | None,
    tenant_quota: str | None,
) -> None:
    """Serve a model repository until SIGTERM/SIGINT, then drain and exit 0."""
    from ortserve.errors import RepositoryError
    from ortserve.logs import configure_logging
    from ortserve.ort_runtime import prepare_onnxruntime
    from ortserve.server.startup import StartupError
    from ortserve.settings import ServerSettings

    if require_signed and trusted_keys is None:
        raise click.BadParameter("needs --trusted-keys", param_hint="--require-signed")
    if min_signed_version and trusted_keys is None:
        raise click.BadParameter("needs --trusted-keys", param_hint="--min-signed-version")
    if workers > 1 and shared_memory_regions:
        # Each worker is a process with its own registry: a region registered through one
        # connection was unknown to the other workers (a 400 on their connections).
        message = "is not available with --workers above 1 (each worker would have its own regions)"
        raise click.BadParameter(message, param_hint="--shared-memory-regions")
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
    settings = ServerSettings(
        model_repository=model_repository,
        host=host,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        max_body_bytes=max_body_bytes,
        max_inflight_bytes=max_inflight_bytes,
        max_connections=max_connections,
        header_timeout_s=header_timeout,
        intake_lag_ms=intake_lag_ms,
        keepalive_timeout_s=keepalive_timeout,
        request_timeout_s=request_timeout,
        request_min_rate=request_min_rate,
        max_connections_per_peer=max_connections_per_peer,
        grpc_max_message_bytes=grpc_max_message_bytes,
        grpc_keepalive_time_s=grpc_keepalive_time,
        grpc_keepalive_timeout_s=grpc_keepalive_timeout,
        grpc_max_concurrent_streams=grpc_max_concurrent_streams,
        intra_op_threads=intra_op_threads,
        inter_op_threads=inter_op_threads,
        shutdown_grace_s=shutdown_grace,
        shutdown_delay_s=shutdown_delay,
        log_level=log_level,
        log_format=log_format,
        access_log=access_log,
        metrics=metrics,
        metrics_buckets=metrics_buckets,
        trace_sampling_ratio=trace_sampling_ratio,
        trace_exporter=trace_exporter,
        strict_readiness=strict_readiness,
        capture_dir=capture_dir,
        capture_rate=capture_rate,
        capture_redact=capture_redact,
        shared_memory_regions=shared_memory_regions,
        model_control_mode=model_control_mode,
        repository_poll_secs=repository_poll_secs,
        require_complete_marker=require_complete_marker,
        load_models=load_models,
        http_restricted_api=http_restricted_api,
        grpc_restricted_protocol=grpc_restricted_protocol,
        trusted_keys=trusted_keys,
        require_signed=require_signed,
        min_signed_version=min_signed_version,
        enable_fault_injection=enable_fault_injection,
        api_keys=api_key,
        api_key_file=api_key_file,
        tenant_quota=tenant_quota,
    )
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
