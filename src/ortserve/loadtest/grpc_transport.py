"""gRPC load: pre-serialized ModelInferRequest messages on shared grpc.aio channels."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import grpc.aio

from ortserve.loadtest.inputs import Inputs, InputSpec
from ortserve.loadtest.transports import Client, Closer, Reply
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.protocol.tensors import array_to_binary

__all__ = ["GRPC_STATUS_BASE", "GrpcClient", "GrpcTarget", "encode_request", "fetch_grpc_input_specs"]

GRPC_STATUS_BASE = 1000
"""A failed call is recorded as status ``1000 + grpc code`` (``1014``: UNAVAILABLE)."""
_INFER = "/inference.GRPCInferenceService/ModelInfer"
_METADATA = "/inference.GRPCInferenceService/ModelMetadata"
_CHANNELS_PER_PROCESS = 4


@dataclass(frozen=True, slots=True)
class GrpcTarget:
    """Where gRPC requests go: ``host:port`` (``grpc://`` accepted)."""

    address: str

    def open_clients(self, count: int, timeout_s: float) -> tuple[list[Client], Closer]:
        """``count`` clients spread over a few channels, and how to close them (in the loop)."""
        channels = [grpc.aio.insecure_channel(self.address) for _ in range(min(count, _CHANNELS_PER_PROCESS))]
        clients: list[Client] = [GrpcClient(channels[i % len(channels)], timeout_s) for i in range(count)]

        async def close() -> None:
            for channel in channels:
                await channel.close()

        return clients, close

    @classmethod
    def parse(cls, url: str) -> GrpcTarget:
        address = url.removeprefix("grpc://").rstrip("/")
        if ":" not in address or "/" in address:
            raise ValueError(f"not a gRPC address (host:port): {url!r}")
        return cls(address)


def encode_request(arrays: Inputs, model: str, version: str | None) -> bytes:
    """A serialized ModelInferRequest with every input in ``raw_input_contents``."""
    request = pb.ModelInferRequest(model_name=model, model_version=version or "")
    for name, (datatype, array) in arrays.items():
        request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        request.raw_input_contents.append(b"".join(bytes(c) for c in array_to_binary(array)))
    serialized: bytes = request.SerializeToString()
    return serialized


def fetch_grpc_input_specs(
    target: GrpcTarget, model: str, version: str | None, timeout_s: float = 10.0
) -> list[InputSpec]:
    """Read the model's inputs with the ModelMetadata call.

    Raises:
        ValueError: the call failed.
    """
    with grpc.insecure_channel(target.address) as channel:
        call = channel.unary_unary(
            _METADATA,
            request_serializer=pb.ModelMetadataRequest.SerializeToString,
            response_deserializer=pb.ModelMetadataResponse.FromString,
        )
        try:
            reply = call(pb.ModelMetadataRequest(name=model, version=version or ""), timeout=timeout_s)
        except grpc.RpcError as error:
            reason = f"{error.code().name}: {error.details()}"
            raise ValueError(
                f"cannot read the metadata of model {model!r} at {target.address}: {reason}"
            ) from None
    return [InputSpec(t.name, t.datatype, tuple(t.shape)) for t in reply.inputs]


class GrpcClient:
    """Sends pre-serialized infer requests; calls share a few channels per process.

    Args:
        channel: the shared grpc.aio channel (HTTP/2 multiplexes the calls).
        timeout_s: the call deadline.
    """

    def __init__(self, channel: grpc.aio.Channel, timeout_s: float) -> None:
        # No serializers: the request is already bytes and the response stays undecoded.
        self._call = channel.unary_unary(_INFER)
        self._timeout_s = timeout_s

    async def send(self, wire: bytes) -> Reply:
        try:
            await self._call(wire, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as error:
            return Reply(GRPC_STATUS_BASE + error.code().value[0])
        return Reply(200)
