"""The ``ortserve`` command: serve, demo."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import click

from ortserve import __version__
from ortserve.cli.errors import CleanErrorsGroup, StartupFailure, show_envvars
from ortserve.cli.loadtest import bench, replay
from ortserve.cli.quantize import quantize
from ortserve.cli.signing import keygen, sign

__all__ = ["main"]

logger = logging.getLogger("ortserve.cli")


@click.group(
    cls=CleanErrorsGroup,
    context_settings={
        "auto_envvar_prefix": "ORTSERVE",
        "show_default": True,
        "help_option_names": ["-h", "--help"],
    },
)
@click.version_option(__version__, prog_name="ortserve")
def main() -> None:
    """Serve ONNX models over the Open Inference Protocol (KServe v2)."""


def _buckets(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[float, ...] | None:
    from ortserve.metrics import parse_buckets

    if value is None:
        return None
    try:
        return parse_buckets(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _workers(ctx: click.Context, param: click.Parameter, value: str) -> int:
    from ortserve.supervisor.plan import parse_workers

    try:
        return parse_workers(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _restriction(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from ortserve.server.restriction import parse_restriction

    if value is not None:
        try:
            parse_restriction(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
    return value


@main.command()
@click.option(
    "--model-repository",
    envvar="ORTSERVE_MODEL_REPOSITORY",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder of <model>/<version>/model.onnx (Triton layout).",
)
@click.option("--host", envvar="ORTSERVE_HOST", default="127.0.0.1", help="Address every listener binds to.")
@click.option(
    "--http-port",
    envvar="ORTSERVE_HTTP_PORT",
    type=click.IntRange(0, 65535),
    default=8000,
    help="Open Inference Protocol over HTTP (0: a free port).",
)
@click.option(
    "--grpc-port",
    envvar="ORTSERVE_GRPC_PORT",
    type=click.IntRange(-1, 65535),
    default=8001,
    help="Open Inference Protocol over gRPC (-1: off).",
)
@click.option(
    "--metrics-port",
    envvar="ORTSERVE_METRICS_PORT",
    type=click.IntRange(-1, 65535),
    default=8002,
    help="Prometheus metrics (-1: off).",
)
@click.option(
    "--max-body-bytes",
    envvar="ORTSERVE_MAX_BODY_BYTES",
    type=int,
    default=64 * 1024 * 1024,
    help="Largest request body.",
)
@click.option(
    "--max-inflight-bytes",
    envvar="ORTSERVE_MAX_INFLIGHT_BYTES",
    type=click.IntRange(min=1),
    default=1024 * 1024 * 1024,
    help="Memory request bodies may take across all connections (at least twice --max-body-bytes); "
    "past it, 429.",
)
@click.option(
    "--max-connections",
    envvar="ORTSERVE_MAX_CONNECTIONS",
    type=click.IntRange(min=1),
    default=10_000,
    help="Open connections, HTTP and gRPC together; at the cap the longest-idle one is closed, "
    "else the new one is refused (HTTP 503, gRPC GOAWAY).",
)
@click.option(
    "--intake-lag-ms",
    envvar="ORTSERVE_INTAKE_LAG_MS",
    type=click.FloatRange(min=0.0),
    default=0.0,
    help="Event-loop lag (ms) above which the server stops reading sockets until it catches "
    "up: transport back-pressure for a large crowd of closed-loop clients (0: never; 20 is "
    "a reasonable value, see docs/architecture.md).",
)
@click.option(
    "--header-timeout",
    envvar="ORTSERVE_HEADER_TIMEOUT",
    type=click.FloatRange(min=0.001),
    default=10.0,
    help="Seconds an HTTP request head may take to arrive (then 408 and close).",
)
@click.option(
    "--keepalive-timeout",
    envvar="ORTSERVE_KEEPALIVE_TIMEOUT",
    type=click.FloatRange(min=0.001),
    default=75.0,
    help="Seconds an idle HTTP keep-alive connection stays open.",
)
@click.option(
    "--grpc-max-message-bytes",
    envvar="ORTSERVE_GRPC_MAX_MESSAGE_BYTES",
    type=int,
    default=None,
    help="Largest gRPC message (default: --max-body-bytes).",
)
@click.option(
    "--grpc-keepalive-time",
    envvar="ORTSERVE_GRPC_KEEPALIVE_TIME",
    type=float,
    default=7200.0,
    help="Seconds of idleness before the gRPC server pings a connection.",
)
@click.option(
    "--grpc-keepalive-timeout",
    envvar="ORTSERVE_GRPC_KEEPALIVE_TIMEOUT",
    type=float,
    default=20.0,
    help="Seconds a gRPC keepalive ping may go unanswered before the connection closes.",
)
@click.option(
    "--grpc-max-concurrent-streams",
    envvar="ORTSERVE_GRPC_MAX_CONCURRENT_STREAMS",
    type=int,
    default=1024,
    help="Most gRPC calls in flight on one connection.",
)
@click.option(
    "--intra-op-threads",
    envvar="ORTSERVE_INTRA_OP_THREADS",
    type=int,
    default=None,
    help="ONNX Runtime intra-op threads (default: usable CPUs).",
)
@click.option(
    "--inter-op-threads",
    envvar="ORTSERVE_INTER_OP_THREADS",
    type=int,
    default=None,
    help="ONNX Runtime inter-op threads (default: 1).",
)
@click.option(
    "--shutdown-grace",
    envvar="ORTSERVE_SHUTDOWN_GRACE",
    type=float,
    default=30.0,
    help="Seconds in-flight requests get on SIGTERM.",
)
@click.option(
    "--shutdown-delay",
    envvar="ORTSERVE_SHUTDOWN_DELAY",
    type=click.FloatRange(min=0.0),
    default=5.0,
    help="Seconds after SIGTERM that readiness answers 503 while requests are still served, "
    "before the drain (SIGINT skips it).",
)
@click.option(
    "--workers",
    envvar="ORTSERVE_WORKERS",
    default="1",
    callback=_workers,
    help="Server processes sharing the ports (SO_REUSEPORT) under one supervisor; 'auto': one per "
    "usable CPU.",
)
@click.option(
    "--log-level",
    envvar="ORTSERVE_LOG_LEVEL",
    default="INFO",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.option(
    "--log-format", envvar="ORTSERVE_LOG_FORMAT", default="text", type=click.Choice(["text", "json"])
)
@click.option(
    "--access-log/--no-access-log",
    envvar="ORTSERVE_ACCESS_LOG",
    default=False,
    help="One log line per inference request (logger ortserve.access).",
)
@click.option(
    "--metrics/--no-metrics",
    envvar="ORTSERVE_METRICS",
    default=True,
    help="Prometheus metrics on --metrics-port and /metrics.",
)
@click.option(
    "--metrics-buckets",
    envvar="ORTSERVE_METRICS_BUCKETS",
    default=None,
    callback=_buckets,
    help="Latency histogram bounds in seconds, comma-separated (default 0.0001 .. 10).",
)
@click.option(
    "--trace-sampling-ratio",
    envvar="ORTSERVE_TRACE_SAMPLING_RATIO",
    type=click.FloatRange(0.0, 1.0),
    default=0.0,
    help="Fraction of requests traced with OpenTelemetry (needs ortserve[otel]; 0: off).",
)
@click.option(
    "--trace-exporter",
    envvar="ORTSERVE_TRACE_EXPORTER",
    type=click.Choice(["otlp", "console"]),
    default="otlp",
    help="Where spans go (otlp reads the OTEL_EXPORTER_OTLP_* variables).",
)
@click.option(
    "--strict-readiness/--no-strict-readiness",
    envvar="ORTSERVE_STRICT_READINESS",
    default=True,
    help="Ready only when every model is ready; off: ready once loading ends.",
)
@click.option(
    "--demo/--no-demo",
    envvar="ORTSERVE_DEMO",
    default=False,
    help="Write the demo models into the repository first if it is empty.",
)
@click.option(
    "--capture-dir",
    envvar="ORTSERVE_CAPTURE_DIR",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Record a sample of infer requests here, for `ortserve replay` (default: off).",
)
@click.option(
    "--capture-rate",
    envvar="ORTSERVE_CAPTURE_RATE",
    type=click.FloatRange(0.0, 1.0),
    default=0.01,
    help="Fraction of infer requests captured with --capture-dir.",
)
@click.option(
    "--shared-memory-regions",
    envvar="ORTSERVE_SHARED_MEMORY_REGIONS",
    type=click.IntRange(min=0),
    default=0,
    help="Let clients register up to N system shared-memory regions (0: the extension is off).",
)
@click.option(
    "--model-control-mode",
    envvar="ORTSERVE_MODEL_CONTROL_MODE",
    type=click.Choice(["none", "poll", "explicit"]),
    default="none",
    help="none: load at start (SIGHUP re-scans); poll: re-scan periodically; explicit: repository API.",
)
@click.option(
    "--repository-poll-secs",
    envvar="ORTSERVE_REPOSITORY_POLL_SECS",
    type=click.FloatRange(min=0.05),
    default=5.0,
    help="Poll mode: seconds between two looks at the repository.",
)
@click.option(
    "--load-model",
    "load_models",
    envvar="ORTSERVE_LOAD_MODEL",
    multiple=True,
    help="Explicit mode: a model to load at start (repeatable; '*' loads all).",
)
@click.option(
    "--http-restricted-api",
    envvar="ORTSERVE_HTTP_RESTRICTED_API",
    default=None,
    callback=_restriction,
    help="model-repository:HEADER=VALUE: repository calls must carry that header.",
)
@click.option(
    "--grpc-restricted-protocol",
    envvar="ORTSERVE_GRPC_RESTRICTED_PROTOCOL",
    default=None,
    callback=_restriction,
    help="model-repository:KEY=VALUE: repository calls must carry that metadata.",
)
@click.option(
    "--trusted-keys",
    envvar="ORTSERVE_TRUSTED_KEYS",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="A .pub file (or a folder of them): every version is checked against its signature at load.",
)
@click.option(
    "--require-signed/--no-require-signed",
    envvar="ORTSERVE_REQUIRE_SIGNED",
    default=False,
    help="Refuse unsigned versions (needs --trusted-keys).",
)
@click.option(
    "--enable-fault-injection",
    envvar="ORTSERVE_ENABLE_FAULT_INJECTION",
    is_flag=True,
    default=False,
    help="Honour the faults: sections of model configs (drills and chaos tests; see docs/resilience.md).",
)
def serve(
    model_repository: Path,
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
    strict_readiness: bool,
    demo: bool,
    capture_dir: Path | None,
    capture_rate: float,
    shared_memory_regions: int,
    model_control_mode: str,
    repository_poll_secs: float,
    load_models: tuple[str, ...],
    http_restricted_api: str | None,
    grpc_restricted_protocol: str | None,
    trusted_keys: Path | None,
    require_signed: bool,
    enable_fault_injection: bool,
) -> None:
    """Serve a model repository until SIGTERM/SIGINT, then drain and exit 0."""
    from ortserve.errors import RepositoryError
    from ortserve.logs import configure_logging
    from ortserve.server.startup import StartupError
    from ortserve.settings import ServerSettings

    if require_signed and trusted_keys is None:
        raise click.BadParameter("needs --trusted-keys", param_hint="--require-signed")
    if max_inflight_bytes < 2 * max_body_bytes:
        message = "must be at least twice --max-body-bytes (bodies held, and one being joined)"
        raise click.BadParameter(message, param_hint="--max-inflight-bytes")
    configure_logging(log_level, log_format)
    if demo and not (model_repository.is_dir() and any(model_repository.iterdir())):
        from ortserve.demo import write_demo_repository
        from ortserve.llm.demo import write_demo_llm

        logger.info("writing the demo models into %s (this takes a few seconds)", model_repository)
        names = [*write_demo_repository(model_repository), write_demo_llm(model_repository)]
        logger.info("wrote the demo models: %s", ", ".join(names))
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
        shared_memory_regions=shared_memory_regions,
        model_control_mode=model_control_mode,
        repository_poll_secs=repository_poll_secs,
        load_models=load_models,
        http_restricted_api=http_restricted_api,
        grpc_restricted_protocol=grpc_restricted_protocol,
        trusted_keys=trusted_keys,
        require_signed=require_signed,
        enable_fault_injection=enable_fault_injection,
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


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def demo(directory: Path) -> None:
    """Write the demo model repository (seeded MLPs, seed apps, a small LLM) into DIRECTORY."""
    from ortserve.demo import write_demo_repository
    from ortserve.llm.demo import write_demo_llm

    names = [*write_demo_repository(directory), write_demo_llm(directory)]
    click.echo(f"wrote {', '.join(names)} to {directory}")


main.add_command(bench)
main.add_command(replay)
main.add_command(keygen)
main.add_command(sign)
main.add_command(quantize)
show_envvars(main)
