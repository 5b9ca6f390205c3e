"""The GPU check's end-to-end sections: the LLM on the device, the fallback drill, CUDA shared memory.

    python benchmarks/gpu/check_device.py llm       # tokens/s: host pool on CPU, device pool on
                                                    # cpu OrtValues, device pool on CUDA
    python benchmarks/gpu/check_device.py drill     # a fault at L0 -> L2 answers, marked degraded
    python benchmarks/gpu/check_device.py cudashm   # a client's cudaMalloc'd region registered by
                                                    # IPC handle, input read and output written there;
                                                    # then a lone request run straight on its windows
                                                    # (no host copy but the decoder's) against the
                                                    # copy path, copies counted, latency A/B/A'

Each prints Markdown rows and exits 0 (measured and right), 1 (a wrong answer) or 2 (the GPU
part was not measured here: no CUDA provider or no CUDA runtime; the CPU part still ran).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import ctypes.util
import json
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

WRONG, NOT_MEASURED = 1, 2
CUDA = "CUDAExecutionProvider"


def _has_cuda() -> bool:
    return CUDA in ort.get_available_providers()


# -- LLM -------------------------------------------------------------------------------
def _llm(args: argparse.Namespace) -> int:
    from ortserve.core.binding import DeviceSpec
    from ortserve.core.cuda_ipc import HostMemory
    from ortserve.llm.demo import train_tokenizer, write_llm_version
    from ortserve.llm.device_kv import DevicePooledBackend
    from ortserve.llm.engine import DecoderSession, EngineLimits, GenerationEngine
    from ortserve.llm.kv_backend import KvBackend
    from ortserve.llm.layout import check_graph, read_llm_files
    from ortserve.llm.prefix_cache import PrefixCache
    from ortserve.llm.sampler import SamplingParams
    from ortserve.llm.sequence import Sequence
    from ortserve.llm.tokenizer import TextTokenizer
    from ortserve.llm.weights import DecoderShape, random_weights

    context = 512
    folder = Path(tempfile.mkdtemp(prefix="check-llm-"))
    tokenizer = train_tokenizer(["the quick brown fox jumps over the lazy dog " * 8], 256)
    hidden, layers = (64, 2) if args.small else (512, 8)
    shape = DecoderShape(tokenizer.get_vocab_size(), hidden, layers, 8, 2, 4 * hidden, 10000.0, 1e-5, context)
    write_llm_version(folder, random_weights(shape, seed=3), tokenizer, layout="genai")
    files = read_llm_files(folder)
    text = TextTokenizer(folder, files.tokenizer_config)
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(3, files.vocab_size, 32)] for _ in range(args.sequences)]

    def generate(providers: list[str], device: str | None) -> tuple[list[list[int]], float, str]:
        session = ort.InferenceSession(str(folder / "model.onnx"), providers=providers)

        def signature(items: list[ort.NodeArg]) -> dict[str, tuple[str, list[object]]]:
            return {a.name: (a.type, list(a.shape)) for a in items}

        layout = check_graph(files, signature(session.get_inputs()), signature(session.get_outputs()))
        decoder = DecoderSession(session, layout)
        limits = EngineLimits(max_num_seqs=args.sequences, max_context_len=context, max_itl_ms=60_000.0)
        backend: KvBackend | None = None
        if device == "cpu-ortvalue":
            backend = DevicePooledBackend(
                decoder, context, limits.kv_pool_bytes, DeviceSpec("cpu"), HostMemory()
            )
        engine = GenerationEngine(
            decoder, limits, PrefixCache(0, 1.0, time.monotonic, 16), lambda _: None, backend=backend
        )
        engine.tune(0.001, 0.0001)
        sequences = []
        params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
        for prompt in prompts:
            sequences.append(Sequence(prompt, params, text, (), context))
        warm = Sequence(
            prompts[0], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True), text, (), context
        )
        engine.submit(warm)
        while warm.finish_reason is None:
            engine.step()
        started = time.perf_counter()
        for sequence in sequences:
            engine.submit(sequence)
        while any(s.finish_reason is None for s in sequences):
            engine.step()
        elapsed = time.perf_counter() - started
        return [list(s.output) for s in sequences], elapsed, type(engine.backend).__name__

    print(
        f"| LLM ({layers} layers, hidden {hidden}, {args.sequences} x {args.tokens} tokens) | backend | tokens/s | same greedy tokens as CPU |"
    )
    print("|---|---|---|---|")
    want, seconds, name = generate(["CPUExecutionProvider"], None)
    total = sum(len(o) for o in want)
    print(f"| cpu, host pool | {name} | {total / seconds:.0f} | reference |")
    got, seconds, name = generate(["CPUExecutionProvider"], "cpu-ortvalue")
    same = got == want
    print(
        f"| cpu, device pool on cpu OrtValues | {name} | {total / seconds:.0f} | {'yes' if same else 'NO'} |"
    )
    status = 0 if same else WRONG
    if not _has_cuda():
        print("| cuda, device pool | - | NOT MEASURED (no CUDAExecutionProvider) | - |")
        return max(status, NOT_MEASURED) if status == 0 else status
    got, seconds, name = generate([CUDA, "CPUExecutionProvider"], None)
    # Float32 on the GPU sums in another order: a near tie may pick another token late in a
    # sequence; the first 8 tokens of every sequence must agree.
    agree = all(g[:8] == w[:8] for g, w in zip(got, want, strict=True))
    exact = sum(g == w for g, w in zip(got, want, strict=True))
    print(
        f"| cuda, device pool | {name} | {total / seconds:.0f} | first 8 tokens {'yes' if agree else 'NO'}, "
        f"{exact}/{len(want)} whole sequences |"
    )
    return status if agree and name == "DevicePooledBackend" else WRONG


# -- the fallback drill --------------------------------------------------------------------
def _doubling_model() -> onnx.ModelProto:
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        "doubling",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@contextlib.contextmanager
def _server(configs: dict[str, str], extra: list[str]) -> Iterator[Any]:
    from ortserve.testing import run_server

    root = Path(tempfile.mkdtemp(prefix="check-models-"))
    for name, config in configs.items():
        (root / name / "1").mkdir(parents=True)
        onnx.save(_doubling_model(), str(root / name / "1" / "model.onnx"))
        (root / name / "config.yaml").write_text(config, encoding="utf-8")
    with run_server(root, root / "server.log", ["--intra-op-threads", "1", *extra]) as server:
        yield server


def _post(server: Any, path: str, document: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"{server.http_url}{path}", json.dumps(document).encode())
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _drill(args: argparse.Namespace) -> int:
    gpu = _has_cuda()
    providers = f"providers: [{CUDA}]\n" if gpu else ""
    config = (
        providers
        + "faults:\n  L0: {error_rate: 1.0}\nfallback:\n  session: cpu\n  breaker: {consecutive_failures: 1}\n"
    )
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    body = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": x.reshape(-1).tolist()}]}
    print("| fallback drill | L0 | answers | degraded, level 2 | right values | GPU gauges (NVML) |")
    print("|---|---|---|---|---|---|")
    with _server({"drill": config}, ["--enable-fault-injection", "--no-strict-readiness"]) as server:
        answers = [_post(server, "/v2/models/drill/versions/1/infer", body) for _ in range(5)]
        with urllib.request.urlopen(
            f"http://{server.host}:{server.metrics_port}/metrics", timeout=10
        ) as reply:
            metrics = reply.read().decode()
    ok = all(status == 200 for status, _ in answers)
    marked = ok and all(
        a["parameters"].get("degraded") is True and a["parameters"].get("fallback_level") == 2
        for _, a in answers
    )
    right = ok and all(
        np.allclose(np.array(a["outputs"][0]["data"]).reshape(2, 4), 2 * x) for _, a in answers
    )
    nvml = (
        "yes"
        if "ortserve_gpu_memory_total_bytes" in metrics
        else "absent (nvidia-ml-py not installed or no driver)"
    )
    where = "CUDA" if gpu else "CPU (stand-in: no CUDA provider)"
    print(
        f"| injected persistent fault | {where} | {sum(s == 200 for s, _ in answers)}/5 | {'yes' if marked else 'NO'} | {'yes' if right else 'NO'} | {nvml} |"
    )
    if not (marked and right):
        return WRONG
    return 0 if gpu else NOT_MEASURED


# -- CUDA shared memory --------------------------------------------------------------------
class _ClientCuda:
    """The client's side of CUDA IPC (what tritonclient.utils.cuda_shared_memory does with
    cuda-python), through ctypes so that the check needs no other package."""

    def __init__(self) -> None:
        from ortserve.core.cuda_ipc import cuda_runtime

        cuda_runtime()  # raises CudaUnavailable with the reason
        self.lib = ctypes.CDLL(ctypes.util.find_library("cudart") or "libcudart.so.12")

    def _check(self, code: int, call: str) -> None:
        if code:
            raise RuntimeError(f"{call} failed with {code}")

    def malloc(self, size: int) -> int:
        pointer = ctypes.c_void_p()
        self._check(self.lib.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(size)), "cudaMalloc")
        return int(pointer.value or 0)

    def handle(self, pointer: int) -> bytes:
        buffer = (ctypes.c_char * 64)()
        self._check(self.lib.cudaIpcGetMemHandle(buffer, ctypes.c_void_p(pointer)), "cudaIpcGetMemHandle")
        return bytes(buffer)

    def copy(self, destination: int, source: int, size: int, kind: int) -> None:
        self._check(
            self.lib.cudaMemcpy(
                ctypes.c_void_p(destination), ctypes.c_void_p(source), ctypes.c_size_t(size), kind
            ),
            "cudaMemcpy",
        )

    def free(self, pointer: int) -> None:
        self.lib.cudaFree(ctypes.c_void_p(pointer))


def _cudashm(args: argparse.Namespace) -> int:
    served = _cudashm_served(args)
    direct = _cudashm_direct(args)
    return max(served, direct) if WRONG not in (served, direct) else WRONG


def _cudashm_served(args: argparse.Namespace) -> int:
    from ortserve.core.cuda_ipc import CudaUnavailable

    print("| CUDA shared memory | register (HTTP, b64 handle) | infer in/out in the region | unregister |")
    print("|---|---|---|---|")
    try:
        client = _ClientCuda()
    except (CudaUnavailable, OSError) as exc:
        with _server({"plain": ""}, ["--cuda-shared-memory-regions", "4"]) as server:
            status, answer = _post(server, "/v2/cudasharedmemory/region/r/register", {})
        said = (
            "501 with the reason"
            if status == 501 and "CUDA" in answer.get("error", "")
            else f"{status} {answer}"
        )
        print(f"| NOT MEASURED ({exc}) | {said} | - | - |")
        return NOT_MEASURED if status == 501 else WRONG
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    size = x.nbytes
    pointer = client.malloc(2 * size)
    try:
        client.copy(pointer, x.ctypes.data, size, 1)
        handle = base64.b64encode(client.handle(pointer)).decode()
        config = f"providers: [{CUDA}]\n" if _has_cuda() else ""
        with _server({"doubling": config}, ["--cuda-shared-memory-regions", "4"]) as server:
            try:
                import tritonclient.http as triton
            except ImportError:
                triton = None
            if triton is not None:  # Triton's own client: its register body and infer parameters
                return _cudashm_tritonclient(triton, server, client, pointer, handle, x)
            status, _ = _post(
                server,
                "/v2/cudasharedmemory/region/r/register",
                {"raw_handle": {"b64": handle}, "device_id": 0, "byte_size": 2 * size},
            )
            region = {"shared_memory_region": "r", "shared_memory_byte_size": size}
            request = {
                "inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": region}],
                "outputs": [{"name": "y", "parameters": {**region, "shared_memory_offset": size}}],
            }
            answered, answer = _post(server, "/v2/models/doubling/infer", request)
            out = np.empty_like(x)
            client.copy(out.ctypes.data, pointer + size, size, 2)
            gone, _ = _post(server, "/v2/cudasharedmemory/region/r/unregister", {})
            right = answered == 200 and np.array_equal(out, 2 * x) and "data" not in answer["outputs"][0]
            print(f"| device 0 | {status} | {answered}, {'right' if right else 'WRONG'} | {gone} |")
            return 0 if status == 200 and right and gone == 200 else WRONG
    finally:
        client.free(pointer)


def _cudashm_tritonclient(
    triton: Any, server: Any, client: _ClientCuda, pointer: int, handle: str, x: Any
) -> int:
    size = x.nbytes
    http = triton.InferenceServerClient(server.http_address)
    http.register_cuda_shared_memory("r", handle.encode(), 0, 2 * size)
    status = http.get_cuda_shared_memory_status()
    given = triton.InferInput("x", [2, 4], "FP32")
    given.set_shared_memory("r", size)
    wanted = triton.InferRequestedOutput("y", binary_data=True)
    wanted.set_shared_memory("r", size, offset=size)
    result = http.infer("doubling", [given], outputs=[wanted])
    out = np.empty_like(x)
    client.copy(out.ctypes.data, pointer + size, size, 2)
    http.unregister_cuda_shared_memory("r")
    right = np.array_equal(out, 2 * x) and "data" not in result.get_output("y")
    listed = [r["name"] for r in status] == ["r"]
    print(
        f"| device 0, tritonclient.http | 200, listed {'yes' if listed else 'NO'} | 200, {'right' if right else 'WRONG'} | 200 |"
    )
    return 0 if right and listed else WRONG


class _Counted:
    """The server's CUDA runtime with its host copies counted. An IPC handle made by this process
    opens to its own pointer: CUDA refuses to open a handle in the process that exported it, and
    this check runs the server in process to count what its data path asks of CUDA."""

    def __init__(self, runtime: Any, own: dict[bytes, int]) -> None:
        self._runtime = runtime
        self._own = own
        self.copies = {"copy_to_host": 0, "copy_from_host": 0}

    def device_count(self) -> int:
        return int(self._runtime.device_count()) if hasattr(self._runtime, "device_count") else 1

    def set_device(self, device: int) -> None:
        if hasattr(self._runtime, "set_device"):
            self._runtime.set_device(device)

    def open_ipc_handle(self, handle: bytes) -> int:
        return self._own[handle]

    def close_ipc_handle(self, pointer: int) -> None:
        pass

    def allocation_size(self, pointer: int) -> int | None:
        return None

    def copy_to_host(self, destination: int, source: int, size: int) -> None:
        self.copies["copy_to_host"] += 1
        self._runtime.copy_to_host(destination, source, size)

    def copy_from_host(self, destination: int, source: int, size: int) -> None:
        self.copies["copy_from_host"] += 1
        self._runtime.copy_from_host(destination, source, size)


def _cudashm_direct(args: argparse.Namespace) -> int:
    """A lone request whose input and output are CUDA windows, on a CUDA session (the binding
    path): run straight on the windows (inputs and output bound by device pointer: one host copy,
    the decoder's) against the copy path (forced: the windows not bound), in process, A/B/A'.
    Without CUDA the same runs on the CPU (host memory standing for the device): NOT MEASURED."""
    import asyncio
    from unittest import mock

    from ortserve.core import binding as binding_module
    from ortserve.core.cuda_ipc import CudaUnavailable, HostMemory

    gpu = _has_cuda()
    try:
        client: _ClientCuda | None = _ClientCuda() if gpu else None
    except (CudaUnavailable, OSError):
        client, gpu = None, False
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    size = x.nbytes
    host = np.zeros(2 * size, dtype=np.uint8)
    pointer = client.malloc(2 * size) if client is not None else int(host.ctypes.data)
    runtime = _Counted(client_runtime() if client is not None else HostMemory(), {b"h" * 64: pointer})

    def put(data: Any) -> None:
        if client is not None:
            client.copy(pointer, data.ctypes.data, size, 1)
        else:
            host[:size] = np.frombuffer(data.tobytes(), dtype=np.uint8)

    def output() -> Any:
        out = np.empty_like(x)
        if client is not None:
            client.copy(out.ctypes.data, pointer + size, size, 2)
        else:
            out[...] = host[size:].view(np.float32).reshape(2, 4)
        return out

    lone = {"direct": 0}
    on_windows = binding_module.BindingRun._run_on_windows

    def counted(self: Any, feeds: Any, windows: Any) -> Any:
        lone["direct"] += 1
        return on_windows(self, feeds, windows)

    arms: dict[str, list[float]] = {"direct": [], "copy": [], "direct'": []}
    copies: dict[str, dict[str, int]] = {
        arm: {key: 0 for key in runtime.copies} for arm in ("direct", "copy")
    }
    requests = 200 if gpu else 50

    async def measure() -> bool:
        right = True
        app, close = await _in_process_app(runtime, gpu)
        try:
            for arm in ("direct", "copy", "direct'"):  # A/B/A'
                with contextlib.ExitStack() as forced:
                    if arm == "copy":
                        forced.enter_context(
                            mock.patch.object(binding_module.BindingRun, "_windows", lambda self, feeds: None)
                        )
                    before = dict(runtime.copies)
                    for index in range(requests):
                        given = x + index
                        put(given)
                        started = time.perf_counter()
                        status = await _in_process_infer(app, size)
                        arms[arm].append(time.perf_counter() - started)
                        if index % 25 == 0 or index == requests - 1:
                            right = right and status == 200 and np.array_equal(output(), 2 * given)
                    for key, count in runtime.copies.items():
                        copies[arm.rstrip("'")][key] += count - before[key]
        finally:
            await close()
        return right

    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch.object(binding_module.BindingRun, "_run_on_windows", counted))
            if not gpu:  # the CPU session on the binding path, as a CUDA session is
                stack.enter_context(
                    mock.patch(
                        "ortserve.core.runner.binding_device", lambda s: binding_module.DeviceSpec("cpu")
                    )
                )
            right = asyncio.run(measure())
    finally:
        if client is not None:
            client.free(pointer)
    runs = {"direct": 2 * requests, "copy": requests}
    per = {
        arm: f"{copies[arm]['copy_to_host'] / runs[arm]:g} D2H + {copies[arm]['copy_from_host'] / runs[arm]:g} H2D"
        for arm in runs
    }
    took = lone["direct"] == 2 * requests
    bare = copies["direct"]["copy_from_host"] == 0 and copies["copy"]["copy_from_host"] == requests
    where = "CUDA device 0" if gpu else "CPU stand-in, NOT MEASURED"
    print()
    print(
        "| lone request on CUDA windows | runs on the windows | host copies per request (direct / copy path) | median latency direct / copy / direct' (us) | right |"
    )
    print("|---|---|---|---|---|")
    medians = " / ".join(f"{np.median(arms[arm]) * 1e6:.0f}" for arm in arms)
    print(
        f"| {where} | {lone['direct']}/{2 * requests} | {per['direct']} / {per['copy']} | {medians} | "
        f"{'yes' if right else 'WRONG'} |"
    )
    if not (took and bare and right):
        return WRONG
    return 0 if gpu else NOT_MEASURED


def client_runtime() -> Any:
    from ortserve.core.cuda_ipc import cuda_runtime

    return cuda_runtime()


async def _in_process_app(runtime: Any, gpu: bool) -> tuple[Any, Any]:
    from ortserve.core.cuda_shared_memory import SharedMemoryRegions
    from ortserve.core.dataplane import DataPlane
    from ortserve.core.types import ServerMetadata
    from ortserve.protocol.tensors import TensorLimits
    from ortserve.repository.manager import LifecycleManager
    from ortserve.repository.registry import ModelRegistry
    from ortserve.server.http.app import HttpApp
    from ortserve.server.http.shared_memory_routes import add_shared_memory_routes
    from ortserve.settings import ServerSettings

    root = Path(tempfile.mkdtemp(prefix="check-cudashm-"))
    (root / "doubling" / "1").mkdir(parents=True)
    onnx.save(_doubling_model(), str(root / "doubling" / "1" / "model.onnx"))
    (root / "doubling" / "config.yaml").write_text(f"providers: [{CUDA}]\n" if gpu else "", encoding="utf-8")
    registry = ModelRegistry()
    await LifecycleManager(registry, ServerSettings(model_repository=root, intra_op_threads=1)).start()
    regions = SharedMemoryRegions(0, 4, runtime=lambda: runtime, memory_kind="cuda" if gpu else "cpu")
    app = HttpApp(
        DataPlane(registry, ServerMetadata("ortserve", "check", ()), regions),
        TensorLimits(1 << 20, 8, 1 << 20),
    )
    add_shared_memory_routes(app, regions)
    regions.cuda.register("r", b"h" * 64, 0, 64)

    async def close() -> None:
        regions.close()
        await registry.unload_all(5.0)

    return app, close


async def _in_process_infer(app: Any, size: int) -> int:
    from ortserve.server.http.messages import HttpRequest, HttpResponse, resolve_response

    region = {"shared_memory_region": "r", "shared_memory_byte_size": size}
    document = {
        "inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "parameters": region}],
        "outputs": [{"name": "y", "parameters": {**region, "shared_memory_offset": size}}],
    }
    response = await resolve_response(
        app(HttpRequest("POST", "/v2/models/doubling/infer", "", {}, json.dumps(document).encode()))
    )
    assert isinstance(response, HttpResponse)
    return int(response.status)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("section", choices=["llm", "drill", "cudashm"])
    parser.add_argument("--small", action="store_true", help="a tiny LLM (the CPU dry run)")
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    print(f"onnxruntime {ort.__version__}; providers: {', '.join(ort.get_available_providers())}")
    return {"llm": _llm, "drill": _drill, "cudashm": _cudashm}[args.section](args)


if __name__ == "__main__":
    sys.exit(main())
