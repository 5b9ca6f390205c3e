"""A large JSON request is parsed on a worker thread, a small one on the loop; both answered alike."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import onnx
import pytest

from ortserve.core.dataplane import DataPlane
from ortserve.core.types import ServerMetadata
from ortserve.demo import build_mlp
from ortserve.protocol.tensors import TensorLimits
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.registry import ModelRegistry
from ortserve.server.http import app as app_module
from ortserve.server.http.app import HttpApp
from ortserve.server.http.messages import HttpRequest, resolve_response
from ortserve.settings import ServerSettings


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[HttpApp]:
    folder = tmp_path / "tiny" / "1"
    folder.mkdir(parents=True)
    onnx.save(build_mlp([4, 8, 2], seed=0, name="tiny"), folder / "model.onnx")
    registry = ModelRegistry()
    await LifecycleManager(registry, ServerSettings(model_repository=tmp_path, intra_op_threads=1)).start()
    yield HttpApp(
        DataPlane(registry, ServerMetadata("ortserve", "test", ())), TensorLimits(1 << 20, 8, 1 << 20)
    )
    await registry.unload_all(5.0)


@pytest.mark.parametrize(("padding", "off_loop"), [(10, False), (2 << 20, True)])
async def test_where_a_json_request_is_parsed_follows_its_size(
    app: HttpApp, monkeypatch: pytest.MonkeyPatch, padding: int, off_loop: bool
) -> None:
    threads: list[threading.Thread] = []
    decode = app_module.decode_infer_request  # type: ignore[attr-defined]

    def recorded(*args: object) -> object:
        threads.append(threading.current_thread())
        return decode(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(app_module, "decode_infer_request", recorded)
    document = {
        "parameters": {"note": "x" * padding},  # a large document of a small tensor
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [0.5] * 4}],
    }
    request = HttpRequest("POST", "/v2/models/tiny/infer", "", {}, json.dumps(document).encode())
    response = await resolve_response(app(request))
    assert response.status == 200, b"".join(response.chunks)
    assert json.loads(b"".join(response.chunks))["outputs"][0]["shape"] == [1, 2]
    assert (threads[0] is not threading.main_thread()) == off_loop


async def test_a_large_invalid_document_is_a_400_from_the_worker_thread(app: HttpApp) -> None:
    body = b'{"inputs": [' + b" " * (2 << 20) + b"not json"
    response = await resolve_response(app(HttpRequest("POST", "/v2/models/tiny/infer", "", {}, body)))
    assert response.status == 400 and b"not valid JSON" in b"".join(response.chunks)
