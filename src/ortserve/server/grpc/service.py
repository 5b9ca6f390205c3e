"""inference.GRPCInferenceService: decode the message, call the DataPlane, encode the answer."""

from __future__ import annotations

import asyncio
import copy
import functools
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ortserve.core.dataplane import DataPlane
from ortserve.core.types import InferResponse
from ortserve.errors import InvalidInput, NotImplementedByServer, OrtServeError, PayloadTooLarge
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.protocol.grpc.codec import (
    decode_infer_request,
    encode_infer_response,
    encode_model_metadata,
    encode_model_statistics,
    encode_server_metadata,
    encode_shared_memory_status,
    request_timeout,
)
from ortserve.protocol.tensors import TensorLimits
from ortserve.server.cuda_shared_memory import cuda_shared_memory_rpcs
from ortserve.server.edge import EncodedRefusals, edge_verdict
from ortserve.server.exchange import Deferred, Exchange
from ortserve.server.grpc.call import GrpcCall
from ortserve.server.grpc.errors import abort_for
from ortserve.server.grpc.headers import trailers_only
from ortserve.server.grpc.peek import peek_infer_target
from ortserve.server.grpc.rpc import CallMetadata, Rpc
from ortserve.server.grpc.settings_rpcs import SettingsExtensions, settings_rpcs
from ortserve.server.grpc.stream_infer import GenerationStreams
from ortserve.server.model_control import ModelControl
from ortserve.server.restriction import Restriction
from ortserve.statistics import ServerStatistics, StatisticsSnapshot
from ortserve.telemetry import RequestScope, Telemetry

StatisticsView = Callable[[str | None, str | None], Awaitable[list[StatisticsSnapshot]]]
"""Statistics of a model (or all), from somewhere other than this process's totals."""

__all__ = ["INFERENCE_SERVICE", "InferenceService"]

INFERENCE_SERVICE = "inference.GRPCInferenceService"

STREAM_IN_FLIGHT = 256
"""Requests of one ModelStreamInfer call answered at once at most. A client streaming faster
waits under flow control; the scheduler's own queue bounds are per model, not per stream."""


