"""Triton's CUDA shared-memory RPCs over gRPC: ``CudaSharedMemoryStatus/Register/Unregister``.

The same registry as HTTP's ``/v2/cudasharedmemory`` (core/cuda_shared_memory.py); gRPC carries
the IPC handle as raw bytes (tritonclient.grpc base64-decodes what ``get_raw_handle`` gives).
Off, or on a host without CUDA, every call answers UNIMPLEMENTED with the reason.
"""

from __future__ import annotations

from collections.abc import Callable

from ortserve.core.cuda_shared_memory import CUDA_OFF, CudaSharedMemoryRegistry, SharedMemoryRegions
from ortserve.core.shared_memory import SharedMemoryRegistry
from ortserve.errors import NotImplementedByServer
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.server.grpc.call import GrpcCall
from ortserve.server.grpc.rpc import Rpc

__all__ = ["cuda_shared_memory_rpcs"]


def cuda_shared_memory_rpcs(registry: Callable[[], SharedMemoryRegistry]) -> dict[str, Rpc]:
    """The three methods by name; ``registry`` is read at each call."""

    def cuda() -> CudaSharedMemoryRegistry:
        regions = registry()
        if not isinstance(regions, SharedMemoryRegions):  # the server keeps this one when CUDA is off
            raise NotImplementedByServer(CUDA_OFF)
        regions.cuda.ready()
        return regions.cuda

    def status(
        request: pb.CudaSharedMemoryStatusRequest, call: GrpcCall
    ) -> pb.CudaSharedMemoryStatusResponse:
        Status = pb.CudaSharedMemoryStatusResponse.RegionStatus
        found = cuda().status(request.name or None)
        return pb.CudaSharedMemoryStatusResponse(
            regions={r.name: Status(name=r.name, device_id=r.device_id, byte_size=r.byte_size) for r in found}
        )

    def register(
        request: pb.CudaSharedMemoryRegisterRequest, call: GrpcCall
    ) -> pb.CudaSharedMemoryRegisterResponse:
        cuda().register(
            request.name, bytes(request.raw_handle), int(request.device_id), int(request.byte_size)
        )
        return pb.CudaSharedMemoryRegisterResponse()

    def unregister(
        request: pb.CudaSharedMemoryUnregisterRequest, call: GrpcCall
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        cuda().unregister(request.name or None)
        return pb.CudaSharedMemoryUnregisterResponse()

    return {
        "CudaSharedMemoryStatus": Rpc(pb.CudaSharedMemoryStatusRequest, unary=status),
        "CudaSharedMemoryRegister": Rpc(pb.CudaSharedMemoryRegisterRequest, unary=register),
        "CudaSharedMemoryUnregister": Rpc(pb.CudaSharedMemoryUnregisterRequest, unary=unregister),
    }
