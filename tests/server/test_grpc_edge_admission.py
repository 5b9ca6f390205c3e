"""A ModelInfer call the edge already admitted from its first bytes is not asked about again
before it is decoded; one the edge could not read is."""

from __future__ import annotations

import asyncio

import numpy as np

from ortserve.core.dataplane import DataPlane
from ortserve.core.model import ModelState, Servable, VersionInfo
from ortserve.core.types import InferOutput, InferRequest, InferResponse, ServerMetadata, TensorSpec
from ortserve.errors import ModelNotFound, OrtServeError
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.protocol.tensors import TensorLimits
from ortserve.server.grpc.rpc import Deferred
from ortserve.server.grpc.service import InferenceService

SPEC = TensorSpec("x", "FP32", (-1, 4))


class AskedModel:
    """A served version that answers at once and counts how often admission is asked."""

    info = VersionInfo("m", "1", (SPEC,), (SPEC,), 8, ("CPUExecutionProvider",))
    state = ModelState.READY
    ready = True

    def __init__(self) -> None:
        self.asked = 0

    def refusal(self, priority: int = 0) -> OrtServeError | None:
        self.asked += 1
        return None

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        data = request.inputs[0].data
        answer: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
        answer.set_result(InferResponse("m", "1", [InferOutput("x", "FP32", data.shape, data)], request.id))
        return answer

    async def infer(self, request: InferRequest) -> InferResponse:
        return await self.submit(request)

    async def unload(self, grace_s: float) -> None:
        pass


class OneModel:
    def __init__(self, model: AskedModel) -> None:
        self.model = model

    def resolve(self, name: str, version: str | None) -> Servable:
        return self.model

    def served_versions(self, name: str) -> tuple[str, ...]:
        return ("1",)

    @property
    def all_ready(self) -> bool:
        return True


class Call:
    """What the infer handler reads of a call."""

    metadata: tuple[tuple[str, str], ...] = ()
    max_message = 4 * 1024 * 1024

    def __init__(self, edge_admitted: bool) -> None:
        self.edge_admitted = edge_admitted

    def metadata_value(self, name: str) -> str | None:
        return None

    def time_remaining(self) -> float | None:
        return None


def infer_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", id="r")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    return request


async def test_a_call_admitted_at_the_edge_is_decoded_without_asking_again() -> None:
    model = AskedModel()
    service = InferenceService(
        DataPlane(OneModel(model), ServerMetadata("ortserve", "0", ())), TensorLimits()
    )
    request = infer_request()
    assert service.refuse_infer(request.SerializeToString()) is True
    assert model.asked == 1
    deferred = service.model_infer(request, Call(edge_admitted=True))  # type: ignore[arg-type]
    assert isinstance(deferred, Deferred)
    await deferred.future
    answer = deferred.finish(deferred.future)
    assert model.asked == 1
    assert isinstance(answer, pb.ModelInferResponse) and answer.id == "r"
    # A call the edge did not read (a stream's, or one it could not peek) is asked before decoding.
    deferred = service.model_infer(request, Call(edge_admitted=False))  # type: ignore[arg-type]
    assert isinstance(deferred, Deferred)
    await deferred.future
    assert model.asked == 2


def test_a_message_the_edge_cannot_peek_is_not_admitted_there() -> None:
    model = AskedModel()
    service = InferenceService(
        DataPlane(OneModel(model), ServerMetadata("ortserve", "0", ())), TensorLimits()
    )
    assert service.refuse_infer(b"\x0a\x05abc") is False  # the name runs past the end
    assert model.asked == 0


def test_an_unknown_model_is_left_to_the_handler_which_answers_before_decoding() -> None:
    class NoModel(OneModel):
        def resolve(self, name: str, version: str | None) -> Servable:
            raise ModelNotFound(f"unknown model {name!r}")

    service = InferenceService(
        DataPlane(NoModel(AskedModel()), ServerMetadata("ortserve", "0", ())), TensorLimits()
    )
    assert service.refuse_infer(infer_request().SerializeToString()) is False
