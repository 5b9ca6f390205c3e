"""One table of protocol cases run over both transports and every tritonclient flavour (sync and
asyncio, HTTP and gRPC): same answers, same errors, same messages."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as tritonclient_shm
from tritonclient.utils import InferenceServerException

import shared_memory_helpers as shm_cases
from aio_clients import open_aio_client
from model_builders import ERROR_SERVER_MAX_BODY, ERROR_SERVER_SHM_REGIONS
from openapi_check import OpenApiSpec, TeeProxy
from ortserve.testing import ServerProcess

pytestmark = pytest.mark.e2e

FLAVOURS = ("http", "http-aio", "grpc", "grpc-aio")
"""tritonclient's four clients; the aio ones through aio_clients (blocking calls on their own loop).
``tritonclient.http.aio`` sends ``Accept-Encoding: gzip`` and reads only infer answers' coding."""


@pytest.fixture(scope="module")
def clients(error_repository_server: ServerProcess) -> Iterator[dict[str, Any]]:
    opened = {
        "http": httpclient.InferenceServerClient(error_repository_server.http_address),
        "http-aio": open_aio_client("http", error_repository_server.http_address),
        "grpc": grpcclient.InferenceServerClient(error_repository_server.grpc_address),
        "grpc-aio": open_aio_client("grpc", error_repository_server.grpc_address),
    }
    yield opened
    for client in opened.values():
        client.close()


class Transport:
    """The same call through any tritonclient flavour, with answers normalized to plain data.

    ``name`` is the wire ("http" or "grpc"), which decides the answers' shape; ``flavour``
    says which client (``http-aio`` answers as ``http`` does).
    """

    def __init__(self, flavour: str, client: Any) -> None:
        self.flavour = flavour
        self.name = flavour.partition("-")[0]
        self.client = client
        self.module: Any = httpclient if self.name == "http" else grpcclient

    def metadata(self, call: Callable[..., Any], *args: str) -> dict[str, Any]:
        if self.name == "http":
            return dict(call(*args))
        return dict(call(*args, as_json=True))

    def server_metadata(self) -> dict[str, Any]:
        found = self.metadata(self.client.get_server_metadata)
        return {"name": found["name"], "extensions": sorted(found["extensions"])}

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        found = self.metadata(self.client.get_model_metadata, name, version)

        def tensors(key: str) -> list[tuple[str, str, list[int]]]:
            return [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in found[key]]

        return {"name": found["name"], "inputs": tensors("inputs"), "outputs": tensors("outputs")}

    def statistics(self, name: str) -> list[tuple[str, str]]:
        found = self.metadata(self.client.get_inference_statistics, name)
        return [(s["name"], s["version"]) for s in found["model_stats"]]

    def model_config(self, name: str) -> dict[str, Any]:
        found = self.metadata(self.client.get_model_config, name)
        config = found if self.name == "http" else found["config"]
        return {"name": config["name"], "max_batch_size": int(config.get("max_batch_size", 0))}

    def trace_settings(self, model: str | None = None, **update: object) -> dict[str, list[str]]:
        """The trace settings (changed by ``update`` first), each as a list of strings."""
        if update:
            found = self.metadata(self.client.update_trace_settings, model, update)  # type: ignore[arg-type]
        else:
            found = self.metadata(self.client.get_trace_settings, model)  # type: ignore[arg-type]
        if self.name == "http":
            return {k: v if isinstance(v, list) else [v] for k, v in found.items()}
        return {k: list(v.get("value", [])) for k, v in found["settings"].items()}

    def log_settings(self, **update: object) -> dict[str, object]:
        if update:
            found = self.metadata(self.client.update_log_settings, update)  # type: ignore[arg-type]
        else:
            found = self.metadata(self.client.get_log_settings)
        if self.name == "http":
            return found
        return {k: next(iter(v.values())) for k, v in found["settings"].items()}

    def repository_index(self) -> list[tuple[str, str]]:
        if self.name == "http":
            found: list[dict[str, Any]] = self.client.get_model_repository_index()
        else:
            found = self.metadata(self.client.get_model_repository_index).get("models", [])
        return sorted((m["name"], m.get("state", "")) for m in found)

    def infer(
        self,
        model: str,
        tensors: dict[str, tuple[str, np.ndarray]],
        outputs: list[str] | None = None,
        version: str = "",
        **options: Any,
    ) -> dict[str, list[Any]]:
        inputs = []
        for name, (datatype, array) in tensors.items():
            tensor = self.module.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        wanted = [self.module.InferRequestedOutput(n) for n in outputs] if outputs else None
        result = self.client.infer(model, inputs, model_version=version, outputs=wanted, **options)
        names = outputs or [o["name"] for o in self.outputs_of(result)]
        return {n: result.as_numpy(n).tolist() for n in names}

    def infer_declaring(self, model: str, name: str, shape: list[int]) -> object:
        """Infer with an empty FP32 tensor whose declared shape is ``shape`` (any zero dim)."""
        tensor = self.module.InferInput(name, [0], "FP32")
        tensor.set_data_from_numpy(np.zeros(0, np.float32))
        tensor.set_shape(shape)
        return self.client.infer(model, [tensor])

    def outputs_of(self, result: Any) -> list[dict[str, Any]]:
        if self.name == "http":
            return list(result.get_response()["outputs"])
        return [{"name": o.name} for o in result.get_response().outputs]


