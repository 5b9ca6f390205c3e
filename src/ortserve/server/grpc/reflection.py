"""gRPC server reflection (v1 and v1alpha), so grpcurl and similar tools can discover the services."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2 as rpb

from ortserve.protocol.grpc import apps_pb2, grpc_service_pb2, model_config_pb2
from ortserve.server.grpc.app_services import APP_SERVICES
from ortserve.server.grpc.call import GrpcCall
from ortserve.server.grpc.errors import StatusCode
from ortserve.server.grpc.health import HEALTH_SERVICE
from ortserve.server.grpc.rpc import Rpc
from ortserve.server.grpc.service import INFERENCE_SERVICE

__all__ = ["REFLECTION_SERVICES", "Reflection"]

# v1 is v1alpha under a new package name, field for field, so one set of messages serves both.
REFLECTION_SERVICES = ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection")


class Reflection:
    """Answers ``ServerReflectionInfo`` from one descriptor pool holding every served file."""

    def __init__(self) -> None:
        self._pool = descriptor_pool.DescriptorPool()
        for module in (model_config_pb2, grpc_service_pb2, apps_pb2, health_pb2, rpb):  # dependencies first
            self._pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
        self._services = (INFERENCE_SERVICE, *APP_SERVICES, HEALTH_SERVICE, *REFLECTION_SERVICES)

    def routes(self) -> dict[str, Rpc]:
        rpc = Rpc(rpb.ServerReflectionRequest, streaming=self.reflect)
        return {f"/{service}/ServerReflectionInfo": rpc for service in REFLECTION_SERVICES}

    async def reflect(self, call: GrpcCall) -> None:
        while (request := await call.read()) is not None:
            assert isinstance(request, rpb.ServerReflectionRequest)
            call.write(self.answer(request))

    def answer(self, request: rpb.ServerReflectionRequest) -> rpb.ServerReflectionResponse:
        """One reflection answer; an unknown name or an unsupported question is an error response."""
        response = rpb.ServerReflectionResponse(valid_host=request.host, original_request=request)
        question = request.WhichOneof("message_request")
        try:
            if question == "list_services":
                names = [rpb.ServiceResponse(name=name) for name in self._services]
                response.list_services_response.service.extend(names)
            elif question == "file_by_filename":
                self._files(response, self._pool.FindFileByName(request.file_by_filename))
            elif question == "file_containing_symbol":
                self._files(response, self._pool.FindFileContainingSymbol(request.file_containing_symbol))
            else:
                return _error(response, StatusCode.UNIMPLEMENTED, f"{question} is not supported")
        except KeyError as exc:
            return _error(response, StatusCode.NOT_FOUND, str(exc.args[0] if exc.args else exc))
        return response

    @staticmethod
    def _files(response: rpb.ServerReflectionResponse, file: FileDescriptor) -> None:
        """The file and, transitively, every file it imports (what clients need to decode it)."""
        seen: set[str] = set()
        pending = [file]
        while pending:
            current = pending.pop()
            if current.name in seen:
                continue
            seen.add(current.name)
            proto = descriptor_pb2.FileDescriptorProto()
            current.CopyToProto(proto)
            response.file_descriptor_response.file_descriptor_proto.append(proto.SerializeToString())
            pending.extend(current.dependencies)


def _error(
    response: rpb.ServerReflectionResponse, code: StatusCode, message: str
) -> rpb.ServerReflectionResponse:
    response.error_response.error_code = code
    response.error_response.error_message = message
    return response
