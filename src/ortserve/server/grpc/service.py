"""inference.GRPCInferenceService: decode the message, call the DataPlane, encode the answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeAlias, TypeVar

import grpc

from ortserve.core.dataplane import DataPlane
from ortserve.errors import InternalError, NotImplementedByServer, OrtServeError
from ortserve.loadtest.capture import Capture
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.protocol.grpc import grpc_service_pb2_grpc as pb_grpc
from ortserve.protocol.grpc.codec import (
    decode_infer_request,
    encode_infer_response,
    encode_model_metadata,
    encode_model_statistics,
    encode_server_metadata,
    request_timeout,
)
from ortserve.protocol.tensors import TensorLimits
from ortserve.server.grpc.errors import (
    INTERNAL_MESSAGE,
    abort_internal,
    abort_with,
    log_internal,
    status_code,
)
from ortserve.statistics import ServerStatistics
from ortserve.telemetry import Telemetry

__all__ = ["InferenceService"]

Context: TypeAlias = grpc.aio.ServicerContext
_T = TypeVar("_T")


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    """The Open Inference Protocol's gRPC calls on the server's one DataPlane.

    Args:
        dataplane: the DataPlane the HTTP routes use too.
        limits: tensor limits applied while decoding.
        telemetry: request accounting (metrics, statistics, traces) shared with HTTP.
    """

    def __init__(
        self, dataplane: DataPlane, limits: TensorLimits, telemetry: Telemetry | None = None
    ) -> None:
        self._dataplane = dataplane
        self._limits = limits
        self._telemetry = telemetry or Telemetry(ServerStatistics())
        self._readers: set[asyncio.Task[None]] = set()
        self.capture: Capture | None = None
        """Set by the server when ``--capture-dir`` is given; None costs one check per call."""

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._dataplane.live())

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._dataplane.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context) -> pb.ModelReadyResponse:
        return await _answer(
            context,
            lambda: pb.ModelReadyResponse(
                ready=self._dataplane.model_ready(request.name, request.version or None)
            ),
        )

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Context
    ) -> pb.ServerMetadataResponse:
        return encode_server_metadata(self._dataplane.server_metadata())

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: Context
    ) -> pb.ModelMetadataResponse:
        return await _answer(
            context,
            lambda: encode_model_metadata(
                self._dataplane.model_metadata(request.name, request.version or None)
            ),
        )

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Context) -> pb.ModelInferResponse:
        capture = self.capture
        record = capture is not None and capture.sampled()
        arrival = (time.time(), time.monotonic()) if record else (0.0, 0.0)
        try:
            answer = await self._infer(request, context)
        except OrtServeError as error:
            if record:
                self._capture(request, arrival, error.http_status)
            await abort_with(context, error)
        if record:
            self._capture(request, arrival, 200)
        return answer

    def _capture(self, request: pb.ModelInferRequest, arrival: tuple[float, float], status: int) -> None:
        """Record a sampled call in HTTP form (undecodable ones cannot be replayed: skipped)."""
        assert self.capture is not None
        try:
            decoded = decode_infer_request(request, self._limits)
        except OrtServeError:
            return
        self.capture.offer_grpc(decoded, arrival, status)

    async def _infer(self, request: pb.ModelInferRequest, context: Context) -> pb.ModelInferResponse:
        """Decode, run and encode one request, accounted like HTTP's.

        Raises:
            OrtServeError: the request failed (anything unexpected is logged, then INTERNAL).
        """
        scope = self._telemetry.begin(
            "grpc", request.model_name, request.model_version or None, None, self._traceparent(context)
        )
        try:
            infer_request = decode_infer_request(request, self._limits)
            scope.identify(infer_request)
            infer_request.timeout_s = request_timeout(infer_request.timeout_s, context.time_remaining())
            response = await self._dataplane.infer(infer_request)
            scope.inferred(response.model_version)
            answer = encode_infer_response(response)
        except OrtServeError as error:
            scope.finish(error, status_code(error).name)
            raise
        except asyncio.CancelledError:
            scope.abandon()
            raise
        except Exception as exc:
            with scope.bound():
                log_internal(exc)
            internal = InternalError(INTERNAL_MESSAGE)
            scope.finish(internal, "INTERNAL")
            raise internal from None
        scope.finish(None, "OK")
        return answer

    def _traceparent(self, context: Context) -> str | None:
        """The caller's W3C trace context, read only when tracing is on."""
        if self._telemetry.tracing is None:
            return None
        for key, value in context.invocation_metadata() or ():
            if key == "traceparent":
                return str(value)
        return None

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Context
    ) -> None:
        """Answer each request on the stream as soon as it is done, in any order.

        Requests run concurrently; each answer carries its request's id, and a failed request
        gets ``error_message`` while the stream stays open for the next ones. On drain the
        stream stops reading, answers what it holds, and ends with OK.
        """
        answers: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        writer = asyncio.create_task(_write_answers(context, answers))
        try:
            async with asyncio.TaskGroup() as in_flight:
                reader = in_flight.create_task(
                    self._read_stream(request_iterator, context, answers, in_flight)
                )
                self._readers.add(reader)
                reader.add_done_callback(self._readers.discard)
            await answers.put(None)
            await writer
        finally:
            writer.cancel()

    def drain(self) -> None:
        """Stop reading every open stream; their requests in flight are still answered."""
        for reader in list(self._readers):
            reader.cancel()

    async def _read_stream(
        self,
        request_iterator: AsyncIterator[pb.ModelInferRequest],
        context: Context,
        answers: asyncio.Queue[pb.ModelStreamInferResponse | None],
        in_flight: asyncio.TaskGroup,
    ) -> None:
        async for request in request_iterator:
            in_flight.create_task(self._answer_on_stream(request, context, answers))

    async def _answer_on_stream(
        self,
        request: pb.ModelInferRequest,
        context: Context,
        answers: asyncio.Queue[pb.ModelStreamInferResponse | None],
    ) -> None:
        try:
            answer = pb.ModelStreamInferResponse(infer_response=await self._infer(request, context))
        except OrtServeError as error:
            answer = _stream_error(request, error.message)
        await answers.put(answer)

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Context) -> pb.ModelConfigResponse:
        await abort_with(context, NotImplementedByServer("ModelConfig is not offered by this server"))

    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: Context
    ) -> pb.ModelStatisticsResponse:
        statistics = self._telemetry.statistics
        return await _answer(
            context,
            lambda: encode_model_statistics(
                statistics.snapshot(request.name or None, request.version or None)
            ),
        )

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Context
    ) -> pb.RepositoryIndexResponse:
        await abort_with(context, NotImplementedByServer("RepositoryIndex is not offered by this server"))

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Context
    ) -> pb.RepositoryModelLoadResponse:
        await abort_with(context, NotImplementedByServer("model control is not offered by this server"))

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Context
    ) -> pb.RepositoryModelUnloadResponse:
        await abort_with(context, NotImplementedByServer("model control is not offered by this server"))


async def _answer(context: Context, produce: Callable[[], _T]) -> _T:
    try:
        return produce()
    except OrtServeError as error:
        await abort_with(context, error)
    except Exception as exc:
        await abort_internal(context, exc)


async def _write_answers(
    context: Context, answers: asyncio.Queue[pb.ModelStreamInferResponse | None]
) -> None:
    while (answer := await answers.get()) is not None:
        await context.write(answer)


def _stream_error(request: pb.ModelInferRequest, message: str) -> pb.ModelStreamInferResponse:
    """A failed request's answer: its message, and its id so the client can match it."""
    return pb.ModelStreamInferResponse(
        error_message=message,
        infer_response=pb.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version, id=request.id
        ),
    )
