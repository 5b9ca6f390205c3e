"""``POST /v2/models/{m}[/versions/{v}]/profile``: an ONNX Runtime profile on demand.

Body (all optional): ``{"runs": 20, "seconds": 10, "batch": 1}``: the profile stops at
whichever of ``runs`` runs or ``seconds`` seconds comes first (at most 10,000 runs and 60 s).
The answer names the operators that took the time and where the Chrome trace was kept. Behind
the same restriction as the repository API (it runs the model and writes files); one profile
at a time per server process.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import orjson

from ortserve.core.cpus import usable_cpus
from ortserve.core.model import ServedVersion
from ortserve.errors import InvalidInput, ModelNotFound, Overloaded
from ortserve.repository.registry import ModelRegistry
from ortserve.server.http.app import HttpApp
from ortserve.server.http.messages import HttpRequest, HttpResponse, RouteResult, json_response
from ortserve.server.http.methods import method_not_allowed
from ortserve.server.profiling import MAX_RUNS, MAX_SECONDS, OpSeconds, Profiler
from ortserve.server.restriction import Restriction

__all__ = ["add_profile_routes", "profile_folder"]

_DEFAULT_RUNS = 20
_MAX_BATCH = 1024


def profile_folder() -> Path:
    """Where traces are kept: a folder of the system's temporary directory."""
    return Path(tempfile.gettempdir()) / "ortserve-profiles"


def _operation(path: str) -> dict[str, Any]:
    parameters = [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]
    if "{version}" in path:
        parameters.append({"name": "version", "in": "path", "required": True, "schema": {"type": "string"}})
    return {
        "operationId": "profile_" + ("version" if "{version}" in path else "model"),
        "parameters": parameters,
        "summary": "Profile the model with ONNX Runtime's profiler; the top operators by time",
        "tags": ["profiling"],
        "requestBody": {"required": False, "content": {"application/json": {"schema": {"type": "object"}}}},
        "responses": {
            "200": {"description": "top operators, runs, wall time and the kept trace file"},
            "400": {"description": "a bad body, or a model with no ONNX graph"},
            "403": {"description": "the restriction's header is missing or wrong"},
            "429": {"description": "a profile is already running"},
        },
    }


def _number(body: dict[str, Any], key: str, default: float, limit: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= limit:
        raise InvalidInput(f"{key!r} must be a number in (0, {limit:g}]")
    return float(value)


class _ProfileRoutes:
    def __init__(self, registry: ModelRegistry, profiler: Profiler, restriction: Restriction | None) -> None:
        self._registry = registry
        self._profiler = profiler
        self._restriction = restriction
        self._lock = asyncio.Lock()

    def handle(self, request: HttpRequest, name: str, version: str | None) -> RouteResult:
        if request.method != "POST":
            return method_not_allowed("POST")
        return self._profile(request, name, version)

    async def _profile(self, request: HttpRequest, name: str, version: str | None) -> HttpResponse:
        if self._restriction is not None:
            self._restriction.check(request.header(self._restriction.key.encode("latin-1")))
        try:
            body = orjson.loads(request.body) if request.body.strip() else {}
        except orjson.JSONDecodeError as error:
            raise InvalidInput(f"the body is not JSON: {error}") from None
        if not isinstance(body, dict):
            raise InvalidInput("the body must be a JSON object")
        runs_default = MAX_RUNS if "seconds" in body and "runs" not in body else _DEFAULT_RUNS
        runs = int(_number(body, "runs", runs_default, MAX_RUNS))
        seconds = _number(body, "seconds", MAX_SECONDS, MAX_SECONDS)
        batch = int(_number(body, "batch", 1, _MAX_BATCH))
        served = self._version(name, version)
        if self._lock.locked():
            raise Overloaded("a profile is already running; retry when it ends")
        async with self._lock:
            result = await asyncio.to_thread(self._profiler.run, served.info, runs, seconds, batch)
        return json_response(200, orjson.dumps(result.answer(served.info.name, served.info.version)))

    def _version(self, name: str, version: str | None) -> ServedVersion:
        versions = self._registry.entry(name).versions
        if not versions:
            raise ModelNotFound(f"model {name!r} has no version loaded")
        number = max(versions) if version is None else int(version) if version.isdigit() else -1
        served = versions.get(number)
        if served is None:
            raise ModelNotFound(f"model {name!r} has no version {version}")
        if not isinstance(served, ServedVersion):
            raise InvalidInput(f"model {name!r} is not an ONNX model (a pipeline or a generation model)")
        return served


def add_profile_routes(
    app: HttpApp,
    registry: ModelRegistry,
    repository: Path,
    intra_op_threads: int | None,
    restriction: Restriction | None = None,
) -> OpSeconds:
    """Serve the profile route; returns the op-time collector for the metrics registry.

    ``intra_op_threads``: the server's setting (None: one per usable CPU, as sessions get).
    """
    op_seconds = OpSeconds()
    threads = intra_op_threads or usable_cpus()
    profiler = Profiler(repository, profile_folder(), threads, op_seconds)
    routes = _ProfileRoutes(registry, profiler, restriction)
    app.add_model_route("POST", "profile", routes.handle, _operation)
    return op_seconds