@dataclass(frozen=True)
class Case:
    """One call; either its normalized answer, or the status and code it fails with."""

    id: str
    call: Callable[[Transport], object]
    expected: object = None
    http_status: int | None = None
    grpc_code: str | None = None
    same_message: bool = True


def rows(count: int, width: int = 4) -> tuple[str, np.ndarray]:
    return "FP32", np.arange(count * width, dtype=np.float32).reshape(count, width)


TYPED = {
    "i64": ("INT64", np.array([[1, -2, 3], [2**40, 5, 6]], dtype=np.int64)),
    "flag": ("BOOL", np.array([True, False])),
    "half": ("FP16", np.array([0.5, -1.0, 65504.0, 0.0], dtype=np.float16)),
    "text": ("BYTES", np.array([b"h\xc3\xa9llo", b"world"], dtype=np.object_)),
}

TRACE_OFF = {
    "trace_file": [""],
    "trace_level": ["OFF"],
    "trace_rate": ["1"],
    "trace_count": ["-1"],
    "log_frequency": ["0"],
}
LOG_SETTINGS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "text",
}
LONG_TEXT = np.array([b"a" * 4000, b"b"], dtype=np.object_)

# Exact in bfloat16, and still exact doubled.
BF16_X = np.array([[1.0, -1.5, 0.5, 3.0], [0.0, -0.0, 65536.0, -0.0078125]], dtype=ml_dtypes.bfloat16)
BF16_DOUBLED = (BF16_X.astype(np.float32) * 2).tolist()

