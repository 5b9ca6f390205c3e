"""Server lifecycle: load models, open listeners, serve until a signal, drain, stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import onnxruntime as ort

from ortserve import __version__
from ortserve.capture import Capture, CaptureCollector
from ortserve.capture_redaction import load_redactor
from ortserve.core.cpus import usable_cpus
from ortserve.core.cuda_shared_memory import SharedMemoryRegions, shared_memory_registry
from ortserve.core.dataplane import DataPlane
from ortserve.core.types import ServerMetadata
from ortserve.llm.stats import LlmCollector
from ortserve.protocol.tensors import TensorLimits
from ortserve.repository.kinds import standard_kinds
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.repository.signature import load_trusted_keys
from ortserve.repository.watcher import RepositoryWatcher, control_mode
from ortserve.resilience.nvml import monitor, set_current_health, start_health
from ortserve.routing.metrics import RoutingMetrics
from ortserve.routing.table import RoutingTable
from ortserve.server.collector import freeze_startup_heap
from ortserve.server.connections import ByteBudget, ConnectionLimit, connection_cap
from ortserve.server.exchange import Exchange
from ortserve.server.grpc.listener import GrpcListener, GrpcOptions
from ortserve.server.grpc.service import InferenceService
from ortserve.server.http.admission import EarlyRefusal
from ortserve.server.http.app import HttpApp
from ortserve.server.http.connection import ConnectionLimits
from ortserve.server.http.generate_routes import add_generate_routes
from ortserve.server.http.listener import HttpListener
from ortserve.server.http.llm_tool_routes import add_llm_tool_routes
from ortserve.server.http.openai_routes import add_openai_routes, llm_versions
from ortserve.server.http.openapi_routes import add_openapi_routes
from ortserve.server.http.pipeline_routes import register_pipeline_routes
from ortserve.server.http.profile_routes import add_profile_routes
from ortserve.server.http.repository_routes import add_repository_routes
from ortserve.server.http.routing_routes import add_routing_routes
from ortserve.server.http.shared_memory_routes import add_shared_memory_routes
from ortserve.server.intake import IntakeGovernor
from ortserve.server.intake_metrics import IntakeMetrics
from ortserve.server.memory import HeapTrimmer
from ortserve.server.model_control import ModelControl
from ortserve.server.observability import Observability
from ortserve.server.restriction import parse_restriction
from ortserve.server.settings_extensions import SETTINGS_EXTENSIONS, add_settings_extensions
from ortserve.server.startup import StartupError
from ortserve.server.status import add_status_routes
from ortserve.settings import ServerSettings
from ortserve.tenancy.gate import build_gate

__all__ = ["EXTENSIONS", "SHARED_MEMORY_EXTENSION", "Server", "StartupError", "serve"]

logger = logging.getLogger(__name__)

_Port = TypeVar("_Port", int, int | None)

EXTENSIONS = (
    "binary_tensor_data",
    "classification",
    "schedule_policy",
    "statistics",
    "model_repository",
    "model_configuration",
    *SETTINGS_EXTENSIONS,
)
SHARED_MEMORY_EXTENSION = "system_shared_memory"


@dataclass(slots=True)
class _Bound:
    http_port: int
    grpc_port: int | None = None
    metrics_port: int | None = None


class Server:
    """Everything one ``ortserve serve`` runs, as an object tests can start and stop.

    Args:
        settings: the frozen server settings.
    """

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.registry = ModelRegistry(strict=settings.strict_readiness)
        self.observability = Observability(settings, self.registry)
        trusted = (
            None
            if settings.trusted_keys is None
            else load_trusted_keys(
                settings.trusted_keys, settings.require_signed, settings.min_signed_version
            )
        )
        self.manager = LifecycleManager(
            self.registry, settings, self.observability.lifecycle_events, trusted, standard_kinds()
        )
        # A released session frees its arena and weights into glibc's heap: give the pages back.
        self._released_heap = HeapTrimmer(threshold=1)
        self.manager.released.append(lambda: self._released_heap.freed(1))
        self.watcher = RepositoryWatcher(
            self.manager, control_mode(settings.model_control_mode), settings.repository_poll_secs
        )
        self.telemetry = self.observability.telemetry
        self.manager.forgotten.append(self.telemetry.forget)
        shared_memory = shared_memory_registry(
            settings.shared_memory_regions, settings.cuda_shared_memory_regions
        )
        extensions: tuple[str, ...] = EXTENSIONS
        if shared_memory.enabled:
            extensions = (*extensions, SHARED_MEMORY_EXTENSION)
        if isinstance(shared_memory, SharedMemoryRegions):
            extensions = (*extensions, "cuda_shared_memory")
        self.dataplane = DataPlane(
            self.registry, ServerMetadata("ortserve", __version__, extensions), shared_memory
        )
        limits = TensorLimits(
            settings.max_tensor_elements, settings.max_json_depth, settings.max_bytes_element
        )
        self.routing = RoutingTable(self.registry, time.monotonic)
        self.dataplane.routers = self.routing.routers
        self.capture = _capture(settings, self.observability)
        # The one request edge, for both transports and every request kind.
        try:
            gate = build_gate(settings.api_keys, settings.api_key_file, settings.tenant_quota, time.monotonic)
        except ValueError as error:
            raise StartupError(f"API keys or tenant quota: {error}") from None
        if gate is not None and gate.quotas is not None and self.observability.metrics is not None:
            self.observability.metrics.registry.register(gate.quotas)
        self.exchange = Exchange(self.dataplane, self.telemetry, self.capture, self.routing.routers, gate)
        self.http_app = HttpApp(
            self.dataplane, limits, self.telemetry, settings.max_body_bytes, exchange=self.exchange
        )
        self.observability.add_routes(self.http_app)
        add_shared_memory_routes(self.http_app, shared_memory)
        add_openapi_routes(self.http_app, __version__)
        add_openai_routes(self.http_app, self.registry)
        if self.observability.metrics is not None:
            registry = self.registry
            self.observability.metrics.registry.register(LlmCollector(lambda: llm_versions(registry)))
        add_generate_routes(self.http_app, self.registry)
        add_llm_tool_routes(self.http_app, self.registry, self.dataplane.ready, settings.model_repository)
        self.control = ModelControl(self.manager, settings.model_control_mode)
        http_restricted = (
            parse_restriction(settings.http_restricted_api) if settings.http_restricted_api else {}
        )
        add_repository_routes(self.http_app, self.control, http_restricted.get("model-repository"))
        add_routing_routes(self.http_app, self.routing, http_restricted.get("routing"))
        add_status_routes(self.http_app, http_restricted.get("status"))
        op_seconds = add_profile_routes(
            self.http_app,
            self.registry,
            settings.model_repository,
            settings.intra_op_threads,
            http_restricted.get("model-repository"),
        )
        if self.observability.metrics is not None:
            self.observability.metrics.registry.register(op_seconds)
        self.control.roles = self.routing.role_names
        if self.observability.metrics is not None:
            self.observability.metrics.registry.register(RoutingMetrics(self.routing))
        # One cap on connections across both listeners: a socket costs the same either way.
        self.connection_limit = ConnectionLimit(
            connection_cap(settings.max_connections), settings.max_connections_per_peer
        )
        # And one intake governor: both listeners' connections share the loop it watches.
        self.intake = IntakeGovernor(settings.intake_lag_ms / 1e3)
        # And one bound on request bytes held. Room is kept for one body being joined from
        # its pieces (a second copy, briefly).
        self.byte_budget = ByteBudget(settings.max_inflight_bytes - settings.max_body_bytes, HeapTrimmer())
        self._http = HttpListener(
            self.http_app,
            ConnectionLimits(
                max_body_bytes=settings.max_body_bytes,
                keepalive_timeout_s=settings.keepalive_timeout_s,
                header_timeout_s=settings.header_timeout_s,
                min_body_rate=settings.request_min_rate,
                request_timeout_s=settings.request_timeout_s,
            ),
            self.connection_limit,
            self.byte_budget,
            EarlyRefusal(self.dataplane, self.telemetry, self.exchange.gate),
            self.intake,
        )
        self._grpc = (
            GrpcListener(
                self.dataplane,
                limits,
                GrpcOptions.from_settings(settings),
                self.telemetry,
                self.connection_limit,
                self.intake,
                self.byte_budget,
                self.exchange,
            )
            if settings.grpc_port >= 0
            else None
        )
        if self._grpc is not None:
            self._grpc.service.control = self.control
            if settings.grpc_restricted_protocol:
                restricted = parse_restriction(settings.grpc_restricted_protocol)
                self._grpc.service.restriction = restricted.get("model-repository")
        add_settings_extensions(
            self.http_app, self.grpc_service, self.observability.trace_control, settings, self.registry
        )
        if self.observability.metrics is not None:
            self.observability.metrics.registry.register(IntakeMetrics(self.connection_limit, self.intake))
        self._watching: asyncio.Task[None] | None = None
        self._retiring: asyncio.Task[None] | None = None
        self._health: asyncio.Task[None] | None = None
        self.bound: _Bound | None = None
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()

    @property
    def grpc_service(self) -> InferenceService | None:
        """The gRPC service (None with gRPC off), for a worker of ``--workers N`` to extend."""
        return None if self._grpc is None else self._grpc.service

    async def start(self) -> None:
        """Check the repository, listen (liveness answers while models load), then load it.

        Raises:
            StartupError: the repository is not a folder, or a port cannot be bound.
        """
        await self.listen()
        await self.load()

    async def listen(self) -> None:
        """Bind the HTTP, gRPC and metrics ports.

        Raises:
            StartupError: the repository is not a folder, or a port cannot be bound.
        """
        s = self.settings
        if not s.model_repository.is_dir():  # before any port is held
            raise StartupError(f"model repository {s.model_repository} is not a folder")
        self._http.reuse_port = s.reuse_port
        if self._grpc is not None:
            self._grpc.reuse_port = s.reuse_port
        http_port = await _bound("HTTP", s.host, s.http_port, self._http.start)
        self.bound = _Bound(http_port)
        logger.info(
            "ortserve %s, ONNX Runtime %s (available providers: %s), %d usable CPUs",
            __version__,
            ort.__version__,
            ", ".join(ort.get_available_providers()),
            usable_cpus(),
        )
        logger.info("HTTP (Open Inference Protocol) listening on http://%s:%d", s.host, http_port)
        if self._grpc is not None:
            self.bound.grpc_port = await _bound("gRPC", s.host, s.grpc_port, self._grpc.start)
            logger.info("gRPC (Open Inference Protocol) listening on %s:%d", s.host, self.bound.grpc_port)
        self.bound.metrics_port = await _bound("metrics", s.host, s.metrics_port, self.observability.start)

    async def load(self) -> None:
        """Load the repository as the control mode says, then watch it (a worker of ``--workers N``
        restarted beside ready ones loads before it listens, so it never answers 503)."""
        s = self.settings
        if self.capture is not None:
            await self.capture.start()
        self.manager.changed.append(self._register_pipeline_routes)
        self.manager.changed.append(self.routing.sync)
        metrics = self.observability.metrics
        health = await asyncio.to_thread(start_health, None if metrics is None else metrics.registry)
        if health is not None:  # GPU health (docs/resilience.md); off without NVML
            self._health = asyncio.get_running_loop().create_task(monitor(health))
        explicit = s.model_control_mode == "explicit"
        snapshots = await self.manager.start(s.load_models if explicit else None)
        self.watcher.seed(snapshots)
        freeze_startup_heap()  # full GC passes then skip what lives as long as the process
        self.intake.start(asyncio.get_running_loop())
        self._watching = asyncio.get_running_loop().create_task(self.watcher.run())
        self._retiring = asyncio.get_running_loop().create_task(
            self.routing.run_retirement(self.manager.retire)
        )
        _warn_unrestricted(s)
        for entry in self.registry.entries():
            versions = ", ".join(
                f"{n} [{'/'.join(v.info.providers)}]" for n, v in sorted(entry.versions.items())
            )
            logger.info("model %s: %s; versions %s", entry.name, entry.state.value, versions or "none")
        logger.info("server %s", "ready" if self.dataplane.ready() else "NOT ready (a model failed)")
        if self._grpc is not None:
            self._grpc.readiness_changed()

    def _register_pipeline_routes(self) -> None:
        register_pipeline_routes(self.registry, self.http_app)

    def request_stop(self, delayed: bool = True) -> None:
        """Begin shutting down; ``delayed`` False (or a second request) skips the shutdown delay."""
        if self._stop.is_set() or not delayed:
            self._hurry.set()
        self._stop.set()

    async def wait_for_stop(self) -> None:
        await self._stop.wait()

    async def withdraw(self) -> None:
        """Answer not ready at once but keep accepting and serving for ``shutdown_delay_s``.

        Endpoint removal upstream (a Kubernetes Service, a load balancer's health check) lags
        the signal by seconds; closing the listeners at once would refuse the requests still
        routed here meanwhile.
        """
        self.dataplane.start_draining()
        if self._grpc is not None:
            self._grpc.readiness_changed()
        delay = self.settings.shutdown_delay_s
        if delay <= 0 or self._hurry.is_set():
            return
        logger.info("not ready; still accepting for %.1f s (--shutdown-delay) before draining", delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._hurry.wait(), delay)

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish within the grace period, close."""
        grace = self.settings.shutdown_grace_s
        logger.info("shutting down: draining in-flight requests (grace %.1f s)", grace)
        self.dataplane.start_draining()
        for task in (self._watching, self._retiring, self._health):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        set_current_health(None)
        self.intake.stop()  # parked connections are read again, so their requests drain
        self._http.stop_accepting()
        if self._grpc is not None:
            self._grpc.stop_accepting(grace)
        await self.manager.close(grace)
        await self.routing.close()
        await self._http.wait_closed(grace)
        if self.capture is not None:
            await self.capture.stop()
        if self._grpc is not None:
            await self._grpc.wait_closed()
        await self.observability.stop(grace)
        self.dataplane.shared_memory.close()
        logger.info("stopped")


async def _bound(what: str, host: str, port: int, start: Callable[[str, int], Awaitable[_Port]]) -> _Port:
    try:
        return await start(host, port)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)  # uvloop's strerror repeats the address
        raise StartupError(f"cannot listen for {what} on {host}:{port}: {reason}") from None


