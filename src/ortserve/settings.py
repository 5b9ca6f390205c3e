"""Server-wide settings: built once at the CLI edge, frozen, and passed down."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["ServerSettings"]


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Every knob the server reads; per-model knobs live in each model's ``config.yaml``."""

    model_repository: Path
    """Folder in Triton's layout: ``<model>/<version>/model.onnx`` (+ optional config.yaml)."""
    host: str = "127.0.0.1"
    """Address every listener binds to."""
    http_port: int = 8000
    """Open Inference Protocol over HTTP/1.1 (0 picks a free port)."""
    grpc_port: int = 8001
    """Open Inference Protocol over gRPC (-1 disables it)."""
    metrics_port: int = 8002
    """Prometheus exposition (-1 disables the separate listener; /metrics stays on HTTP)."""
    max_body_bytes: int = 64 * 1024 * 1024
    """Largest request body (HTTP) or message (gRPC) accepted; larger is 413."""
    max_json_depth: int = 32
    """Deepest nesting of a JSON tensor's ``data``."""
    max_tensor_elements: int = 64 * 1024 * 1024
    """Most elements one tensor may declare."""
    max_bytes_element: int = 16 * 1024 * 1024
    """Longest single BYTES element."""
    shutdown_grace_s: float = 30.0
    """On SIGTERM/SIGINT, how long in-flight requests get to finish."""
    shutdown_delay_s: float = 5.0
    """On SIGTERM, how long readiness answers 503 while the listeners still accept and serve,
    so load balancers and Kubernetes endpoints stop sending before the drain (SIGINT, or a
    second signal, skips it)."""
    reuse_port: bool = False
    """Bind the HTTP and gRPC ports with SO_REUSEPORT (set for each worker of ``--workers N``:
    the kernel spreads new connections over the processes listening on the port)."""
    intra_op_threads: int | None = None
    """ONNX Runtime intra-op threads per session; None sizes them to the usable CPUs."""
    inter_op_threads: int | None = None
    """ONNX Runtime inter-op threads; None means 1 (sequential execution)."""
    log_level: str = "INFO"
    """Root log level."""
    log_format: str = "text"
    """``text`` or ``json``."""
    access_log: bool = False
    """Log one line per request (costs nothing when off)."""
    metrics: bool = True
    """Prometheus metrics on ``--metrics-port`` and ``/metrics``; off costs nothing per request."""
    metrics_buckets: tuple[float, ...] | None = None
    """Latency histogram bounds in seconds; None uses ortserve.metrics.DEFAULT_LATENCY_BUCKETS."""
    trace_sampling_ratio: float = 0.0
    """Fraction of new traces recorded with OpenTelemetry (0: tracing off); a caller's choice wins."""
    trace_exporter: str = "otlp"
    """Where spans go: ``otlp`` (OTEL_EXPORTER_OTLP_* settings) or ``console``."""
    strict_readiness: bool = True
    """Server ready only when every model is ready (Triton's default); off: once loading ends."""
    keepalive_timeout_s: float = 75.0
    """Idle HTTP keep-alive connections are closed after this long."""
    header_timeout_s: float = 10.0
    """An HTTP request head must arrive within this long (then 408); its body may take this
    long plus one second per 500 bytes."""
    intake_lag_ms: float = 0.0
    """Event-loop lag above which connections stop being read until the loop catches up
    (transport back-pressure, ``server/intake.py``); 0 (the default) turns it off: measured,
    it helps a closed-loop crowd (3,000 connections) and hurts open-loop overload."""
    max_connections: int = 10_000
    """Most connections open at once, HTTP and gRPC together (lowered to what ``ulimit -n``
    allows); at the cap the longest-idle connection is closed for a new one, and when none is
    idle the new one is refused (HTTP 503, gRPC GOAWAY)."""
    request_min_rate: float = 500.0
    """Bytes per second a request must average once ``header_timeout_s`` has passed (an HTTP
    body, a gRPC unary call's request): a slow link still uploads, a trickle is answered 408
    (gRPC: DEADLINE_EXCEEDED) and its place freed."""
    request_timeout_s: float = 120.0
    """A whole request (HTTP head and body; a gRPC unary call's request, HEADERS to
    END_STREAM) must arrive within this, whatever its rate."""
    max_connections_per_peer: int = 0
    """Most connections one peer address may hold (0: no limit, the default: behind a load
    balancer or a proxy every client may share one address; the cap's eviction already keeps
    the slow or silent connections of one peer from locking the others out)."""
    max_inflight_bytes: int = 1024 * 1024 * 1024
    """Memory HTTP request bodies may take at once (bodies held, plus room for one being joined
    from its pieces: at least twice ``max_body_bytes``); a request past it is 429."""
    grpc_max_message_bytes: int | None = None
    """Largest gRPC message received or sent; None means ``max_body_bytes``."""
    grpc_keepalive_time_s: float = 7200.0
    """The gRPC server pings a connection idle for this long to check that its client lives."""
    grpc_keepalive_timeout_s: float = 20.0
    """A connection whose keepalive ping is not answered within this long is closed."""
    grpc_max_concurrent_streams: int = 1024
    """Most calls in flight on one gRPC connection (HTTP/2 streams)."""
    capture_dir: Path | None = None
    """Record a sample of infer requests into rotating files here (None: capture off)."""
    capture_rate: float = 0.01
    """Fraction of infer requests captured when ``capture_dir`` is set."""
    capture_redact: Path | None = None
    """A YAML file of JSON paths and headers to hash (HMAC) or drop before a capture is written
    (capture_redaction.py); None: captured as received."""
    shared_memory_regions: int = 0
    """Most system shared-memory regions clients may register; 0 turns the extension off, since a
    client that reaches the server could read and overwrite any /dev/shm object it may open."""
    cuda_shared_memory_regions: int = 0
    """Most CUDA shared-memory regions (IPC handles) clients may register; 0 turns it off."""
    model_control_mode: str = "none"
    """``none`` (load at start; SIGHUP re-scans), ``poll`` (re-scan every poll period and on
    SIGHUP) or ``explicit`` (only the repository API loads and unloads), as Triton."""
    repository_poll_secs: float = 5.0
    """Poll mode: seconds between two looks at the repository."""
    require_complete_marker: bool = True
    """A version found by a re-scan is loaded only once ``ortserve.complete`` was written into
    it after every other file (False: also once its files are unchanged between two looks)."""
    load_models: tuple[str, ...] = ()
    """Explicit mode: models loaded at start (``*``: all)."""
    http_restricted_api: str | None = None
    """``model-repository:HEADER=VALUE``: repository calls over HTTP must carry that header."""
    grpc_restricted_protocol: str | None = None
    """``model-repository:KEY=VALUE``: repository calls over gRPC must carry that metadata."""
    trusted_keys: Path | None = None
    """A ``.pub`` file or a folder of them: every version loaded is checked against its signature."""
    require_signed: bool = False
    """Refuse versions without a signature (needs ``trusted_keys``)."""
    min_signed_version: int = 0
    """Refuse signed versions numbered below this (rollback protection), and old signatures
    that do not sign their version (needs ``trusted_keys``)."""
    enable_fault_injection: bool = False
    """Honour the ``faults:`` sections of model configs (drills and chaos tests only)."""
    api_keys: tuple[str, ...] = ()
    """Bearer tokens the data plane accepts (``--api-key``, tenant ``default``); none and no
    ``api_key_file``: the data plane is open."""
    api_key_file: Path | None = None
    """``<tenant> <token>`` lines: more keys, each naming its tenant."""
    tenant_quota: str | None = None
    """Every tenant's token bucket, ``requests=R,burst=B`` (per second); None: no quota.
    Without keys the tenant is the ``X-Tenant-Id`` header."""
