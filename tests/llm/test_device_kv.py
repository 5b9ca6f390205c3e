"""The device KV backend run on ``cpu`` OrtValues: the same greedy tokens as the host pool, with
companions, chunked prefill, preemption, prefix reuse and the fixed-shape (CUDA graph) mode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from ortserve.core.binding import DeviceSpec
from ortserve.core.cuda_ipc import HostMemory
from ortserve.llm.demo import train_tokenizer, write_llm_version
from ortserve.llm.device_kv import DeviceKvPool, DevicePooledBackend, cuda_graph_enabled
from ortserve.llm.engine import DecoderSession, EngineLimits, GenerationEngine
from ortserve.llm.kv_backend import KvBackend, PooledBackend
from ortserve.llm.kv_pool import KvPool
from ortserve.llm.layout import check_graph, read_llm_files
from ortserve.llm.prefix_cache import PrefixCache
from ortserve.llm.sampler import SamplingParams
from ortserve.llm.sequence import GenerationEvent, Sequence
from ortserve.llm.tokenizer import TextTokenizer
from ortserve.llm.weights import DecoderShape, random_weights

_CONTEXT = 256
_CPU = DeviceSpec("cpu")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("genai")
    tokenizer = train_tokenizer(["the quick brown fox jumps over the lazy dog " * 4], 96)
    shape = DecoderShape(tokenizer.get_vocab_size(), 64, 2, 4, 2, 96, 10000.0, 1e-5, _CONTEXT)
    write_llm_version(folder, random_weights(shape, seed=3), tokenizer, layout="genai")
    return folder


class _Harness:
    def __init__(self, folder: Path, pool_bytes: int, device: str | None, chunk: int = 4096, cache: int = 0):
        files = read_llm_files(folder)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(
            str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )

        def signature(args: list[ort.NodeArg]) -> dict[str, tuple[str, list[object]]]:
            return {a.name: (a.type, list(a.shape)) for a in args}

        layout = check_graph(files, signature(session.get_inputs()), signature(session.get_outputs()))
        assert layout.shared_buffer
        decoder = DecoderSession(session, layout)
        self.tokenizer = TextTokenizer(folder, files.tokenizer_config)
        self.vocab = files.vocab_size
        backend: KvBackend | None = None
        if device is not None:
            backend = DevicePooledBackend(
                decoder, _CONTEXT, pool_bytes, _CPU, HostMemory(), cuda_graph=device == "graph"
            )
        limits = EngineLimits(
            max_num_seqs=16, max_waiting=64, max_context_len=_CONTEXT, prefill_chunk_tokens=chunk,
            max_itl_ms=60_000.0, kv_pool_bytes=pool_bytes,
        )  # fmt: skip
        self.events: list[tuple[Sequence, GenerationEvent]] = []
        prefixes = PrefixCache(cache, 600.0, lambda: 0.0, 4)
        self.engine = GenerationEngine(decoder, limits, prefixes, self.events.extend, backend=backend)
        self.engine.tune(0.001, 0.0001)

    def sequence(self, prompt: list[int], max_tokens: int) -> Sequence:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        return Sequence(prompt, params, self.tokenizer, (), _CONTEXT)

    def run(self, arrivals: list[tuple[int, Sequence]]) -> None:
        pending = sorted(arrivals, key=lambda pair: pair[0])
        for step in range(10_000):
            while pending and pending[0][0] <= step:
                self.engine.submit(pending.pop(0)[1])
            if not pending and all(s.finish_reason is not None for _, s in arrivals):
                return
            self.engine.step()
        raise AssertionError("the engine did not finish")


def _outputs(harness: _Harness, prompts: list[list[int]], steps: list[int], tokens: int) -> list[list[int]]:
    arrivals = [(step, harness.sequence(p, tokens)) for p, step in zip(prompts, steps, strict=True)]
    harness.run(arrivals)
    return [list(s.output) for _, s in arrivals]


def _prompts(vocab: int, count: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, vocab, int(n))] for n in rng.integers(5, 60, count)]


@pytest.mark.parametrize("device", ["ortvalue", "graph"])
def test_the_device_pool_gives_the_host_pools_greedy_tokens(model: Path, device: str) -> None:
    host = _Harness(model, 1 << 24, None, chunk=8)
    assert isinstance(host.engine.backend, PooledBackend)
    bound = _Harness(model, 1 << 24, device, chunk=8)
    assert isinstance(bound.engine.backend, DevicePooledBackend)
    prompts = _prompts(host.vocab, 6, 1)
    steps = [0, 0, 2, 5, 5, 9]
    assert _outputs(bound, prompts, steps, 20) == _outputs(host, prompts, steps, 20)
    if device == "graph":  # one set of staging tensors per decode row count seen
        assert set(bound.engine.backend._graphs) <= set(range(1, 7))


def test_preemption_and_prefix_reuse_move_rows_on_the_device_as_on_the_host(model: Path) -> None:
    token_bytes = 2 * 2 * 2 * 16 * 4
    tight = 4 * 128 * token_bytes  # about three rows of 128 tokens: eight sequences take turns
    host = _Harness(model, tight, None, chunk=16, cache=1 << 24)
    bound = _Harness(model, tight, "ortvalue", chunk=16, cache=1 << 24)
    shared = _prompts(host.vocab, 1, 7)[0]
    prompts = [shared + p for p in _prompts(host.vocab, 8, 5)]
    steps = [0] * 8
    want = _outputs(host, prompts, steps, 40)
    assert _outputs(bound, prompts, steps, 40) == want
    assert bound.engine.preemptions > 0
    assert not bound.engine.backend.decoding() and bound.engine.backend.nbytes == 0
    again = _outputs(bound, prompts[:2], [0, 0], 40)  # served from the prefix cache's copies
    assert again == want[:2]


def test_pool_operations_move_the_same_bytes_as_the_host_pool() -> None:
    rng = np.random.default_rng(3)
    budget = 1 << 24
    host = KvPool(4, 2, 8, 200, budget)
    device = DeviceKvPool(4, 2, 8, 200, budget, _CPU, HostMemory(), _ortvalue)
    owners: list[int] = []
    for step in range(300):
        if owners and (len(owners) > 20 or rng.random() < 0.4):
            owner = owners.pop(int(rng.integers(len(owners))))
            host.release(owner)
            device.release(owner)
            continue
        length = int(rng.integers(1, 200))
        kv = [rng.standard_normal((2, length, 8)).astype(np.float32) for _ in range(4)]
        for pool in (host, device):
            pool.take(step, length)
            pool.write(step, kv, length)
            if rng.random() < 0.5:
                pool.activate(step)
        owners.append(step)
        for owner in owners:
            length = host.lengths[host.slot(owner)]
            for a, b in zip(host.read(owner, length), device.read(owner, length), strict=True):
                np.testing.assert_array_equal(a, b)
    source = owners[0]
    device.take("fork", 3)
    device.copy_row(device.slot(source), device.slot("fork"), 3)
    device.set_length("fork", 3)
    for a, b in zip(device.read(source, 3), device.read("fork", 3), strict=True):
        np.testing.assert_array_equal(a, b)


def _ortvalue(shape: tuple[int, ...], spec: DeviceSpec) -> ort.OrtValue:
    return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), np.float32, spec.kind, spec.index)


def test_cuda_graph_is_read_from_the_cuda_providers_options() -> None:
    class Session:
        def __init__(self, options: dict[str, dict[str, str]]) -> None:
            self.options = options

        def get_provider_options(self) -> dict[str, dict[str, str]]:
            return self.options

    assert cuda_graph_enabled(Session({"CUDAExecutionProvider": {"enable_cuda_graph": "1"}}))
    assert not cuda_graph_enabled(Session({"CUDAExecutionProvider": {"enable_cuda_graph": "0"}}))
    assert not cuda_graph_enabled(Session({"CPUExecutionProvider": {}}))


def test_the_llm_config_knob_puts_cuda_graphs_into_the_cuda_providers_options() -> None:
    from ortserve.config.llm import LlmConfig
    from ortserve.core.session import SessionPlan
    from ortserve.llm.device_kv import with_cuda_graph

    plan = SessionPlan(
        providers=(("CUDAExecutionProvider", {"device_id": "1"}), ("CPUExecutionProvider", {})),
        missing=(),
        intra_op_threads=1,
        inter_op_threads=1,
        cpu_affinity=None,
        optimization_level="all",
    )
    assert LlmConfig().enable_cuda_graph is False and with_cuda_graph(plan, False) is plan
    assert with_cuda_graph(plan, LlmConfig(enable_cuda_graph=True).enable_cuda_graph).providers == (
        ("CUDAExecutionProvider", {"enable_cuda_graph": "1", "device_id": "1"}),
        ("CPUExecutionProvider", {}),
    )
    explicit = SessionPlan(
        providers=(("CUDAExecutionProvider", {"enable_cuda_graph": "0"}),),
        missing=(),
        intra_op_threads=1,
        inter_op_threads=1,
        cpu_affinity=None,
        optimization_level="all",
    )
    assert with_cuda_graph(explicit, True).providers[0][1] == {
        "enable_cuda_graph": "0"
    }  # the model's own wins
