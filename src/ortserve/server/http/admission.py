"""Refusing an infer request from its path and headers alone, before its body is read.

Under overload most requests are refused; decoding a JSON body only to answer 429 spends
the CPU the model needs (issue 10: refusals starved execution). The connection asks this
module once the headers are in and, on a refusal, writes the answer and drops the body as it
arrives. A refusal is priced against the least a Python server can do (answer canned bytes,
``benchmarks/bench_refusal_floor.py``): the scheduler keeps its verdict until the queue
changes, the answer to one verdict is encoded once, and the refusal is counted, not traced
through a request scope (unless the access log or tracing wants one line per request).
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import TYPE_CHECKING
from urllib.parse import unquote

from ortserve.server.edge import EncodedRefusals, edge_verdict
from ortserve.server.http.errors import error_response
from ortserve.server.http.wire import CannedResponse, canned
from ortserve.server.read_lag import ReadLag, read_lag_of
from ortserve.telemetry import Telemetry, echoable_id
from ortserve.tenancy.gate import TenantGate

if TYPE_CHECKING:
    from ortserve.core.dataplane import DataPlane  # the supervisor imports this, not ONNX Runtime

__all__ = ["EarlyRefusal", "infer_target"]

_PREFIX = b"/v2/models/"
_SUFFIX = b"/infer"
_MAX_TARGETS = 1024  # request targets remembered (clients repeat a handful of paths)
_UNSEEN = ("", None)

Target = tuple[str, str | None]


def infer_target(url: bytes) -> Target | None:
    """``(model, version)`` when ``url`` is an OIP infer path, else None."""
    path = url.split(b"?", 1)[0]
    if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)):
        return None
    parts = path[len(_PREFIX) : -len(_SUFFIX)].split(b"/")
    if len(parts) == 1:
        name, version = parts[0], None
    elif len(parts) == 3 and parts[1] == b"versions":
        name, version = parts[0], parts[2]
    else:
        return None
    if not name:
        return None
    decoded = unquote(name.decode("latin-1"))
    return decoded, None if version is None else unquote(version.decode("latin-1"))


class EarlyRefusal:
    """The HTTP connection's admission hook: the 429 (or 503) to write, or None to go on.

    Only load refusals are answered here (Overloaded, ModelNotReady); anything else, such as
    an unknown model, takes the full path and its usual answer.

    Args:
        dataplane: answers whether a model would admit a request now.
        telemetry: counts the refusal like any other answered request.
        gate: with tenancy on, names the tenant of a request the model would refuse, so that
            it is refused by its tenant's share of the queue (None: tenancy off).
    """

    def __init__(self, dataplane: DataPlane, telemetry: Telemetry, gate: TenantGate | None = None) -> None:
        self._gate = gate
        self._dataplane = dataplane
        self._telemetry = telemetry
        self._targets: dict[bytes, Target | None] = {}
        self._answers = EncodedRefusals(lambda error: canned(error_response(error)))
        self._lag: ReadLag | None = None

    def refuse_target(self, url: bytes, *, again: bool = False) -> CannedResponse | bool:
        """The refusal of a plain POST to ``url`` (no Expect, no request id, no tenant asked),
        decided from its target alone before the connection parses it: the answer to write,
        True when nothing refuses it for load (the parser need not ask again), or False when
        this request needs its headers asked (:meth:`__call__`): tenancy is on, or every
        request is traced or logged.

        ``again``: the request was admitted from its head and is about to run; the queue may
        have filled meanwhile (its read was already counted).
        """
        telemetry = self._telemetry
        if self._gate is not None or telemetry.access_log or telemetry.tracing is not None:
            return False
        if not again:
            lag = self._lag
            if lag is None:
                lag = self._lag = read_lag_of(asyncio.get_running_loop())
            lag.observe()
        target = self._targets.get(url, _UNSEEN)
        if target is _UNSEEN:
            target = self._remember(url)
        if target is None:
            return True
        name, version = target
        started = time.perf_counter()
        error = edge_verdict(self._dataplane, name, version)
        if isinstance(error, bool):
            return True
        telemetry.refused("http", name, version, error, time.perf_counter() - started)
        return self._answers.answer(error)

    def __call__(self, method: bytes, url: bytes, headers: dict[bytes, bytes]) -> CannedResponse | None:
        # Every request head read keeps the loop's lag sampled: it feeds the schedulers.
        lag = self._lag
        if lag is None:
            lag = self._lag = read_lag_of(asyncio.get_running_loop())
        lag.observe()
        if method != b"POST" or b"expect" in headers:
            return None  # a client waiting for 100 Continue would not send the body we skip
        target = self._targets.get(url, _UNSEEN)
        if target is _UNSEEN:
            target = self._remember(url)
        if target is None:
            return None
        name, version = target
        started = time.perf_counter()
        gate = self._gate
        tenant_of = None if gate is None else partial(_tenant, gate, headers)  # asked on refusals only
        error = edge_verdict(self._dataplane, name, version, tenant_of)
        if isinstance(error, bool):  # nothing refuses it for load: the full path answers
            return None
        answer = self._answers.answer(error)
        telemetry = self._telemetry
        raw_id = headers.get(b"x-request-id")
        request_id = None if raw_id is None else raw_id.decode("latin-1")
        if telemetry.access_log or telemetry.tracing is not None:
            scope = telemetry.begin("http", name, version, request_id, None)
            scope.finish(error, error.http_status)
        else:
            telemetry.refused("http", name, version, error, time.perf_counter() - started)
        echoed = echoable_id(request_id)
        return answer if echoed is None else answer.with_header(b"x-request-id", echoed)

    def _remember(self, url: bytes) -> Target | None:
        if len(self._targets) >= _MAX_TARGETS:
            self._targets.clear()
        target = self._targets[url] = infer_target(url)
        return target


def _tenant(gate: TenantGate, headers: dict[bytes, bytes]) -> str | None:
    """The request's tenant as the full path's gate will name it, or None (no valid key: the
    full path answers it)."""

    def header(name: str) -> str | None:
        value = headers.get(name.encode("latin-1"))
        return None if value is None else value.decode("latin-1")

    return gate.named(header)
