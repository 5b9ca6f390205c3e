"""The shared-memory extension's REST routes: /v2/systemsharedmemory/... and /v2/cudasharedmemory/...

``GET [/region/{name}]/status``, ``POST /region/{name}/register`` (``key``, ``offset``,
``byte_size``) and ``POST [/region/{name}]/unregister`` on the DataPlane's one registry.
CUDA shared memory has the same routes; its register body is ``raw_handle`` (``{"b64": ...}``,
the cudaIpcMemHandle_t), ``device_id`` and ``byte_size``, and its status lists ``name``,
``device_id`` and ``byte_size``. It answers 501 with the reason when it is off
(``--cuda-shared-memory-regions``) or the host has no CUDA runtime
(core/cuda_shared_memory.py).
"""

from __future__ import annotations

import functools

import orjson

from ortserve.core.cuda_shared_memory import (
    CUDA_OFF,
    CudaRegionStatus,
    CudaSharedMemoryRegistry,
    SharedMemoryRegions,
    decode_raw_handle,
)
from ortserve.core.shared_memory import RegionStatus, SharedMemoryRegistry
from ortserve.errors import InvalidInput, ModelNotFound, NotImplementedByServer
from ortserve.protocol.http_codec import parse_json_body
from ortserve.server.http.app import HttpApp
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response
from ortserve.server.http.methods import method_not_allowed

__all__ = ["CUDA_SECTION", "SYSTEM_SECTION", "add_shared_memory_routes"]

SYSTEM_SECTION = "systemsharedmemory"
CUDA_SECTION = "cudasharedmemory"
_OK = b""
_METHODS = {"status": "GET", "register": "POST", "unregister": "POST"}


def _target(request: HttpRequest, parts: list[str]) -> tuple[str, str | None] | HttpResponse:
    """(action, region name or None) of a section path, or the 405 for a wrong method.

    Raises:
        ModelNotFound: a path the extension does not define (404).
    """
    if len(parts) == 1 and parts[0] in ("status", "unregister"):
        action, name = parts[0], None
    elif len(parts) == 3 and parts[0] == "region" and parts[1] and parts[2] in _METHODS:
        action, name = parts[2], parts[1]
    else:
        raise ModelNotFound(f"no route for {request.path}")
    if request.method != _METHODS[action]:
        return method_not_allowed(_METHODS[action])
    return action, name


def _status_body(regions: list[RegionStatus]) -> bytes:
    return orjson.dumps(
        [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in regions]
    )


def _register(registry: SharedMemoryRegistry, name: str, body: bytes) -> None:
    document = parse_json_body(body)
    if not isinstance(document, dict):
        raise InvalidInput("the register body must be a JSON object with 'key', 'offset' and 'byte_size'")
    if "key" not in document or "byte_size" not in document:
        raise InvalidInput("the register body needs 'key' and 'byte_size'")
    registry.register(name, document["key"], document.get("offset", 0), document["byte_size"])


def _system(registry: SharedMemoryRegistry, request: HttpRequest, parts: list[str]) -> HttpResponse:
    target = _target(request, parts)
    if isinstance(target, HttpResponse):
        return target
    action, name = target
    if action == "status":
        return json_response(200, _status_body(registry.status(name)))
    if action == "register":
        assert name is not None
        _register(registry, name, request.body)
    else:
        registry.unregister(name)
    return json_response(200, _OK)


def _cuda_status_body(regions: list[CudaRegionStatus]) -> bytes:
    return orjson.dumps(
        [{"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in regions]
    )


def _cuda_register(registry: CudaSharedMemoryRegistry, name: str, body: bytes) -> None:
    document = parse_json_body(body)
    if not isinstance(document, dict):
        raise InvalidInput(
            "the register body must be a JSON object with 'raw_handle', 'device_id' and 'byte_size'"
        )
    if any(field not in document for field in ("raw_handle", "device_id", "byte_size")):
        raise InvalidInput("the register body needs 'raw_handle', 'device_id' and 'byte_size'")
    registry.register(
        name, decode_raw_handle(document["raw_handle"]), document["device_id"], document["byte_size"]
    )


def _cuda(registry: SharedMemoryRegistry, request: HttpRequest, parts: list[str]) -> HttpResponse:
    target = _target(request, parts)
    if isinstance(target, HttpResponse):
        return target
    if not isinstance(registry, SharedMemoryRegions):  # the server keeps this one when CUDA is off
        raise NotImplementedByServer(CUDA_OFF)
    cuda = registry.cuda
    cuda.ready()  # 501 with the reason before the body is looked at
    action, name = target
    if action == "status":
        return json_response(200, _cuda_status_body(cuda.status(name)))
    if action == "register":
        assert name is not None
        _cuda_register(cuda, name, request.body)
    else:
        cuda.unregister(name)
    return json_response(200, _OK)


def _templates(section: str) -> tuple[tuple[str, str], ...]:
    """The (method, path template) pairs one section serves, as ``_target`` parses them."""
    base = f"/v2/{section}"
    return (
        ("GET", f"{base}/status"),
        ("POST", f"{base}/unregister"),
        *((method, f"{base}/region/{{region}}/{action}") for action, method in _METHODS.items()),
    )


def add_shared_memory_routes(app: HttpApp, registry: SharedMemoryRegistry) -> None:
    """Serve both sections on ``app``; the app turns raised errors into their statuses."""
    app.add_section(SYSTEM_SECTION, functools.partial(_system, registry), _templates(SYSTEM_SECTION))
    app.add_section(CUDA_SECTION, functools.partial(_cuda, registry), _templates(CUDA_SECTION))