class InferenceService:
    """The Open Inference Protocol's gRPC calls on the server's one DataPlane.

    Args:
        dataplane: the DataPlane the HTTP routes use too.
        limits: tensor limits applied while decoding.
        telemetry: request accounting (metrics, statistics, traces) shared with HTTP.
        exchange: the server's one request edge (shared with HTTP); by default one over
            ``dataplane`` and ``telemetry`` without capture or routing.
    """

    def __init__(
        self,
        dataplane: DataPlane,
        limits: TensorLimits,
        telemetry: Telemetry | None = None,
        exchange: Exchange | None = None,
    ) -> None:
        self._dataplane = dataplane
        self._limits = limits
        if exchange is None:
            exchange = Exchange(dataplane, telemetry or Telemetry(ServerStatistics()))
        self._exchange = exchange
        self._telemetry = exchange.telemetry
        self._refusals = EncodedRefusals(_trailers_for)  # each kept verdict's trailers-only block
        self._generations = GenerationStreams(exchange, limits)  # LLMs: a response per step
        self.control: ModelControl | None = None
        self.statistics_view: StatisticsView | None = None
        """Set in a worker of ``--workers N``: the statistics of every worker, merged."""
        """Set by the server: the repository extension and the model configuration API."""
        self.restriction: Restriction | None = None
        """The metadata repository calls must carry (``--grpc-restricted-protocol``)."""
        self.settings_extensions: SettingsExtensions | None = None
        """Set by the server: the trace and log settings calls (settings_rpcs.py)."""

    @property
    def exchange(self) -> Exchange:
        """The request edge this service answers through (the typed app services share it)."""
        return self._exchange

    def routes(self) -> dict[str, Rpc]:
        """Every method of the service, by its HTTP/2 path."""
        methods = {
            "ServerLive": Rpc(pb.ServerLiveRequest, unary=self.server_live),
            "ServerReady": Rpc(pb.ServerReadyRequest, unary=self.server_ready),
            "ModelReady": Rpc(pb.ModelReadyRequest, unary=self.model_ready),
            "ServerMetadata": Rpc(pb.ServerMetadataRequest, unary=self.server_metadata),
            "ModelMetadata": Rpc(pb.ModelMetadataRequest, unary=self.model_metadata),
            "ModelInfer": Rpc(pb.ModelInferRequest, unary=self.model_infer, refuse=self.refuse_infer),
            "ModelStreamInfer": Rpc(pb.ModelInferRequest, streaming=self.model_stream_infer),
            "ModelConfig": Rpc(pb.ModelConfigRequest, unary=self.model_config),
            "ModelStatistics": Rpc(pb.ModelStatisticsRequest, unary=self.model_statistics),
            "RepositoryIndex": Rpc(pb.RepositoryIndexRequest, unary=self.repository_index),
            "RepositoryModelLoad": Rpc(pb.RepositoryModelLoadRequest, unary=self.repository_load),
            "RepositoryModelUnload": Rpc(pb.RepositoryModelUnloadRequest, unary=self.repository_unload),
            "SystemSharedMemoryStatus": Rpc(pb.SystemSharedMemoryStatusRequest, unary=self.shm_status),
            "SystemSharedMemoryRegister": Rpc(pb.SystemSharedMemoryRegisterRequest, unary=self.shm_register),
            "SystemSharedMemoryUnregister": Rpc(
                pb.SystemSharedMemoryUnregisterRequest, unary=self.shm_unregister
            ),
            **cuda_shared_memory_rpcs(lambda: self._dataplane.shared_memory),
            **settings_rpcs(lambda: self.settings_extensions),
        }
        return {f"/{INFERENCE_SERVICE}/{name}": rpc for name, rpc in methods.items()}

    def server_live(self, request: pb.ServerLiveRequest, call: GrpcCall) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._dataplane.live())

    def server_ready(self, request: pb.ServerReadyRequest, call: GrpcCall) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._dataplane.ready())

    def model_ready(self, request: pb.ModelReadyRequest, call: GrpcCall) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self._dataplane.model_ready(request.name, request.version or None))

    def server_metadata(self, request: pb.ServerMetadataRequest, call: GrpcCall) -> pb.ServerMetadataResponse:
        return encode_server_metadata(self._dataplane.server_metadata())

    def model_metadata(self, request: pb.ModelMetadataRequest, call: GrpcCall) -> pb.ModelMetadataResponse:
        return encode_model_metadata(self._dataplane.model_metadata(request.name, request.version or None))

    def model_statistics(
        self, request: pb.ModelStatisticsRequest, call: GrpcCall
    ) -> pb.ModelStatisticsResponse | Coroutine[Any, Any, pb.ModelStatisticsResponse]:
        if self.statistics_view is not None:  # a worker of --workers N: every worker's totals
            return self._statistics_of_all(request.name or None, request.version or None)
        snapshots = self._telemetry.statistics.snapshot(request.name or None, request.version or None)
        return encode_model_statistics(snapshots)

    async def _statistics_of_all(self, name: str | None, version: str | None) -> pb.ModelStatisticsResponse:
        assert self.statistics_view is not None
        return encode_model_statistics(await self.statistics_view(name, version))

    def shm_status(
        self, request: pb.SystemSharedMemoryStatusRequest, call: GrpcCall
    ) -> pb.SystemSharedMemoryStatusResponse:
        return encode_shared_memory_status(self._dataplane.shared_memory.status(request.name or None))

    def shm_register(
        self, request: pb.SystemSharedMemoryRegisterRequest, call: GrpcCall
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self._dataplane.shared_memory.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    def shm_unregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, call: GrpcCall
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self._dataplane.shared_memory.unregister(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    def model_config(self, request: pb.ModelConfigRequest, call: GrpcCall) -> pb.ModelConfigResponse:
        config = self._control().config(request.name, request.version or None)
        return pb.ModelConfigResponse(config=config)

    async def repository_index(
        self, request: pb.RepositoryIndexRequest, call: GrpcCall
    ) -> pb.RepositoryIndexResponse:
        self._check_restricted(call)
        rows = await self._control().index_view(request.ready)
        models = [
            pb.RepositoryIndexResponse.ModelIndex(
                name=r.name, version=r.version, state=r.state, reason=r.reason
            )
            for r in rows
        ]
        return pb.RepositoryIndexResponse(models=models)

    async def repository_load(
        self, request: pb.RepositoryModelLoadRequest, call: GrpcCall
    ) -> pb.RepositoryModelLoadResponse:
        self._check_restricted(call)
        config = request.parameters.get("config")
        if any(key.startswith("file:") for key in request.parameters):
            raise InvalidInput("parameters file:<path> (model files in the request) are not supported")
        if config is not None and config.WhichOneof("parameter_choice") != "string_param":
            raise InvalidInput("parameters.config must be a string holding the model configuration as JSON")
        await self._control().load(request.model_name, None if config is None else config.string_param)
        return pb.RepositoryModelLoadResponse()

    async def repository_unload(
        self, request: pb.RepositoryModelUnloadRequest, call: GrpcCall
    ) -> pb.RepositoryModelUnloadResponse:
        self._check_restricted(call)
        dependents = request.parameters.get("unload_dependents")
        await self._control().unload(request.model_name, dependents is not None and dependents.bool_param)
        return pb.RepositoryModelUnloadResponse()

    def _control(self) -> ModelControl:
        if self.control is None:
            raise NotImplementedByServer("model control is not offered by this server")
        return self.control

    def _check_restricted(self, call: GrpcCall) -> None:
        if self.restriction is None:
            return
        given = next((value for key, value in call.metadata if key == self.restriction.key), None)
        self.restriction.check(given)

    def refuse_infer(
        self, message: bytes | bytearray | memoryview, call: CallMetadata | None = None
    ) -> bytes | bool:
        """An infer call refused under load from its message's first bytes, or whether it was
        admitted there (False: not asked, or another error applies; the handler asks before
        decoding and answers that error, e.g. NOT_FOUND for an unknown model).

        As HTTP's refusal from the path (``server/http/admission.py``): the verdict is the
        scheduler's kept one, its trailers are encoded once, the refusal is counted without a
        request scope. With tracing, the access log or capture on, every call takes the full
        path (each wants its own record of the call). With tenancy on, a queue shared by
        tenants refuses by the share of the tenant the call's metadata names. (The wait before
        the call was read is observed by the connection, once per call however often this is
        asked: ``grpc/connection.py``.)
        """
        telemetry = self._telemetry  # Exchange.records_each_request, inlined: once per call
        if self._exchange.capture is not None or telemetry.tracing is not None or telemetry.access_log:
            return False
        target = peek_infer_target(message)
        if target is None:
            return False
        started = time.perf_counter()
        name, version = target
        gate = self._exchange.gate
        tenant_of = (
            None if gate is None or call is None else functools.partial(gate.named, call.metadata_value)
        )
        error = edge_verdict(self._dataplane, name, version or None, tenant_of)
        if isinstance(error, bool):
            return error
        self._telemetry.refused("grpc", name, version or None, error, time.perf_counter() - started)
        return self._refusals.answer(error)

    def model_infer(self, request: pb.ModelInferRequest, call: GrpcCall) -> Deferred[pb.ModelInferResponse]:
        """Submit at once and answer from the future's callback: no task per call."""
        return self._submit(request, call)

    async def model_stream_infer(self, call: GrpcCall) -> None:
        """Answer each request on the stream as soon as it is done, in any order.

        Requests run concurrently; each answer carries its request's id, and a failed request
        gets ``error_message`` while the stream stays open for the next ones. On drain the
        call stops reading, answers what it holds, and ends with OK.
        """
        slots = asyncio.Semaphore(STREAM_IN_FLIGHT)
        async with asyncio.TaskGroup() as in_flight:
            # Reading waits for a free slot: the messages behind stay unread, so flow control
            # (no window for unread data) holds the client back, not a task per message.
            while await slots.acquire() and (request := await call.read()) is not None:
                assert isinstance(request, pb.ModelInferRequest)
                in_flight.create_task(self._answer_on_stream(request, call, slots))

    async def _answer_on_stream(
        self, request: pb.ModelInferRequest, call: GrpcCall, slots: asyncio.Semaphore
    ) -> None:
        try:
            if self._generations.serves(request):
                await self._generations.answer(request, call)  # writes its own responses
                return
            answer = await self._infer(request, call)
        finally:
            slots.release()
        if isinstance(answer, OrtServeError):
            call.write(_stream_error(request, answer.message))
        else:
            call.write(pb.ModelStreamInferResponse(infer_response=answer))

    async def _infer(
        self, request: pb.ModelInferRequest, call: GrpcCall
    ) -> pb.ModelInferResponse | OrtServeError:
        """One request of a stream: its answer, or its error (the stream goes on)."""
        exchange = self._exchange
        scope = self._begin(request, call)
        pending = exchange.attempt(scope, self._queue, request, call, scope)
        if isinstance(pending, OrtServeError):
            return pending
        try:
            await asyncio.wait((pending,))
        except asyncio.CancelledError:
            pending.cancel()
            raise
        return exchange.attempt(scope, _infer_answer, exchange, scope, call, pending)

    def _submit(self, request: pb.ModelInferRequest, call: GrpcCall) -> Deferred[pb.ModelInferResponse]:
        """Queue one unary request through the Exchange, as HTTP's: what raises here or in the
        deferred answer is the call's failure (``GrpcCall._abort`` finishes the scope)."""
        exchange = self._exchange
        scope = exchange.begin(
            "grpc", request.model_name, request.model_version or None, None, self._traceparent(call)
        )
        call.scope_failed = functools.partial(exchange.failed, scope)
        pending = self._queue(request, call, scope)
        return Deferred(pending, functools.partial(_infer_answer, exchange, scope, call))

    def _begin(self, request: pb.ModelInferRequest, call: GrpcCall) -> RequestScope:
        return self._exchange.begin(
            "grpc", request.model_name, request.model_version or None, None, self._traceparent(call)
        )

    def _queue(
        self, request: pb.ModelInferRequest, call: GrpcCall, scope: RequestScope
    ) -> asyncio.Future[InferResponse]:
        """Admit, decode and queue one request.

        Raises:
            OrtServeError: the request was refused.
        """
        exchange = self._exchange
        # The tenant's key and quota, then a refusal under load, before the tensors are
        # decoded (the most urgent lane: the request may ask for it, and it is refused
        # last), unless the edge just admitted it.
        tenant = None if exchange.gate is None else exchange.admit(call.metadata_value)
        if not call.edge_admitted:
            refused = self._dataplane.refusal(
                request.model_name,
                request.model_version or None,
                1,
                None if tenant is None else functools.partial(str, tenant),
            )
            if refused is not None:
                raise copy.copy(refused)  # shared by the requests it refuses: raise a copy
        infer_request = decode_infer_request(request, self._limits, self._dataplane.shared_memory)
        infer_request.timeout_s = request_timeout(infer_request.timeout_s, call.time_remaining())
        return exchange.submit(scope, infer_request, call.metadata_value, tenant)

    def _traceparent(self, call: GrpcCall) -> str | None:
        """The caller's W3C trace context, read only when tracing is on."""
        if self._telemetry.tracing is None:
            return None
        for key, value in call.metadata:
            if key == "traceparent":
                return value
        return None


DEGRADED_METADATA = "x-ortserve-degraded"
"""Trailing metadata of a call answered by a fallback level (a stream's: any of its answers)."""


def _infer_answer(
    exchange: Exchange, scope: RequestScope, call: GrpcCall, done: asyncio.Future[InferResponse]
) -> pb.ModelInferResponse:
    """The answer to a settled inference; the future is cancelled when the client went away.

    Raises:
        OrtServeError: the request failed, or its answer is larger than the call may send (the
            caller finishes the scope with it: counted and logged as what the client got).
    """
    if done.cancelled():
        exchange.abandon(scope)
        raise asyncio.CancelledError
    response = done.result()
    if response.degraded is not None:  # a fallback level answered (docs/resilience.md)
        call.trailing = ((DEGRADED_METADATA, response.degraded.header),)
    scope.inferred(response.model_version)
    answer = encode_infer_response(response)
    size = answer.ByteSize()
    if size > call.max_message:
        raise PayloadTooLarge(f"response larger than max ({size} vs. {call.max_message})")
    call.scope_failed = None
    exchange.finish(scope, None, "OK")
    return answer


def _trailers_for(error: OrtServeError) -> bytes:
    abort = abort_for(error)
    return trailers_only(abort.code, abort.message, abort.trailers)


def _stream_error(request: pb.ModelInferRequest, message: str) -> pb.ModelStreamInferResponse:
    """A failed request's answer: its message, and its id so the client can match it."""
    return pb.ModelStreamInferResponse(
        error_message=message,
        infer_response=pb.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version, id=request.id
        ),
    )
