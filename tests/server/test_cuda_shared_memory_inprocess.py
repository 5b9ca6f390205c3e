"""CUDA shared memory through the real HTTP app, DataPlane, scheduler and session, in process,
with the CUDA runtime faked (tests/fake_cuda.py): registered by base64 handle, the input read from
the region, the output written into it, the answer carrying no data; unknown and out-of-bounds
windows refused. On the binding path (a CUDA session's; the CPU standing in) a request run alone
binds its windows themselves, and a batch of several takes the copy path, with equal answers."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from fake_cuda import FakeCuda
from ortserve.core.binding import BindingRun, DeviceSpec
from ortserve.core.cuda_shared_memory import SharedMemoryRegions
from ortserve.core.cuda_windows import InputWindow
from ortserve.core.dataplane import DataPlane
from ortserve.core.types import ServerMetadata
from ortserve.demo import build_mlp
from ortserve.protocol.tensors import TensorLimits
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.server.http.app import HttpApp
from ortserve.server.http.messages import HttpRequest, HttpResponse, resolve_response
from ortserve.server.http.shared_memory_routes import add_shared_memory_routes
from ortserve.settings import ServerSettings

X = np.array([[0.5, -1.0, 2.0, 0.25]], dtype=np.float32)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[HttpApp, FakeCuda]]:
    folder = tmp_path / "tiny" / "1"
    folder.mkdir(parents=True)
    onnx.save(build_mlp([4, 8, 2], seed=0, name="tiny"), folder / "model.onnx")
    registry = ModelRegistry()
    await LifecycleManager(registry, ServerSettings(model_repository=tmp_path, intra_op_threads=1)).start()
    fake = FakeCuda()
    regions = SharedMemoryRegions(0, 4, runtime=lambda: fake)
    app = HttpApp(
        DataPlane(registry, ServerMetadata("ortserve", "test", ()), regions),
        TensorLimits(1 << 20, 8, 1 << 20),
    )
    add_shared_memory_routes(app, regions)
    yield app, fake
    await registry.unload_all(5.0)


async def _post(app: HttpApp, path: str, document: object) -> tuple[int, dict[str, object]]:
    response = await resolve_response(app(HttpRequest("POST", path, "", {}, json.dumps(document).encode())))
    assert isinstance(response, HttpResponse)
    body = b"".join(response.chunks)
    return response.status, json.loads(body) if body else {}


async def test_an_infer_reads_its_input_from_and_writes_its_output_into_a_cuda_region(
    served: tuple[HttpApp, FakeCuda],
) -> None:
    app, fake = served
    plain = {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": X.reshape(-1).tolist()}]
    }
    status, answer = await _post(app, "/v2/models/tiny/infer", plain)
    assert status == 200
    output = answer["outputs"][0]  # type: ignore[index]
    want = np.array(output["data"], dtype=np.float32)
    handle, memory = fake.export(64)
    memory[:16] = np.frombuffer(X.tobytes(), dtype=np.uint8)
    register = {"raw_handle": {"b64": base64.b64encode(handle).decode()}, "device_id": 0, "byte_size": 64}
    assert (await _post(app, "/v2/cudasharedmemory/region/io/register", register))[0] == 200
    window = {"shared_memory_region": "io", "shared_memory_byte_size": 16}
    request = {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "parameters": window}],
        "outputs": [
            {
                "name": output["name"],
                "parameters": {
                    "shared_memory_region": "io",
                    "shared_memory_offset": 32,
                    "shared_memory_byte_size": 8,
                },
            }
        ],
    }
    status, answer = await _post(app, "/v2/models/tiny/infer", request)
    assert status == 200, answer
    answered = answer["outputs"][0]  # type: ignore[index]
    assert "data" not in answered and answered["parameters"]["shared_memory_byte_size"] == 8
    np.testing.assert_array_equal(memory[32:40].view(np.float32), want)
    assert ("copy_to_host", (memory.ctypes.data, 16)) in fake.calls
    assert ("copy_from_host", (memory.ctypes.data + 32, 8)) in fake.calls

    request["inputs"][0]["parameters"] = {**window, "shared_memory_offset": 56}
    status, answer = await _post(app, "/v2/models/tiny/infer", request)
    assert status == 400 and "exceeds the 64 bytes" in str(answer["error"])
    request["inputs"][0]["parameters"] = {**window, "shared_memory_region": "nope"}
    status, answer = await _post(app, "/v2/models/tiny/infer", request)
    assert status == 400 and "not registered" in str(answer["error"])
    assert (await _post(app, "/v2/cudasharedmemory/unregister", {}))[0] == 200
    assert fake.opened == {}


BATCHED = """\
batching:
  max_batch_size: 3
  max_queue_delay_ms: 2000
