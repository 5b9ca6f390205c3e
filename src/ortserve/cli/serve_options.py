"""The ``serve`` command's flags, each with its ``ORTSERVE_*`` variable, default and help.

Kept apart from the command itself: the flags are most of its text, and the checks a single
flag can make on its own (callbacks) belong with it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

__all__ = ["serve_options"]

_FC = TypeVar("_FC", bound=Callable[..., object])


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


def _check_quota(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from ortserve.tenancy.gate import parse_quota

    if value is not None:
        try:
            parse_quota(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
    return value


def _restriction(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from ortserve.server.restriction import parse_restriction

    if value is not None:
        try:
            parse_restriction(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
    return value


_OPTIONS = [
    click.option(
        "--model-repository",
        envvar="ORTSERVE_MODEL_REPOSITORY",
        type=click.Path(file_okay=False, path_type=Path),
        required=True,
        help="Folder of <model>/<version>/model.onnx (Triton layout).",
    ),
    click.option(
        "--model-name",
        envvar="ORTSERVE_MODEL_NAME",
        default=None,
        help="Serve the repository's one model (or the model folder it is) under this name "
        "(KServe: the InferenceService's name, {{.Name}}).",
    ),
    click.option(
        "--host", envvar="ORTSERVE_HOST", default="127.0.0.1", help="Address every listener binds to."
    ),
    click.option(
        "--http-port",
        envvar="ORTSERVE_HTTP_PORT",
        type=click.IntRange(0, 65535),
        default=8000,
        help="Open Inference Protocol over HTTP (0: a free port).",
    ),
    click.option(
        "--grpc-port",
        envvar="ORTSERVE_GRPC_PORT",
        type=click.IntRange(-1, 65535),
        default=8001,
        help="Open Inference Protocol over gRPC (-1: off).",
    ),
    click.option(
        "--metrics-port",
        envvar="ORTSERVE_METRICS_PORT",
        type=click.IntRange(-1, 65535),
        default=8002,
        help="Prometheus metrics (-1: off).",
    ),
    click.option(
        "--max-body-bytes",
        envvar="ORTSERVE_MAX_BODY_BYTES",
        type=int,
        default=64 * 1024 * 1024,
        help="Largest request body.",
    ),
    click.option(
        "--max-inflight-bytes",
        envvar="ORTSERVE_MAX_INFLIGHT_BYTES",
        type=click.IntRange(min=1),
        default=1024 * 1024 * 1024,
        help="Memory request bodies may take across all connections (at least twice --max-body-bytes); "
        "past it, 429.",
    ),
    click.option(
        "--max-connections",
        envvar="ORTSERVE_MAX_CONNECTIONS",
        type=click.IntRange(min=1),
        default=10_000,
        help="Open connections, HTTP and gRPC together; at the cap the longest-idle one is closed, "
        "else the new one is refused (HTTP 503, gRPC GOAWAY).",
    ),
    click.option(
        "--intake-lag-ms",
        envvar="ORTSERVE_INTAKE_LAG_MS",
        type=click.FloatRange(min=0.0),
        default=0.0,
        help="Event-loop lag (ms) above which the server stops reading sockets until it catches "
        "up: transport back-pressure for a large crowd of closed-loop clients (0: never; 20 is "
        "a reasonable value, see docs/architecture.md).",
    ),
    click.option(
        "--header-timeout",
        envvar="ORTSERVE_HEADER_TIMEOUT",
        type=click.FloatRange(min=0.001),
        default=10.0,
        help="Seconds an HTTP request head may take to arrive (then 408 and close).",
    ),
    click.option(
        "--keepalive-timeout",
        envvar="ORTSERVE_KEEPALIVE_TIMEOUT",
        type=click.FloatRange(min=0.001),
        default=75.0,
        help="Seconds an idle HTTP keep-alive connection stays open.",
    ),
    click.option(
        "--request-timeout",
        envvar="ORTSERVE_REQUEST_TIMEOUT",
        type=click.FloatRange(min=0.001),
        default=120.0,
        help="Seconds a whole request (HTTP head and body, a gRPC unary call's request) may take "
        "to arrive, whatever its rate (then 408, gRPC DEADLINE_EXCEEDED).",
    ),
    click.option(
        "--request-min-rate",
        envvar="ORTSERVE_REQUEST_MIN_RATE",
        type=click.FloatRange(min=1.0),
        default=500.0,
        help="Bytes per second a request body must average after --header-timeout (a request "
        "may take --header-timeout plus one second per this many bytes).",
    ),
    click.option(
        "--max-connections-per-peer",
        envvar="ORTSERVE_MAX_CONNECTIONS_PER_PEER",
        type=click.IntRange(min=0),
        default=0,
        help="Connections one client address may hold (0: no limit; behind a load balancer every "
        "client may share one address). Past it: HTTP 503, gRPC GOAWAY.",
    ),
    click.option(
        "--grpc-max-message-bytes",
        envvar="ORTSERVE_GRPC_MAX_MESSAGE_BYTES",
        type=int,
        default=None,
        help="Largest gRPC message (default: --max-body-bytes).",
    ),
    click.option(
        "--grpc-keepalive-time",
        envvar="ORTSERVE_GRPC_KEEPALIVE_TIME",
        type=float,
        default=7200.0,
        help="Seconds of idleness before the gRPC server pings a connection.",
    ),
    click.option(
        "--grpc-keepalive-timeout",
        envvar="ORTSERVE_GRPC_KEEPALIVE_TIMEOUT",
        type=float,
        default=20.0,
        help="Seconds a gRPC keepalive ping may go unanswered before the connection closes.",
    ),
    click.option(
        "--grpc-max-concurrent-streams",
        envvar="ORTSERVE_GRPC_MAX_CONCURRENT_STREAMS",
        type=int,
        default=1024,
        help="Most gRPC calls in flight on one connection.",
    ),
    click.option(
        "--intra-op-threads",
        envvar="ORTSERVE_INTRA_OP_THREADS",
        type=int,
        default=None,
        help="ONNX Runtime intra-op threads (default: usable CPUs).",
    ),
    click.option(
        "--inter-op-threads",
        envvar="ORTSERVE_INTER_OP_THREADS",
        type=int,
        default=None,
        help="ONNX Runtime inter-op threads (default: 1).",
    ),
    click.option(
        "--shutdown-grace",
        envvar="ORTSERVE_SHUTDOWN_GRACE",
        type=float,
        default=30.0,
        help="Seconds in-flight requests get on SIGTERM.",
    ),
    click.option(
        "--shutdown-delay",
        envvar="ORTSERVE_SHUTDOWN_DELAY",
        type=click.FloatRange(min=0.0),
        default=5.0,
        help="Seconds after SIGTERM that readiness answers 503 while requests are still served, "
        "before the drain (SIGINT skips it).",
    ),
    click.option(
        "--workers",
        envvar="ORTSERVE_WORKERS",
        default="1",
        callback=_workers,
        help="Server processes sharing the ports (SO_REUSEPORT) under one supervisor; 'auto': one per "
        "usable CPU.",
    ),
    click.option(
        "--log-level",
        envvar="ORTSERVE_LOG_LEVEL",
        default="INFO",
        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    ),
    click.option(
        "--log-format", envvar="ORTSERVE_LOG_FORMAT", default="text", type=click.Choice(["text", "json"])
    ),
    click.option(
        "--access-log/--no-access-log",
        envvar="ORTSERVE_ACCESS_LOG",
        default=False,
        help="One log line per inference request (logger ortserve.access).",
    ),
    click.option(
        "--metrics/--no-metrics",
        envvar="ORTSERVE_METRICS",
        default=True,
        help="Prometheus metrics on --metrics-port and /metrics.",
    ),
    click.option(
        "--metrics-buckets",
        envvar="ORTSERVE_METRICS_BUCKETS",
        default=None,
        callback=_buckets,
        help="Latency histogram bounds in seconds, comma-separated (default 0.0001 .. 10).",
    ),
    click.option(
        "--trace-sampling-ratio",
        envvar="ORTSERVE_TRACE_SAMPLING_RATIO",
        type=click.FloatRange(0.0, 1.0),
        default=0.0,
        help="Fraction of requests traced with OpenTelemetry (needs ortserve[otel]; 0: off).",
    ),
    click.option(
        "--trace-exporter",
        envvar="ORTSERVE_TRACE_EXPORTER",
        type=click.Choice(["otlp", "console"]),
        default="otlp",
        help="Where spans go (otlp reads the OTEL_EXPORTER_OTLP_* variables).",
    ),
    click.option(
        "--ort-telemetry/--no-ort-telemetry",
        envvar="ORTSERVE_ORT_TELEMETRY",
        default=False,
        help="Let ONNX Runtime collect its telemetry (off: ORT_DISABLE_TELEMETRY=1, no device-id store).",
    ),
    click.option(
        "--strict-readiness/--no-strict-readiness",
        envvar="ORTSERVE_STRICT_READINESS",
        default=True,
        help="Ready only when every model is ready; off: ready once loading ends.",
    ),
    click.option(
        "--demo/--no-demo",
        envvar="ORTSERVE_DEMO",
        default=False,
        help="Write the demo models into the repository first if it is empty.",
    ),
    click.option(
        "--capture-dir",
        envvar="ORTSERVE_CAPTURE_DIR",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Record a sample of infer requests here, for `ortserve replay` (default: off).",
    ),
    click.option(
        "--capture-rate",
        envvar="ORTSERVE_CAPTURE_RATE",
        type=click.FloatRange(0.0, 1.0),
        default=0.01,
        help="Fraction of infer requests captured with --capture-dir.",
    ),
    click.option(
        "--capture-redact",
        envvar="ORTSERVE_CAPTURE_REDACT",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help="YAML: secret_file, and JSON paths / headers to hash (HMAC) or drop before captured "
        "requests are written (see docs/operations.md).",
    ),
    click.option(
        "--shared-memory-regions",
        envvar="ORTSERVE_SHARED_MEMORY_REGIONS",
        type=click.IntRange(min=0),
        default=0,
        help="Let clients register up to N system shared-memory regions (0: the extension is off).",
    ),
    click.option(
        "--cuda-shared-memory-regions",
        envvar="ORTSERVE_CUDA_SHARED_MEMORY_REGIONS",
        type=click.IntRange(min=0),
        default=0,
        help="Let clients register up to N CUDA shared-memory regions by IPC handle (0: off; needs CUDA).",
    ),
    click.option(
        "--model-control-mode",
        envvar="ORTSERVE_MODEL_CONTROL_MODE",
        type=click.Choice(["none", "poll", "explicit"]),
        default="none",
        help="none: load at start (SIGHUP re-scans); poll: re-scan periodically; explicit: repository API.",
    ),
    click.option(
        "--repository-poll-secs",
        envvar="ORTSERVE_REPOSITORY_POLL_SECS",
        type=click.FloatRange(min=0.05),
        default=5.0,
        help="Poll mode: seconds between two looks at the repository.",
    ),
    click.option(
        "--require-complete-marker/--no-require-complete-marker",
        envvar="ORTSERVE_REQUIRE_COMPLETE_MARKER",
        default=True,
        help="Re-scans load a version only once ortserve.complete is written into it last "
        "(off: also once its files stop changing, unsafe with preallocating copiers).",
    ),
    click.option(
        "--load-model",
        "load_models",
        envvar="ORTSERVE_LOAD_MODEL",
        multiple=True,
        help="Explicit mode: a model to load at start (repeatable; '*' loads all).",
    ),
    click.option(
        "--http-restricted-api",
        envvar="ORTSERVE_HTTP_RESTRICTED_API",
        default=None,
        callback=_restriction,
        help="model-repository:HEADER=VALUE: repository calls must carry that header.",
    ),
    click.option(
        "--grpc-restricted-protocol",
        envvar="ORTSERVE_GRPC_RESTRICTED_PROTOCOL",
        default=None,
        callback=_restriction,
        help="model-repository:KEY=VALUE: repository calls must carry that metadata.",
    ),
    click.option(
        "--trusted-keys",
        envvar="ORTSERVE_TRUSTED_KEYS",
        type=click.Path(exists=True, path_type=Path),
        default=None,
        help="A .pub file (or a folder of them): every version is checked against its signature at load.",
    ),
    click.option(
        "--require-signed/--no-require-signed",
        envvar="ORTSERVE_REQUIRE_SIGNED",
        default=False,
        help="Refuse unsigned versions (needs --trusted-keys).",
    ),
    click.option(
        "--min-signed-version",
        envvar="ORTSERVE_MIN_SIGNED_VERSION",
        type=click.IntRange(min=0),
        default=0,
        help="Refuse signed versions numbered below N (rollback protection; needs --trusted-keys).",
    ),
    click.option(
        "--enable-fault-injection",
        envvar="ORTSERVE_ENABLE_FAULT_INJECTION",
        is_flag=True,
        default=False,
        help="Honour the faults: sections of model configs (drills and chaos tests; see docs/resilience.md).",
    ),
    click.option(
        "--api-key",
        "api_key",
        envvar="ORTSERVE_API_KEY",
        multiple=True,
        help="A bearer token the data plane requires (Authorization: Bearer <key>; repeatable). "
        "Default: no key needed.",
    ),
    click.option(
        "--api-key-file",
        envvar="ORTSERVE_API_KEY_FILE",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help="More keys, one '<tenant> <token>' per line: each key names its tenant.",
    ),
    click.option(
        "--tenant-quota",
        envvar="ORTSERVE_TENANT_QUOTA",
        default=None,
        callback=_check_quota,
        help="Each tenant's token bucket: requests=R,burst=B (per second); past it 429 + "
        "Retry-After. The tenant is the API key's, else the X-Tenant-Id header. Default: no quota.",
    ),
]


def serve_options(command: _FC) -> _FC:
    """Add every flag of ``serve`` to ``command``, in the order ``--help`` lists them."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command
