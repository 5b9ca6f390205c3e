"""The supervisor's own HTTP face: what must see every worker at once.

Workers hand these requests over (on the supervisor's private Unix socket); the metrics port,
public, answers ``/metrics`` only. Each request is asked of every worker's private socket,
marked with the launch's token so the worker answers with its own view, and the answers are
merged (``aggregate.py``). Model control is applied on every worker or on none, and a worker
that missed a call (killed, restarting) converges to the recorded state (``ledger.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ortserve.server.http.messages import HttpRequest, HttpResponse, RouteResult, json_response
from ortserve.server.http.methods import answer_methods, method_not_allowed
from ortserve.supervisor.aggregate import merge_expositions, merge_index, merge_statistics, worker_requests
from ortserve.supervisor.channel import Answer, ChannelError, request
from ortserve.supervisor.ledger import ControlLedger
from ortserve.supervisor.plan import TOKEN_HEADER, WorkerLaunch
from ortserve.supervisor.slots import WorkerSlot

__all__ = ["Gateway"]

logger = logging.getLogger(__name__)

_TEXT_TYPE = CONTENT_TYPE_LATEST.encode()
_CONTROL_TIMEOUT_S = 600.0  # a large model's load and warm-up
_READ_TIMEOUT_S = 10.0


class Gateway:
    """Fans requests out to the workers and merges their answers.

    Args:
        launch: where the workers' sockets are and the token that marks the supervisor's calls.
        slots: the workers.
    """

    def __init__(self, launch: WorkerLaunch, slots: Sequence[WorkerSlot]) -> None:
        self._launch = launch
        self._slots = slots
        self._ledger = ControlLedger(launch)
        """The calls every worker must have applied, numbered: replayed to workers behind."""
        self._control_lock = asyncio.Lock()

    def public(self, request: HttpRequest) -> RouteResult:
        """The metrics port: ``GET /metrics``, nothing else."""
        if request.path != "/metrics":
            return json_response(404, b'{"error":"only /metrics is served on this port"}')
        return answer_methods(request, self._metrics_only)

    def private(self, request: HttpRequest) -> RouteResult:
        """The workers' hand-overs: metrics, statistics, repository index and control, health."""
        return answer_methods(request, self._route)

    def _metrics_only(self, request: HttpRequest) -> RouteResult:
        if request.method != "GET":
            return method_not_allowed("GET")
        return self.metrics()

    def _route(self, request: HttpRequest) -> RouteResult:
        path, parts = request.path, request.path.strip("/").split("/")
        if path == "/metrics":
            return self._metrics_only(request)
        if parts[:1] == ["v2"] and parts[-1:] == ["stats"] and parts[1:2] == ["models"]:
            return self._get(request, self._statistics)
        if path in ("/v2/health/ready", "/v2/health/live"):
            return self._get(request, self._health)
        if parts[:2] == ["v2", "repository"]:
            if request.method != "POST":
                return method_not_allowed("POST")
            if parts[2:] == ["index"]:
                return self._index(request)
            if len(parts) == 5 and parts[2] == "models" and parts[4] in ("load", "unload"):
                return self._control(request, parts[3])
        return json_response(404, orjson.dumps({"error": f"no route for {path}"}))

    @staticmethod
    def _get(request: HttpRequest, handler: Callable[[HttpRequest], RouteResult]) -> RouteResult:
        return handler(request) if request.method == "GET" else method_not_allowed("GET")

    async def _ask(
        self,
        slot: WorkerSlot,
        method: str,
        target: str,
        body: bytes = b"",
        headers: dict[bytes, bytes] | None = None,
        timeout_s: float = _READ_TIMEOUT_S,
    ) -> Answer:
        marked = {**(headers or {}), TOKEN_HEADER: self._launch.token.encode()}
        return await request(self._launch.worker_socket(slot.index), method, target, body, marked, timeout_s)

    async def _ask_all(
        self,
        method: str,
        target: str,
        body: bytes = b"",
        headers: dict[bytes, bytes] | None = None,
        timeout_s: float = _READ_TIMEOUT_S,
    ) -> list[Answer | ChannelError]:
        asked = [self._ask(slot, method, target, body, headers, timeout_s) for slot in self._slots]
        answers = await asyncio.gather(*asked, return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, ChannelError):
                raise answer
        return answers  # type: ignore[return-value]

    async def metrics(self) -> HttpResponse:
        """Every worker's families merged, plus the supervisor's own (workers, restarts)."""
        answers, readiness = await asyncio.gather(
            self._ask_all("GET", "/metrics"), self._ask_all("GET", "/v2/health/ready")
        )
        ready = sum(1 for a in readiness if isinstance(a, Answer) and a.status == 200)
        texts: list[str] = []
        per_worker: list[tuple[WorkerSlot, float]] = []
        for slot, answer in zip(self._slots, answers):
            if isinstance(answer, Answer) and answer.status == 200:
                text = answer.body.decode()
                texts.append(text)
                per_worker.append((slot, worker_requests(text)))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families([*merge_expositions(texts), *self._own_families(per_worker, ready)]))
        return HttpResponse(200, [generate_latest(registry)], _TEXT_TYPE)

    def _own_families(self, per_worker: list[tuple[WorkerSlot, float]], ready: int) -> list[Metric]:
        workers = GaugeMetricFamily("ortserve_workers", "Worker processes configured (--workers)")
        workers.add_metric([], len(self._slots))
        up = GaugeMetricFamily("ortserve_workers_up", "Workers that answered this scrape")
        up.add_metric([], len(per_worker))
        ready_workers = GaugeMetricFamily("ortserve_workers_ready", "Workers whose readiness is 200")
        ready_workers.add_metric([], ready)
        restarts = CounterMetricFamily(
            "ortserve_worker_restarts", "Worker processes restarted after dying", labels=["worker"]
        )
        requests = CounterMetricFamily(
            "ortserve_worker_requests",
            "Inference requests each worker process answered (since it started)",
            labels=["worker", "pid"],
        )
        for slot in self._slots:
            restarts.add_metric([str(slot.index)], slot.restarts)
        for slot, count in per_worker:
            if slot.pid is not None:  # not one that has exited but answered while draining
                requests.add_metric([str(slot.index), str(slot.pid)], count)
        return [workers, up, ready_workers, restarts, requests]

    async def _statistics(self, request: HttpRequest) -> HttpResponse:
        answers = await self._ask_all("GET", request.path)
        found = [orjson.loads(a.body) for a in answers if isinstance(a, Answer) and a.status == 200]
        if not found:
            return _first_failure(answers)
        return json_response(200, orjson.dumps(merge_statistics(found)))

    async def _health(self, request: HttpRequest) -> HttpResponse:
        answers = await self._ask_all("GET", request.path)
        which = request.path.rsplit("/", 1)[1]
        healthy = all(isinstance(a, Answer) and a.status == 200 for a in answers)
        return json_response(200 if healthy else 503, orjson.dumps({which: healthy}))

    async def _index(self, request: HttpRequest) -> HttpResponse:
        async with self._control_lock:
            await self._converge()
        answers = await self._ask_all("POST", request.path, request.body, request.headers)
        found = [orjson.loads(a.body) for a in answers if isinstance(a, Answer) and a.status == 200]
        if len(found) < len(answers):
            return _first_failure(answers)
        try:
            ready_only = bool(json.loads(request.body or b"{}").get("ready", False))
        except (ValueError, AttributeError):
            ready_only = False
        rows = merge_index(found, ready_only)
        every, per_model = self._convergence()
        for row in rows:  # the state is not the same everywhere yet: say so
            notes = [note for note in (every, per_model.get(row["name"], "")) if note]
            if notes:
                row["state"] = "UNAVAILABLE" if row["state"] == "READY" else row["state"]
                row["reason"] = "; ".join(r for r in (row["reason"], *notes) if r)
        return json_response(200, orjson.dumps(rows))

    async def _control(self, request: HttpRequest, model: str) -> HttpResponse:
        """Load or unload on every worker or on none: 200 once every worker that answered
        applied it (one that could not be reached replays it, see ledger.py); a worker's refusal
        is answered as it is and the call rolled back on the workers that took it or may have
        (no answer: it may have applied the call before its answer was lost)."""
        async with self._control_lock:  # two loads of one model must not interleave per worker
            await self._converge()
            answers = await self._ask_all(
                "POST", request.path, request.body, request.headers, _CONTROL_TIMEOUT_S
            )
            took = [s for s, a in zip(self._slots, answers) if isinstance(a, Answer) and a.status == 200]
            unanswered = [s for s, a in zip(self._slots, answers) if isinstance(a, ChannelError)]
            refused = any(isinstance(a, Answer) and a.status != 200 for a in answers)
            if took and not refused:
                generation = self._ledger.record(model, request.path, request.body, dict(request.headers))
                for slot in took:
                    self._ledger.applied(slot.index, generation)
                    self._ledger.restored(slot.index, model)
                if unanswered:
                    logger.warning(
                        "%s applied on %d of %d workers (generation %d); the others replay it when "
                        "they answer again",
                        request.path, len(took), len(answers), generation,
                    )  # fmt: skip
                first = next(a for a in answers if isinstance(a, Answer) and a.status == 200)
                return HttpResponse(200, [first.body], first.content_type)
            if took or unanswered:
                await self._roll_back(model, [*took, *unanswered])
        failed = sum(1 for a in answers if not (isinstance(a, Answer) and a.status == 200))
        logger.warning("%s failed on %d of %d workers", request.path, failed, len(answers))
        return _first_failure(answers)

    def _restoring_call(self, model: str) -> tuple[str, bytes, dict[bytes, bytes]]:
        """The call that puts ``model`` back as recorded: its last recorded call, or its state
        at start (loaded from its files, or not loaded)."""
        previous = self._ledger.previous(model)
        if previous is not None:
            _, path, body, headers = previous
            return path, body, headers
        wanted = self._launch.settings.load_models
        loaded = "*" in wanted or model in wanted or self._launch.settings.model_control_mode != "explicit"
        return f"/v2/repository/models/{model}/{'load' if loaded else 'unload'}", b"", {}

    async def _roll_back(self, model: str, slots: Sequence[WorkerSlot]) -> None:
        """Put ``model`` back as recorded on the workers that took a call others refused; one
        that cannot be restored now is marked, and restored by :meth:`_converge`."""
        for slot in slots:
            if not await self._restore(slot, model):
                self._ledger.differs(slot.index, model)

    async def _restore(self, slot: WorkerSlot, model: str) -> bool:
        """Put ``model`` back as recorded on ``slot``'s worker; False: it did not answer 200."""
        path, body, headers = self._restoring_call(model)
        try:
            answer = await self._ask(slot, "POST", path, body, headers, _CONTROL_TIMEOUT_S)
        except ChannelError:
            return False
        if answer.status != 200:
            logger.error("restoring %s on worker %d answered %d", model, slot.index, answer.status)
            return False
        self._ledger.restored(slot.index, model)
        return True

    async def _converge(self) -> None:
        """Replay to every reachable worker the recorded calls it has not applied, and restore
        the models it holds otherwise than recorded (a rollback that failed)."""
        for slot in self._slots:
            reached = self._ledger.reached(slot.index)
            reachable = True
            for generation, path, body, headers in self._ledger.behind(slot.index):
                try:
                    answer = await self._ask(slot, "POST", path, body, headers, _CONTROL_TIMEOUT_S)
                except ChannelError:
                    reachable = False
                    break  # not up yet: its own replay at start, or the next look, catches up
                if answer.status != 200:
                    logger.error("worker %d: replaying %s answered %d", slot.index, path, answer.status)
                else:
                    self._ledger.restored(slot.index, _model_of(path))
                reached = generation
            if reached > self._ledger.reached(slot.index):
                self._ledger.applied(slot.index, reached)
            for model in self._ledger.differing(slot.index) if reachable else ():
                if not await self._restore(slot, model):
                    break

    def _convergence(self) -> tuple[str, dict[str, str]]:
        """What is not the same on every worker yet: a note for every row (workers behind the
        recorded generation), and one per model a worker holds otherwise than recorded."""
        behind = [(slot.index, self._ledger.reached(slot.index)) for slot in self._slots]
        note = ", ".join(
            f"worker {index} at {reached}" for index, reached in behind if reached < self._ledger.generation
        )
        every = f"converging to generation {self._ledger.generation} ({note})" if note else ""
        differing: dict[str, list[int]] = {}
        for slot in self._slots:
            for model in self._ledger.differing(slot.index):
                differing.setdefault(model, []).append(slot.index)
        per_model = {
            model: "converging: " + ", ".join(f"worker {index}" for index in workers)
            + " could not be rolled back to the recorded state yet"
            for model, workers in differing.items()
        }  # fmt: skip
        return every, per_model


def _model_of(path: str) -> str:
    """The model a repository call names (``/v2/repository/models/<name>/load``)."""
    parts = path.strip("/").split("/")
    return parts[3] if len(parts) == 5 else ""


def _first_failure(answers: Sequence[Answer | ChannelError]) -> HttpResponse:
    for answer in answers:
        if isinstance(answer, Answer) and answer.status != 200:
            return HttpResponse(answer.status, [answer.body], answer.content_type)
    return json_response(503, orjson.dumps({"error": "a worker did not answer; retry"}))


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families