"""


@pytest.fixture
async def bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[HttpApp, FakeCuda, list[int]]]:
    """The same, with the versions' sessions on the binding path (as a CUDA session's are: the
    CPU stands in for the device, and the fake's device memory is host memory, bound as ``cpu``),
    a model that batches three requests, and a count of the runs made straight on windows."""
    monkeypatch.setattr("ortserve.core.runner.binding_device", lambda session: DeviceSpec("cpu"))
    direct: list[int] = []
    on_windows = BindingRun._run_on_windows

    def counted(
        self: BindingRun, feeds: dict[str, np.ndarray], windows: list[InputWindow]
    ) -> list[np.ndarray]:
        direct.append(len(windows))
        return on_windows(self, feeds, windows)

    monkeypatch.setattr(BindingRun, "_run_on_windows", counted)
    for name in ("tiny", "batched"):
        folder = tmp_path / name / "1"
        folder.mkdir(parents=True)
        onnx.save(build_mlp([4, 8, 2], seed=0, name=name), folder / "model.onnx")
    (tmp_path / "batched" / "config.yaml").write_text(BATCHED, encoding="utf-8")
    registry = ModelRegistry()
    await LifecycleManager(registry, ServerSettings(model_repository=tmp_path, intra_op_threads=1)).start()
    fake = FakeCuda()
    regions = SharedMemoryRegions(0, 4, runtime=lambda: fake, memory_kind="cpu")
    app = HttpApp(
        DataPlane(registry, ServerMetadata("ortserve", "test", ()), regions),
        TensorLimits(1 << 20, 8, 1 << 20),
    )
    add_shared_memory_routes(app, regions)
    yield app, fake, direct
    await registry.unload_all(5.0)


def _windowed(model: str, at: int) -> tuple[str, dict[str, object]]:
    """An infer of ``model`` reading [1, 4] FP32 at ``at`` and writing its output at ``at + 16``."""
    return f"/v2/models/{model}/infer", {
        "inputs": [
            {
                "name": "input",
                "datatype": "FP32",
                "shape": [1, 4],
                "parameters": {
                    "shared_memory_region": "io",
                    "shared_memory_offset": at,
                    "shared_memory_byte_size": 16,
                },
            }
        ],
        "outputs": [
            {
                "name": "output",
                "parameters": {
                    "shared_memory_region": "io",
                    "shared_memory_offset": at + 16,
                    "shared_memory_byte_size": 8,
                },
            }
        ],
    }


async def _expected(app: HttpApp, model: str, rows: np.ndarray) -> np.ndarray:
    plain = {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": rows.reshape(-1).tolist()}]
    }
    status, answer = await _post(app, f"/v2/models/{model}/infer", plain)
    assert status == 200
    return np.array(answer["outputs"][0]["data"], dtype=np.float32)  # type: ignore[index]


async def test_a_lone_request_on_the_binding_path_runs_straight_on_its_windows(
    bound: tuple[HttpApp, FakeCuda, list[int]],
) -> None:
    app, fake, direct = bound
    want = await _expected(app, "tiny", X)
    assert direct == []  # a request with its data on the wire keeps the arena path
    handle, memory = fake.export(64)
    memory[:16] = np.frombuffer(X.tobytes(), dtype=np.uint8)
    register = {"raw_handle": {"b64": base64.b64encode(handle).decode()}, "device_id": 0, "byte_size": 64}
    assert (await _post(app, "/v2/cudasharedmemory/region/io/register", register))[0] == 200
    fake.calls.clear()
    status, answer = await _post(app, *_windowed("tiny", 0))
    assert status == 200, answer
    assert direct == [1]
    np.testing.assert_array_equal(memory[16:24].view(np.float32), want)
    copies = [call for call in fake.calls if call[0].startswith("copy")]
    # The input's one host copy is the decoder's (validation, captures and batching read it);
    # the run read the window itself and ONNX Runtime wrote the output into its window.
    assert copies == [("copy_to_host", (memory.ctypes.data, 16))]
    assert (await _post(app, "/v2/cudasharedmemory/unregister", {}))[0] == 200
    assert fake.opened == {}


async def test_a_batch_of_several_requests_takes_the_copy_path_with_the_same_answers(
    bound: tuple[HttpApp, FakeCuda, list[int]],
) -> None:
    app, fake, direct = bound
    rows = [X * (index + 1) for index in range(3)]
    wants = [await _expected(app, "tiny", each) for each in rows]
    handle, memory = fake.export(3 * 32)
    for index, each in enumerate(rows):
        memory[32 * index : 32 * index + 16] = np.frombuffer(each.tobytes(), dtype=np.uint8)
    register = {"raw_handle": {"b64": base64.b64encode(handle).decode()}, "device_id": 0, "byte_size": 96}
    assert (await _post(app, "/v2/cudasharedmemory/region/io/register", register))[0] == 200
    fake.calls.clear()
    answers = await asyncio.gather(*(_post(app, *_windowed("batched", 32 * index)) for index in range(3)))
    assert [status for status, _ in answers] == [200, 200, 200], answers
    assert direct == []  # one batch of three: joined in host memory, outputs copied into their windows
    for index, want in enumerate(wants):
        np.testing.assert_array_equal(memory[32 * index + 16 : 32 * index + 24].view(np.float32), want)
    copied_in = [call for call in fake.calls if call[0] == "copy_from_host"]
    assert len(copied_in) == 3
