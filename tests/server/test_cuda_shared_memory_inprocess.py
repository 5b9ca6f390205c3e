"""CUDA shared memory through the real HTTP app, DataPlane, scheduler and session, in process,
with the CUDA runtime faked (tests/fake_cuda.py): registered by base64 handle, the input read from
the region, the output written into it, the answer carrying no data; unknown and out-of-bounds
windows refused."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from fake_cuda import FakeCuda
from ortserve.core.cuda_shared_memory import SharedMemoryRegions
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
