"""Server-wide settings: built once at the CLI edge, frozen, and passed down.

Each setting is declared once, as a field of :class:`ServerSettings` made by :func:`setting`:
its type, its default and its :class:`Flag` (the help text, the bounds or choices, how its text
is checked). From that one declaration ``cli/serve_options.py`` makes the ``serve`` command's
flag and its ``ORTSERVE_*`` environment variable and ``--help`` line, and the README's table
of server flags is generated (``python -m ortserve.cli.serve_options``; a test keeps the README
equal to it). Nothing here imports click: the CLI reads the table.
"""

# ruff: noqa: RUF009  (each default is a field made by setting(): the declaration is the table)
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Flag", "ServerSettings", "setting"]


@dataclass(frozen=True, slots=True)
class Flag:
    """How a setting is given on the command line (and in the environment)."""

    help: str
    """The ``--help`` text and the README's description."""
    name: str = ""
    """The flag without its dashes when it is not the field's name (``header-timeout`` for
    ``header_timeout_s``); its environment variable is ``ORTSERVE_`` and it in capitals."""
    low: float | None = None
    """Smallest value accepted (numbers)."""
    high: float | None = None
    """Largest value accepted (numbers)."""
    choices: tuple[str, ...] = ()
    """The accepted words (any case)."""
    path: str = ""
    """``dir``, ``file`` or ``any``: what a path names; ``exists``: it must exist."""
    exists: bool = False
    parse: str = ""
    """``module:function`` that reads the text (ValueError: a usage error); its result is the
    value, or, when ``check_only``, the text is kept once it passed."""
    check_only: bool = False
    shown_default: str = ""
    """The README's default, where the value itself says less (``64 MiB``, ``usable CPUs``)."""


def setting(default: Any = dataclasses.MISSING, help: str = "", **flag: Any) -> Any:
    """A settings field with its flag (see :class:`Flag`); ``flag=None``: no flag (set by the
    server itself)."""
    metadata = {} if flag.get("flag", True) is None else {"flag": Flag(help, **flag)}
    return dataclasses.field(default=default, metadata=metadata)