def _warn_unrestricted(settings: ServerSettings) -> None:
    """Model control on a non-loopback address without a restriction: anyone who reaches the
    port can change what the server serves."""
    if settings.model_control_mode == "none" or settings.host in ("127.0.0.1", "::1", "localhost"):
        return
    if settings.http_restricted_api is None or (
        settings.grpc_port >= 0 and settings.grpc_restricted_protocol is None
    ):
        logger.warning(
            "model control mode %s on %s without --http-restricted-api / --grpc-restricted-protocol: "
            "anyone who reaches the server can load and unload models",
            settings.model_control_mode,
            settings.host,
        )


def _capture(settings: ServerSettings, observability: Observability) -> Capture | None:
    """The traffic capture when ``--capture-dir`` is set, its counters exported as metrics."""
    if settings.capture_dir is None:
        return None
    try:
        redact = None if settings.capture_redact is None else load_redactor(settings.capture_redact)
    except (OSError, ValueError) as error:
        raise StartupError(f"--capture-redact: {error}") from None
    capture = Capture(settings.capture_dir, settings.capture_rate, redact=redact)
    if observability.metrics is not None:
        observability.metrics.registry.register(CaptureCollector(capture))
    return capture


async def serve(settings: ServerSettings) -> None:
    """Run until SIGTERM or SIGINT, then drain and return (the process exits 0)."""
    server = Server(settings)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, server.request_stop)
    loop.add_signal_handler(signal.SIGINT, server.request_stop, False)  # Ctrl-C: nobody routes here
    loop.add_signal_handler(signal.SIGHUP, server.watcher.rescan_soon)
    await server.start()
    await server.wait_for_stop()
    await server.withdraw()
    await server.stop()