CASES = [
    Case("server live", lambda t: t.client.is_server_live(), True),
    Case("server ready", lambda t: t.client.is_server_ready(), True),
    Case(
        "server metadata",
        lambda t: t.server_metadata(),
        {
            "name": "ortserve",
            "extensions": [
                "binary_tensor_data",
                "classification",
                "logging",
                "model_configuration",
                "model_repository",
                "schedule_policy",
                "statistics",
                "system_shared_memory",
                "trace",
            ],
        },
    ),
    Case(
        "model metadata",
        lambda t: t.model_metadata("failing"),
        {"name": "failing", "inputs": [("x", "FP32", [-1, 4])], "outputs": [("y", "FP32", [-1, 3])]},
    ),
    Case("model ready", lambda t: t.client.is_model_ready("failing"), True),
    Case("model that failed to load is not ready", lambda t: t.client.is_model_ready("broken"), False),
    Case("metadata of an unknown model", lambda t: t.model_metadata("nope"), None, 404, "NOT_FOUND"),
    Case(
        "metadata of an unknown version", lambda t: t.model_metadata("failing", "7"), None, 404, "NOT_FOUND"
    ),
    Case("statistics", lambda t: t.statistics("failing"), [("failing", "1")]),
    Case("statistics of an unknown model", lambda t: t.statistics("nope"), None, 404, "NOT_FOUND"),
    Case("model config", lambda t: t.model_config("failing"), {"name": "failing", "max_batch_size": 8}),
    Case("config of an unknown model", lambda t: t.model_config("nope"), None, 404, "NOT_FOUND"),
    Case(
        "repository index",
        lambda t: t.repository_index(),
        [
            ("bad_config", "UNAVAILABLE"),
            ("bf16", "READY"),
            ("broken", "UNAVAILABLE"),
            ("failing", "READY"),
            ("slow", "READY"),
            ("typed", "READY"),
        ],
    ),
    Case(
        "infer with a large answer (compressed when asked)",
        lambda t: t.infer("typed", {**TYPED, "text": ("BYTES", LONG_TEXT)}, ["text_out"]),
        {"text_out": LONG_TEXT.tolist()},
    ),
    Case(
        "infer",
        lambda t: t.infer("failing", {"x": rows(3)}),
        {"y": np.arange(12, dtype=np.float32).reshape(4, 3).tolist()},
    ),
    Case(
        "infer every datatype",
        lambda t: t.infer("typed", TYPED, [f"{n}_out" for n in TYPED]),
        {f"{n}_out": array.tolist() for n, (_, array) in TYPED.items()},
    ),
    Case(
        "infer with priority and timeout parameters",
        lambda t: t.infer("failing", {"x": rows(3)}, priority=1, timeout=10_000_000),
        {"y": np.arange(12, dtype=np.float32).reshape(4, 3).tolist()},
    ),
    Case(
        "model metadata of a BF16 model",
        lambda t: t.model_metadata("bf16"),
        {
            "name": "bf16",
            "inputs": [("x", "BF16", [-1, 4])],
            "outputs": [("y", "BF16", [-1, 4]), ("y_f32", "FP32", [-1, 4])],
        },
    ),
    Case(
        "infer BF16",
        lambda t: t.infer("bf16", {"x": ("BF16", BF16_X)}),
        {"y": BF16_DOUBLED, "y_f32": BF16_DOUBLED},
    ),
    Case(
        "infer with FP16 data for a BF16 input",
        lambda t: t.infer("bf16", {"x": ("FP16", BF16_X.astype(np.float16))}),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case("infer on an unknown model", lambda t: t.infer("nope", {"x": rows(3)}), None, 404, "NOT_FOUND"),
    Case(
        "infer on an unknown version",
        lambda t: t.infer("failing", {"x": rows(3)}, version="7"),
        None,
        404,
        "NOT_FOUND",
    ),
    Case(
        "infer with a wrong datatype",
        lambda t: t.infer("failing", {"x": ("INT32", np.zeros((3, 4), np.int32))}),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case(
        "infer with a wrong dimension",
        lambda t: t.infer("failing", {"x": rows(3, 5)}),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case(
        "infer with more rows than max_batch_size",
        lambda t: t.infer("failing", {"x": rows(9)}),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case(
        "infer with an unknown input",
        lambda t: t.infer("failing", {"nope": rows(3)}),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case(
        "infer asking for an unknown output",
        lambda t: t.infer("failing", {"x": rows(3)}, ["zzz"]),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case(
        "infer with an input missing",
        lambda t: t.infer("typed", {"i64": TYPED["i64"]}),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case(
        "infer with a priority outside the lanes",
        lambda t: t.infer("failing", {"x": rows(3)}, priority=9),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case(
        "infer with a shape whose non-zero dimensions overflow 64 bits",
        lambda t: t.infer_declaring("failing", "x", [2**32, 2**32, 0]),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case(
        "infer on a model that failed to load",
        lambda t: t.infer("broken", {"x": rows(3)}),
        None,
        503,
        "UNAVAILABLE",
    ),
    Case(
        "infer that fails inside ONNX Runtime",
        lambda t: t.infer("failing", {"x": rows(1)}),
        None,
        500,
        "INTERNAL",
    ),
    Case(
        "infer whose deadline cannot be met",
        lambda t: t.infer("slow", {"x": ("FP32", np.zeros((1, 256, 256), np.float32))}, timeout=1),
        None,
        504,  # the client's deadline: never 429/RESOURCE_EXHAUSTED
        "DEADLINE_EXCEEDED",
    ),
    Case(
        "infer larger than the size limit",
        lambda t: t.infer("failing", {"x": rows(ERROR_SERVER_MAX_BODY // 16 + 1)}),
        None,
        413,
        "RESOURCE_EXHAUSTED",
        same_message=False,  # gRPC core refuses the message before ortserve sees it
    ),
]


def infer_x_from_shared_memory(
    t: Transport, region_size: int = 48, size: int = 48, offset: int = 0, name: str = "x-window"
) -> dict[str, list[Any]]:
    """``failing`` with rows(3) (48 bytes) read from a region; the answer on the wire."""
    with shm_cases.region(t.client, "x-window", region_size) as handle:
        tritonclient_shm.set_shared_memory_region(handle, [rows(3)[1]])
        tensor = t.module.InferInput("x", [3, 4], "FP32")
        tensor.set_shared_memory(name, size, offset=offset)
        result = t.client.infer("failing", [tensor])
        return {"y": result.as_numpy("y").tolist()}


def infer_classes(t: Transport, count: int) -> dict[str, list[Any]]:
    """``failing`` on rows(3) with ``y`` asked as its top ``count`` classes (labels.txt)."""
    tensor = t.module.InferInput("x", [3, 4], "FP32")
    tensor.set_data_from_numpy(rows(3)[1])
    wanted = t.module.InferRequestedOutput("y", class_count=count)
    return {"y": t.client.infer("failing", [tensor], outputs=[wanted]).as_numpy("y").tolist()}


def infer_y_into_shared_memory(t: Transport, window: int) -> object:
    with shm_cases.region(t.client, "y-window", window):
        tensor = t.module.InferInput("x", [3, 4], "FP32")
        tensor.set_data_from_numpy(rows(3)[1])
        wanted = t.module.InferRequestedOutput("y")
        wanted.set_shared_memory("y-window", window)
        return t.client.infer("failing", [tensor], outputs=[wanted])


def register_status(t: Transport) -> list[tuple[str, int, int]]:
    with shm_cases.region(t.client, "status-probe", 100, offset=12):
        return shm_cases.status(t)


def register_twice(t: Transport) -> None:
    with shm_cases.region(t.client, "twice", 16), shm_cases.region(t.client, "twice", 16):
        pass


def register_past_the_limit(t: Transport) -> None:
    with contextlib.ExitStack() as regions:
        for index in range(ERROR_SERVER_SHM_REGIONS + 1):
            regions.enter_context(shm_cases.region(t.client, f"limit-{index}", 16))


def register_key(t: Transport, key: str, size: int = 16) -> None:
    t.client.register_system_shared_memory("by-key", key, size)


Y_OF_3_ROWS = np.arange(12, dtype=np.float32).reshape(4, 3).tolist()
SHARED_MEMORY_CASES = [
    Case(
        "infer through shared memory",
        lambda t: shm_cases.infer(t, "failing", {"x": rows(3)}, {"y": 48}),
        {"y": Y_OF_3_ROWS},
    ),
    Case(
        "infer every datatype through shared memory",
        lambda t: shm_cases.infer(t, "typed", TYPED, {f"{n}_out": 64 for n in TYPED}),
        {f"{n}_out": array.tolist() for n, (_, array) in TYPED.items()},
    ),
    Case(
        "infer with outputs in shared memory and on the wire",
        lambda t: shm_cases.infer(t, "typed", TYPED, {"i64_out": 48, "text_out": 64}, ("half_out",)),
        {n: TYPED[n[:-4]][1].tolist() for n in ("i64_out", "text_out", "half_out")},
    ),
    Case("shared-memory status", register_status, [("status-probe", 12, 100)]),
    Case(
        "shared-memory status of an unknown region",
        lambda t: shm_cases.status(t, "nope"),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case(
        "infer from an unregistered region",
        lambda t: infer_x_from_shared_memory(t, name="nope"),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case(
        "infer from a window past the region's end",
        lambda t: infer_x_from_shared_memory(t, region_size=56, offset=16),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case(
        "infer from a window smaller than the tensor",
        lambda t: infer_x_from_shared_memory(t, size=32),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case(
        "infer into an output window too small",
        lambda t: infer_y_into_shared_memory(t, 40),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case(
        "register a key with no shared-memory object",
        lambda t: register_key(t, "/ortserve-no-such-object"),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case(
        "register a key that is no shared-memory name",
        lambda t: register_key(t, "/../../etc/passwd"),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case("register a region name twice", register_twice, None, 400, "INVALID_ARGUMENT"),
    Case("register more regions than allowed", register_past_the_limit, None, 400, "INVALID_ARGUMENT"),
    Case(
        "CUDA shared memory",
        lambda t: t.client.get_cuda_shared_memory_status(),
        None,
        501,
        "UNIMPLEMENTED",
    ),
]
CASES += SHARED_MEMORY_CASES
CASES += [
    Case(
        "infer with classification (Triton's score:index:label)",
        lambda t: infer_classes(t, 2),
        {
            "y": [
                [f"{3 * r + 2}.000000:2:bird".encode(), f"{3 * r + 1}.000000:1:dog".encode()]
                for r in range(4)
            ]
        },
    ),
    Case(
        "infer with more classes than elements",
        lambda t: infer_classes(t, 9),
        {
            "y": [
                [f"{3 * r + 2 - c}.000000:{2 - c}:{('cat', 'dog', 'bird')[2 - c]}".encode() for c in range(3)]
                for r in range(4)
            ]
        },
    ),
    Case("trace settings", lambda t: t.trace_settings(), TRACE_OFF),
    Case("trace settings of a model", lambda t: t.trace_settings("failing"), TRACE_OFF),
    Case("trace settings of an unknown model", lambda t: t.trace_settings("nope"), None, 404, "NOT_FOUND"),
    Case(
        "update trace settings to a count and back",
        lambda t: [
            t.trace_settings("failing", trace_count="5"),
            t.trace_settings("failing", trace_count=None),
        ],
        [{**TRACE_OFF, "trace_count": ["5"]}, TRACE_OFF],
    ),
    Case(
        "turn tracing on in a server started without it",
        lambda t: t.trace_settings(trace_level=["TIMESTAMPS"]),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case(
        "update a trace setting that does not exist",
        lambda t: t.trace_settings(nope="1"),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case("log settings", lambda t: t.log_settings(), LOG_SETTINGS),
    Case(
        "update log settings", lambda t: t.log_settings(log_verbose_level=0, log_format="text"), LOG_SETTINGS
    ),
    Case(
        "update log settings with a log file",
        lambda t: t.log_settings(log_file="/tmp/x"),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
    Case(
        "infer naming a sequence on a stateless model",
        lambda t: t.infer("failing", {"x": rows(3)}, sequence_id=7, sequence_start=True),
        None,
        400,
        "INVALID_ARGUMENT",
    ),
]


def outcome(transport: Transport, case: Case) -> tuple[object, str | None, str | None]:
    """(answer, status, message) of one case over one transport."""
    try:
        return case.call(transport), None, None
    except InferenceServerException as error:
        return None, error.status(), error.message()


def expected_status(case: Case, transport: str) -> str | None:
    if transport == "http":
        return None if case.http_status is None else str(case.http_status)
    return None if case.grpc_code is None else f"StatusCode.{case.grpc_code}"


# aiohttp warns (client side) that a body over 1 MiB given as bytes may hold its loop.
@pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning")
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_every_client_flavour_agrees(clients: dict[str, Any], case: Case) -> None:
    results = {flavour: outcome(Transport(flavour, clients[flavour]), case) for flavour in FLAVOURS}
    for flavour, (answer, status, message) in results.items():
        assert status == expected_status(case, flavour.partition("-")[0]), (flavour, message)
        assert answer == case.expected, flavour
    if case.http_status is not None and case.same_message:
        assert {results[flavour][2] for flavour in FLAVOURS} == {results["grpc"][2]}
    # Every failure leaves the server serving for every client.
    for flavour in FLAVOURS:
        answer = Transport(flavour, clients[flavour]).infer("failing", {"x": rows(3)})
        assert answer["y"][0] == [0.0, 1.0, 2.0], flavour


def test_a_model_that_failed_to_load_is_named_without_its_files_or_runtime_errors(
    clients: dict[str, Any],
) -> None:
    case = Case("broken", lambda t: t.infer("broken", {"x": rows(3)}))
    for flavour in FLAVOURS:
        _, _, message = outcome(Transport(flavour, clients[flavour]), case)
        assert message == "model 'broken' is failed (the server log says why)", flavour


def test_http_exchanges_fit_the_openapi_document(error_repository_server: ServerProcess) -> None:
    """Every case over HTTP through a recording proxy: each request and answer fits /openapi.json."""
    with urllib.request.urlopen(f"{error_repository_server.http_url}/openapi.json", timeout=10) as reply:
        spec = OpenApiSpec(json.load(reply))
    proxy = TeeProxy((error_repository_server.host, error_repository_server.http_port))
    client = httpclient.InferenceServerClient(f"127.0.0.1:{proxy.port}")
    try:
        transport = Transport("http", client)
        for case in CASES:
            outcome(transport, case)
    finally:
        client.close()
        proxy.close()
    exchanges = proxy.exchanges()
    assert len(exchanges) > len(CASES)
    for exchange in exchanges:
        spec.check(exchange)
