"""CUDA shared memory on the CPU: the registry, its bounds, the 501 paths, and what the data path
asks of CUDA, through a fake of the runtime (tests/fake_cuda.py) whose device memory is host memory."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fake_cuda import FakeCuda
from model_builders import scaled_model, serialized
from ortserve.core.cuda_ipc import CudaUnavailable, HostMemory
from ortserve.core.cuda_shared_memory import (
    CUDA_OFF,
    CudaRegion,
    CudaRegionStatus,
    SharedMemoryRegions,
    decode_raw_handle,
)
from ortserve.core.shared_memory import BYTE_SIZE, OFFSET, REGION, deliver_to_shared_memory
from ortserve.core.types import InferOutput, InferResponse, Parameters, RequestedOutput
from ortserve.errors import InvalidInput, NotImplementedByServer
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.server.cuda_shared_memory import cuda_shared_memory_rpcs
from ortserve.server.http.app import HttpApp
from ortserve.server.http.messages import HttpRequest
from ortserve.server.http.shared_memory_routes import add_shared_memory_routes


def _regions(fake: FakeCuda, cuda: int = 4, system: int = 0) -> SharedMemoryRegions:
    return SharedMemoryRegions(system, cuda, runtime=lambda: fake)


def _window(region: str, offset: int, size: int) -> Parameters:
    return {REGION: region, OFFSET: offset, BYTE_SIZE: size}


def test_off_by_default_every_call_answers_501_with_how_to_turn_it_on() -> None:
    regions = SharedMemoryRegions(runtime=lambda: FakeCuda())
    for call in (
        lambda: regions.cuda.register("a", b"\0" * 64, 0, 16),
        lambda: regions.cuda.status(),
        lambda: regions.cuda.unregister(None),
    ):
        with pytest.raises(NotImplementedByServer, match="--cuda-shared-memory-regions"):
            call()
    assert "CUDA shared memory is off" in CUDA_OFF


def test_without_cuda_every_call_answers_501_with_the_reason() -> None:
    def absent() -> FakeCuda:
        raise CudaUnavailable("no CUDA runtime library (libcudart) can be loaded")

    regions = SharedMemoryRegions(0, 4, runtime=absent)
    with pytest.raises(NotImplementedByServer, match="CUDA shared memory is not supported.*libcudart"):
        regions.cuda.register("a", b"\0" * 64, 0, 16)
    with pytest.raises(NotImplementedByServer, match="libcudart"):
        regions.cuda.status()


def test_register_status_unregister_opens_and_closes_the_handle() -> None:
    fake = FakeCuda(devices=2)
    regions = _regions(fake)
    handle, memory = fake.export(64)
    regions.cuda.register("in", handle, 1, 64)
    assert ("set_device", (1,)) in fake.calls
    assert regions.cuda.status() == [CudaRegionStatus("in", 1, 64)]
    assert regions.cuda.status("in") == [CudaRegionStatus("in", 1, 64)]
    assert fake.opened == {memory.ctypes.data: 1}
    regions.cuda.unregister("in")
    regions.cuda.unregister("never-registered")  # no error, as in Triton
    assert fake.opened == {} and regions.cuda.status() == []
    with pytest.raises(InvalidInput, match="not registered"):
        regions.cuda.status("in")


@pytest.mark.parametrize(
    ("handle", "device", "size", "message"),
    [
        (b"\1" * 63, 0, 16, "64 bytes"),
        ("text", 0, 16, "64 bytes"),
        (None, -1, 16, "device_id"),
        (None, 1, 16, "names no device"),
        (None, "0", 16, "device_id"),
        (None, 0, 0, "positive"),
        (None, 0, -5, "byte_size"),
        (None, 0, True, "byte_size"),
        (None, 0, 65, "exceeds the 64 bytes the handle exports"),
        (b"\7" * 64, 0, 16, "cannot open the CUDA IPC handle"),
    ],
)
def test_a_bad_registration_is_refused_and_leaves_nothing_open(
    handle: object, device: object, size: object, message: str
) -> None:
    fake = FakeCuda()
    regions = _regions(fake)
    exported, _ = fake.export(64)
    with pytest.raises(InvalidInput, match=message):
        regions.cuda.register("r", exported if handle is None else handle, device, size)
    assert fake.opened == {} and regions.cuda.status() == []


def test_names_are_one_namespace_with_system_regions_and_the_count_is_bounded(tmp_path: object) -> None:
    fake = FakeCuda()
    regions = _regions(fake, cuda=2, system=2)
    first, _ = fake.export(8)
    regions.cuda.register("a", first, 0, 8)
    with pytest.raises(InvalidInput, match="already registered"):
        regions.cuda.register("a", fake.export(8)[0], 0, 8)
    with pytest.raises(InvalidInput, match="already registered"):
        regions.register("a", "some-key", 0, 8)  # a system region of a CUDA region's name
    regions.cuda.register("b", fake.export(8)[0], 0, 8)
    with pytest.raises(InvalidInput, match="the most allowed"):
        regions.cuda.register("c", fake.export(8)[0], 0, 8)
    with pytest.raises(InvalidInput, match="1 to 255"):
        regions.cuda.register("", fake.export(8)[0], 0, 8)


def test_an_input_window_is_copied_from_the_device_once_and_bounds_are_checked_first() -> None:
    fake = FakeCuda()
    regions = _regions(fake)
    handle, memory = fake.export(32)
    memory[:] = np.arange(32, dtype=np.uint8)
    regions.cuda.register("in", handle, 0, 24)  # the client registers less than it exported
    fake.calls.clear()
    view = regions.view(_window("in", 8, 16), "input 'x'")
    assert view is not None and bytes(view) == bytes(range(8, 24))
    assert [name for name, _ in fake.calls] == ["set_device", "copy_to_host"]
    assert fake.calls[-1][1] == (memory.ctypes.data + 8, 16)
    fake.calls.clear()
    with pytest.raises(InvalidInput, match="exceeds the 24 bytes"):
        regions.view(_window("in", 16, 16), "input 'x'")  # inside the allocation, outside the region
    with pytest.raises(InvalidInput, match="non-negative"):
        regions.view(_window("in", -8, 8), "input 'x'")
    assert fake.calls == []  # refused before any copy
    with pytest.raises(InvalidInput, match="not registered"):
        regions.view(_window("nope", 0, 4), "input 'x'")


@settings(max_examples=200, deadline=None)
@given(
    registered=st.integers(1, 64),
    offset=st.integers(0, 96),
    size=st.integers(0, 96),
)
def test_no_window_reads_outside_the_registered_region(registered: int, offset: int, size: int) -> None:
    fake = FakeCuda()
    regions = _regions(fake)
    handle, memory = fake.export(64)
    memory[:] = np.random.default_rng(registered).integers(0, 255, 64, dtype=np.uint8)
    regions.cuda.register("r", handle, 0, registered)
    if offset + size <= registered:
        view = regions.view(_window("r", offset, size), "input")
        assert view is not None and bytes(view) == memory[offset : offset + size].tobytes()
    else:
        with pytest.raises(InvalidInput):
            regions.view(_window("r", offset, size), "input")
        assert not any(name == "copy_to_host" for name, _ in fake.calls)


async def test_outputs_are_copied_into_the_device_window_before_the_answer() -> None:
    fake = FakeCuda()
    regions = _regions(fake)
    handle, memory = fake.export(64)
    regions.cuda.register("out", handle, 0, 64)
    requested = [RequestedOutput("y", _window("out", 16, 32)), RequestedOutput("z")]
    targets = regions.output_targets(requested)
    assert targets is not None and set(targets) == {"y"}
    pending: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
    answer = deliver_to_shared_memory(pending, targets)
    y = np.arange(8, dtype=np.float32)
    pending.set_result(
        InferResponse("m", "1", [InferOutput("y", "FP32", (8,), y, dict(_window("out", 16, 32)))])
    )
    response = await answer
    assert memory[16:48].view(np.float32).tolist() == y.tolist()
    assert memory[:16].sum() == 0 and memory[48:].sum() == 0
    assert response.outputs[0].parameters == {REGION: "out", OFFSET: 16, BYTE_SIZE: 32}


async def test_an_output_larger_than_its_window_is_refused_without_a_write() -> None:
    fake = FakeCuda()
    regions = _regions(fake)
    handle, memory = fake.export(64)
    regions.cuda.register("out", handle, 0, 64)
    targets = regions.output_targets([RequestedOutput("y", _window("out", 0, 16))])
    assert targets is not None
    pending: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
    answer = deliver_to_shared_memory(pending, targets)
    pending.set_result(
        InferResponse("m", "1", [InferOutput("y", "FP32", (8,), np.ones(8, dtype=np.float32))])
    )
    with pytest.raises(InvalidInput, match="needs 32 bytes"):
        await answer
    assert memory.sum() == 0
    with pytest.raises(InvalidInput, match="exceeds the 64 bytes"):
        regions.output_targets([RequestedOutput("y", _window("out", 60, 8))])


def test_a_region_unregistered_while_bound_closes_when_the_run_releases_it() -> None:
    fake = FakeCuda()
    regions = _regions(fake)
    handle, memory = fake.export(64)
    regions.cuda.register("r", handle, 0, 64)
    region = regions.cuda.region("r", None)

    class Binding:
        def __init__(self) -> None:
            self.calls: list[tuple[object, ...]] = []

        def bind_input(self, *args: object) -> None:
            self.calls.append(("input", *args))

    binding = Binding()
    release = region.bind_input(binding, "x", 16, (2, 4), np.dtype(np.float32))
    assert binding.calls == [("input", "x", "cuda", 0, np.dtype(np.float32), [2, 4], memory.ctypes.data + 16)]
    regions.cuda.unregister("r")
    assert memory.ctypes.data in fake.opened  # still bound: not closed under the run
    with pytest.raises(InvalidInput, match="was unregistered"):
        region.read(0, 4, "input 'x'")
    release()
    assert fake.opened == {}
    with pytest.raises(InvalidInput, match="exceeds"):
        CudaRegion(CudaRegionStatus("s", 0, 8), 0, fake).bind_input(
            binding, "x", 0, (4,), np.dtype(np.float32)
        )


def test_binding_straight_to_a_window_runs_onnx_runtime_on_that_memory() -> None:
    """The direct bind path on real ONNX Runtime: ``cpu`` memory stands for the device."""
    session = ort.InferenceSession(serialized(scaled_model(3.0)), providers=["CPUExecutionProvider"])
    memory = np.zeros(64, dtype=np.uint8)
    memory[:32] = np.frombuffer(np.arange(8, dtype=np.float32).tobytes(), dtype=np.uint8)
    region = CudaRegion(CudaRegionStatus("r", 0, 64), int(memory.ctypes.data), HostMemory(), kind="cpu")  # type: ignore[arg-type]
    binding = session.io_binding()
    releases = [
        region.bind_input(binding, "x", 0, (2, 4), np.dtype(np.float32)),
        region.bind_output(binding, "y", 32, (2, 4), np.dtype(np.float32)),
    ]
    session.run_with_iobinding(binding)
    for release in releases:
        release()
    assert memory[32:].view(np.float32).tolist() == [3.0 * i for i in range(8)]


def _http(method: str, path: str, body: bytes = b"") -> HttpRequest:
    return HttpRequest(method, path, "", {}, body)


def test_http_routes_register_by_base64_handle_list_and_unregister() -> None:
    fake = FakeCuda()
    regions = _regions(fake)
    app = HttpApp.__new__(HttpApp)
    sections: dict[str, Any] = {}
    app.add_section = lambda name, handler, routes: sections.__setitem__(name, handler)  # type: ignore[method-assign]
    add_shared_memory_routes(app, regions)
    cuda = sections["cudasharedmemory"]
    handle, _ = fake.export(16)
    body = orjson.dumps(
        {"raw_handle": {"b64": base64.b64encode(handle).decode()}, "device_id": 0, "byte_size": 16}
    )
    assert (
        cuda(
            _http("POST", "/v2/cudasharedmemory/region/r/register", body), ["region", "r", "register"]
        ).status
        == 200
    )
    listed = cuda(_http("GET", "/v2/cudasharedmemory/status"), ["status"])
    assert orjson.loads(b"".join(listed.chunks)) == [{"name": "r", "device_id": 0, "byte_size": 16}]
    assert cuda(_http("POST", "/v2/cudasharedmemory/unregister"), ["unregister"]).status == 200
    assert fake.opened == {}
    with pytest.raises(InvalidInput, match="base64"):
        decode_raw_handle({"b64": "not base64!"})
    with pytest.raises(InvalidInput, match="b64"):
        decode_raw_handle("AAAA")
    off = SharedMemoryRegions(runtime=lambda: fake)
    add_shared_memory_routes(app, off)
    with pytest.raises(NotImplementedByServer, match="CUDA shared memory"):  # 501 before the body is read
        sections["cudasharedmemory"](_http("POST", "/x", b"{}"), ["region", "r", "register"])


def test_grpc_rpcs_register_by_raw_bytes_and_answer_status() -> None:
    fake = FakeCuda()
    regions = _regions(fake)
    rpcs = cuda_shared_memory_rpcs(lambda: regions)
    handle, _ = fake.export(32)
    register = rpcs["CudaSharedMemoryRegister"].unary
    status = rpcs["CudaSharedMemoryStatus"].unary
    unregister = rpcs["CudaSharedMemoryUnregister"].unary
    assert register is not None and status is not None and unregister is not None
    register(pb.CudaSharedMemoryRegisterRequest(name="g", raw_handle=handle, device_id=0, byte_size=32), None)  # type: ignore[arg-type]
    answer = status(pb.CudaSharedMemoryStatusRequest(), None)  # type: ignore[arg-type]
    assert answer.regions["g"].byte_size == 32 and answer.regions["g"].device_id == 0  # type: ignore[union-attr]
    unregister(pb.CudaSharedMemoryUnregisterRequest(name="g"), None)  # type: ignore[arg-type]
    assert fake.opened == {}
    off = cuda_shared_memory_rpcs(lambda: SharedMemoryRegions(runtime=lambda: fake))[
        "CudaSharedMemoryStatus"
    ].unary
    assert off is not None
    with pytest.raises(NotImplementedByServer, match="--cuda-shared-memory-regions"):
        off(pb.CudaSharedMemoryStatusRequest(), None)  # type: ignore[arg-type]


def test_cuda_shared_memory_with_several_workers_is_refused(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ortserve.cli.main import main

    args = [
        "serve",
        "--model-repository",
        str(tmp_path),
        "--workers",
        "2",
        "--cuda-shared-memory-regions",
        "4",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "--cuda-shared-memory-regions" in result.output and "--workers above 1" in result.output


def test_off_the_server_keeps_the_plain_system_registry_and_answers_how_to_turn_it_on() -> None:
    from ortserve.core.cuda_shared_memory import shared_memory_registry
    from ortserve.core.shared_memory import SharedMemoryRegistry

    off = shared_memory_registry(4, 0)
    assert type(off) is SharedMemoryRegistry  # nothing added to a request's path
    assert isinstance(shared_memory_registry(0, 2), SharedMemoryRegions)
    status = cuda_shared_memory_rpcs(lambda: off)["CudaSharedMemoryStatus"].unary
    assert status is not None
    with pytest.raises(NotImplementedByServer, match="--cuda-shared-memory-regions"):
        status(pb.CudaSharedMemoryStatusRequest(), None)  # type: ignore[arg-type]