_POSITIVE_SECONDS = {"low": 0.001}


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Every knob the server reads; per-model knobs live in each model's ``config.yaml``."""

    model_repository: Path = setting(
        help="Folder of <model>/<version>/model.onnx (Triton layout).", path="dir"
    )
    host: str = setting("127.0.0.1", "Address every listener binds to.")
    http_port: int = setting(8000, "Open Inference Protocol over HTTP (0: a free port).", low=0, high=65535)
    grpc_port: int = setting(8001, "Open Inference Protocol over gRPC (-1: off).", low=-1, high=65535)
    metrics_port: int = setting(
        8002, "Prometheus metrics (-1: off; /metrics stays on the HTTP port).", low=-1, high=65535
    )
    max_body_bytes: int = setting(
        64 * 1024 * 1024,
        "Largest request body (HTTP) or message (gRPC); larger is 413.",
        low=1,
        shown_default="64 MiB",
    )
    max_inflight_bytes: int = setting(
        1024 * 1024 * 1024,
        "Request bytes held at once over all HTTP and gRPC connections (at least twice "
        "--max-body-bytes); an HTTP request past it gets 429 + Retry-After without its body being "
        "buffered, a gRPC call RESOURCE_EXHAUSTED.",
        low=1,
        shown_default="1 GiB",
    )
    max_json_depth: int = setting(32, flag=None)
    max_tensor_elements: int = setting(64 * 1024 * 1024, flag=None)
    max_bytes_element: int = setting(16 * 1024 * 1024, flag=None)
    max_connections: int = setting(
        10_000,
        "Open connections, HTTP and gRPC together (lowered to ulimit -n - 128); at the cap the "
        "longest-idle one is closed, else the slowest to arrive; when every place serves, the new "
        "one is refused (HTTP 503, gRPC UNAVAILABLE) except health probes.",
        low=1,
    )
    max_connections_per_peer: int = setting(
        0,
        "Connections one client address may hold (0: no limit; behind a load balancer every "
        "client may share one address). Past it: HTTP 503, gRPC GOAWAY.",
        low=0,
    )
    intake_lag_ms: float = setting(
        0.0,
        "Event-loop lag (ms) above which the server stops reading sockets until it catches up: "
        "transport back-pressure for a large crowd of closed-loop clients (0: never; see "
        "benchmarks/RESULTS.md for where it helps and where it hurts).",
        low=0.0,
    )
    header_timeout_s: float = setting(
        10.0,
        "Seconds an HTTP request head may take to arrive (then 408 and close); a new connection "
        "must start its first request within it.",
        name="header-timeout",
        **_POSITIVE_SECONDS,
    )
    keepalive_timeout_s: float = setting(
        75.0,
        "Seconds an idle HTTP keep-alive connection stays open.",
        name="keepalive-timeout",
        **_POSITIVE_SECONDS,
    )
    request_timeout_s: float = setting(
        120.0,
        "Seconds a whole request (HTTP head and body, a gRPC unary call's request) may take to "
        "arrive, whatever its rate (then 408, gRPC DEADLINE_EXCEEDED).",
        name="request-timeout",
        **_POSITIVE_SECONDS,
    )
    request_min_rate: float = setting(
        500.0,
        "Bytes per second a request body must average after --header-timeout (a request may take "
        "--header-timeout plus one second per this many bytes).",
        low=1.0,
    )
    grpc_max_message_bytes: int | None = setting(
        None, "Largest gRPC message.", low=1, shown_default="--max-body-bytes"
    )
    grpc_keepalive_time_s: float = setting(
        7200.0,
        "Seconds of idleness before the gRPC server pings a connection.",
        name="grpc-keepalive-time",
        low=0.0,
    )
    grpc_keepalive_timeout_s: float = setting(
        20.0,
        "Seconds a gRPC keepalive ping may go unanswered before the connection closes.",
        name="grpc-keepalive-timeout",
        low=0.0,
    )
    grpc_max_concurrent_streams: int = setting(1024, "Most gRPC calls in flight on one connection.", low=1)
    intra_op_threads: int | None = setting(
        None, "ONNX Runtime intra-op threads per session.", shown_default="usable CPUs"
    )
    inter_op_threads: int | None = setting(None, "ONNX Runtime inter-op threads.", shown_default="1")
    shutdown_grace_s: float = setting(
        30.0,
        "Seconds in-flight requests get to finish once the listeners stop accepting (after "
        "--shutdown-delay), then exit 0.",
        name="shutdown-grace",
        low=0.0,
    )
    shutdown_delay_s: float = setting(
        5.0,
        "Seconds after SIGTERM that readiness answers 503 while requests are still served, so "
        "load balancers stop sending before the drain (SIGINT, or a second signal, skips it).",
        name="shutdown-delay",
        low=0.0,
    )
    reuse_port: bool = setting(False, flag=None)  # set for each worker of --workers N
    log_level: str = setting("INFO", "Root log level.", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    log_format: str = setting("text", "Log lines as text or JSON.", choices=("text", "json"))
    access_log: bool = setting(False, "One log line per request (logger ortserve.access).")
    metrics: bool = setting(
        True, "Prometheus metrics on --metrics-port and /metrics (off: nothing per request)."
    )
    metrics_buckets: tuple[float, ...] | None = setting(
        None,
        "Latency histogram bounds in seconds, comma-separated.",
        parse="ortserve.metrics:parse_buckets",
        shown_default="0.0001 .. 10",
    )
    trace_sampling_ratio: float = setting(
        0.0,
        "Fraction of requests traced with OpenTelemetry (needs ortserve[otel]; 0: off; a caller's "
        "sampled flag wins).",
        low=0.0,
        high=1.0,
    )
    trace_exporter: str = setting(
        "otlp", "Where spans go (otlp reads the OTEL_EXPORTER_OTLP_* variables).", choices=("otlp", "console")
    )
    strict_readiness: bool = setting(
        True, "Ready only when every model is ready (Triton's default); off: ready once loading ends."
    )
    capture_dir: Path | None = setting(
        None, "Record a sample of requests here, for `ortserve replay` (default: off).", path="dir"
    )
    capture_rate: float = setting(
        0.01, "Fraction of requests captured with --capture-dir.", low=0.0, high=1.0
    )
    capture_redact: Path | None = setting(
        None,
        "YAML: secret_file, and JSON paths / headers to hash (HMAC) or drop before captured "
        "requests are written (see docs/operations.md).",
        path="file",
        exists=True,
    )
    shared_memory_regions: int = setting(
        0,
        "Let clients register up to N system shared-memory regions (0: the extension is off: a "
        "client could read and overwrite any /dev/shm object the server may open).",
        low=0,
    )
    cuda_shared_memory_regions: int = setting(
        0,
        "Let clients register up to N CUDA shared-memory regions by IPC handle (0: off; needs CUDA).",
        low=0,
    )
    model_control_mode: str = setting(
        "none",
        "none: load at start (SIGHUP re-scans); poll: re-scan periodically; explicit: only the "
        "repository API loads and unloads (as Triton).",
        choices=("none", "poll", "explicit"),
    )
    repository_poll_secs: float = setting(
        5.0, "Poll mode: seconds between two looks at the repository.", low=0.05
    )
    require_complete_marker: bool = setting(
        True,
        "Re-scans load a version only once ortserve.complete is written into it last (off: also "
        "once its files stop changing, unsafe with preallocating copiers).",
    )
    load_models: tuple[str, ...] = setting(
        (), "Explicit mode: a model to load at start (repeatable; '*' loads all).", name="load-model"
    )
    http_restricted_api: str | None = setting(
        None,
        "model-repository:HEADER=VALUE: repository calls over HTTP must carry that header.",
        parse="ortserve.server.restriction:parse_restriction",
        check_only=True,
    )
    grpc_restricted_protocol: str | None = setting(
        None,
        "model-repository:KEY=VALUE: repository calls over gRPC must carry that metadata.",
        parse="ortserve.server.restriction:parse_restriction",
        check_only=True,
    )
    trusted_keys: Path | None = setting(
        None,
        "A .pub file (or a folder of them): every version is checked against its signature at load.",
        path="any",
        exists=True,
    )
    require_signed: bool = setting(False, "Refuse unsigned versions (needs --trusted-keys).")
    min_signed_version: int = setting(
        0,
        "Refuse signed versions numbered below N, and old signatures that do not sign their "
        "version (rollback protection; needs --trusted-keys).",
        low=0,
    )
    enable_fault_injection: bool = setting(
        False,
        "Honour the faults: sections of model configs (drills and chaos tests; see docs/resilience.md).",
    )
    api_keys: tuple[str, ...] = setting(
        (),
        "A bearer token the data plane requires (Authorization: Bearer <key>, gRPC metadata "
        "authorization; repeatable; tenant 'default'). Default: no key needed.",
        name="api-key",
    )
    api_key_file: Path | None = setting(
        None,
        "More keys, one '<tenant> <token>' per line: each key names its tenant.",
        path="file",
        exists=True,
    )
    tenant_quota: str | None = setting(
        None,
        "Each tenant's token buckets: requests=R,burst=B (requests a second) and, for LLM "
        "requests, tokens=T,token_burst=TB (prompt and generated tokens a second, charged when "
        "a request ends; a tenant in debt waits); past it 429 + Retry-After / RESOURCE_EXHAUSTED. "
        "The tenant is the API key's, else the X-Tenant-Id header. Default: no quota.",
        parse="ortserve.tenancy.gate:parse_quota",
        check_only=True,
    )
