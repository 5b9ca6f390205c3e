"""One worker process of ``--workers N``: today's server on the shared ports, plus a private
Unix socket on which the supervisor asks for this worker's own metrics, statistics and model
control. Forked by the zygote (``zygote.py``), which calls :func:`run_worker`; it outlives the
zygote (the supervisor adopts it) and stops, as on SIGTERM, when the supervisor dies."""

from __future__ import annotations

import asyncio
import logging
import pickle
import signal
from pathlib import Path

from ortserve.errors import RepositoryError
from ortserve.logs import configure_logging
from ortserve.server.connections import ConnectionLimit
from ortserve.server.http.app import HttpApp
from ortserve.server.http.connection import ConnectionLimits
from ortserve.server.http.listener import HttpListener
from ortserve.server.http.messages import HttpRequest, resolve_response
from ortserve.server.lifecycle import Server, StartupError
from ortserve.supervisor.link import SupervisedControl, hand_over, statistics_view
from ortserve.supervisor.plan import TOKEN_HEADER, WorkerLaunch
from ortserve.supervisor.prefix_route import route_by_prefix
from ortserve.supervisor.slots import STARTUP_FAILED

__all__ = ["run_worker", "serve_worker"]

logger = logging.getLogger(__name__)

_PRIVATE_CONNECTIONS = 1024
"""The supervisor's calls and the other workers' forwarded generation requests (prefix_route.py)."""


async def serve_worker(
    launch: WorkerLaunch, index: int, restarted: bool = False, supervisor: int | None = None
) -> None:
    """Serve until SIGTERM/SIGINT (passed on by the supervisor), then delay, drain and return.

    A worker restarted beside ready ones loads its models, and replays the model control the
    others accepted, before it listens: the kernel would send it connections at once.

    Args:
        supervisor: a pidfd of the supervisor: readable once it has died, which stops this
            worker as SIGTERM would (the supervisor SIGKILLed or out of memory).
    """
    server = Server(launch.settings)
    hand_over(server.http_app, server.telemetry.statistics, launch)
    route_by_prefix(server.http_app, launch, index)
    service = server.grpc_service
    if service is not None:  # gRPC's statistics and repository calls see every worker too
        service.control = SupervisedControl(server.manager, launch)
        service.statistics_view = statistics_view(launch)
    private = HttpListener(
        server.http_app,
        ConnectionLimits(max_body_bytes=launch.settings.max_body_bytes, keepalive_timeout_s=75.0),
        ConnectionLimit(_PRIVATE_CONNECTIONS),
    )
    path = launch.worker_socket(index)
    path.unlink(missing_ok=True)  # left by the worker this one replaces
    await private.start_unix(str(path))
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, server.request_stop)
    loop.add_signal_handler(signal.SIGINT, server.request_stop, False)
    loop.add_signal_handler(signal.SIGHUP, server.watcher.rescan_soon)
    if supervisor is not None:
        loop.add_reader(supervisor, _orphaned, loop, supervisor, server)
    if restarted:
        await server.load()
        await _replay(server.http_app, launch, index)
        await server.listen()
    else:
        await server.start()
    await server.wait_for_stop()
    await server.withdraw()
    await server.stop()
    private.stop_accepting()
    await private.wait_closed(1.0)


def _orphaned(loop: asyncio.AbstractEventLoop, supervisor: int, server: Server) -> None:
    loop.remove_reader(supervisor)
    logger.error("the supervisor has died: this worker stops")
    server.request_stop()


async def _replay(app: HttpApp, launch: WorkerLaunch, index: int) -> None:
    """Bring a restarted worker to the recorded state; the generation it reached is written
    for the supervisor, which replays whatever was recorded after this read (gateway.py)."""
    calls = launch.control_log()
    for _generation, path, body, headers in calls:
        marked = {**headers, TOKEN_HEADER: launch.token.encode()}
        answer = await resolve_response(app(HttpRequest("POST", path, "", marked, body)))
        if answer.status != 200:
            logger.warning("replaying %s answered %d", path, answer.status)
    launch.save_generation(index, max((call[0] for call in calls), default=0))


def run_worker(run_dir: Path, index: int, restarted: bool, supervisor: int) -> int:
    """Serve as worker ``index`` (forked by the zygote; ``supervisor``: a pidfd of the
    supervisor); returns the exit code."""
    launch: WorkerLaunch = pickle.loads((run_dir / "launch.pickle").read_bytes())
    configure_logging(launch.settings.log_level, launch.settings.log_format)
    try:
        import uvloop
    except ImportError:
        uvloop = None  # type: ignore[assignment]
    try:
        if uvloop is None:
            asyncio.run(serve_worker(launch, index, restarted, supervisor))
        else:
            uvloop.run(serve_worker(launch, index, restarted, supervisor))
    except (StartupError, RepositoryError) as exc:
        logger.error("worker %d: %s", index, exc)
        return STARTUP_FAILED
    return 0
