"""The LLM's KV pool on a real CUDA device: run by benchmarks/gpu/check.sh where one is lent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from ortserve.core.binding import DeviceSpec
from ortserve.core.cuda_ipc import CudaUnavailable, cuda_runtime
from ortserve.llm.device_kv import DeviceKvPool, DevicePooledBackend, memory_for
from ortserve.llm.kv_pool import KvPool


def _cuda_usable() -> bool:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False
    try:
        cuda_runtime()
    except CudaUnavailable:
        return False
    return True


pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not _cuda_usable(),
        reason="needs onnxruntime-gpu (CUDAExecutionProvider) and a usable CUDA runtime and device",
    ),
]
_CUDA = DeviceSpec("cuda", 0)


def _ortvalue(shape: tuple[int, ...], spec: DeviceSpec) -> ort.OrtValue:
    return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), np.float32, spec.kind, spec.index)


def test_pool_operations_on_the_device_move_the_same_bytes_as_the_host_pool() -> None:
    rng = np.random.default_rng(3)
    host = KvPool(4, 2, 8, 200, 1 << 24)
    device = DeviceKvPool(4, 2, 8, 200, 1 << 24, _CUDA, memory_for(_CUDA), _ortvalue)
    owners: list[int] = []
    for step in range(120):
        if owners and (len(owners) > 12 or rng.random() < 0.4):
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


def test_a_cuda_session_gets_the_device_pool_and_the_cpus_first_tokens(tmp_path: Path) -> None:
    from ortserve.llm.demo import train_tokenizer, write_llm_version
    from ortserve.llm.engine import DecoderSession, EngineLimits, GenerationEngine
    from ortserve.llm.layout import check_graph, read_llm_files
    from ortserve.llm.prefix_cache import PrefixCache
    from ortserve.llm.sampler import SamplingParams
    from ortserve.llm.sequence import Sequence
    from ortserve.llm.tokenizer import TextTokenizer
    from ortserve.llm.weights import DecoderShape, random_weights

    tokenizer = train_tokenizer(["the quick brown fox jumps over the lazy dog " * 4], 96)
    shape = DecoderShape(tokenizer.get_vocab_size(), 64, 2, 4, 2, 96, 10000.0, 1e-5, 256)
    write_llm_version(tmp_path, random_weights(shape, seed=3), tokenizer, layout="genai")
    files = read_llm_files(tmp_path)
    text = TextTokenizer(tmp_path, files.tokenizer_config)
    prompts = [[int(t) for t in np.random.default_rng(i).integers(3, files.vocab_size, 20)] for i in range(4)]

    def outputs(providers: list[str]) -> tuple[list[list[int]], str]:
        session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=providers)

        def signature(items: list[ort.NodeArg]) -> dict[str, tuple[str, list[object]]]:
            return {a.name: (a.type, list(a.shape)) for a in items}

        layout = check_graph(files, signature(session.get_inputs()), signature(session.get_outputs()))
        limits = EngineLimits(max_num_seqs=8, max_context_len=256, max_itl_ms=60_000.0, kv_pool_bytes=1 << 24)
        engine = GenerationEngine(
            DecoderSession(session, layout), limits, PrefixCache(0, 1.0, lambda: 0.0, 4), lambda _: None
        )
        engine.tune(0.001, 0.0001)
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        sequences = [Sequence(p, params, text, (), 256) for p in prompts]
        for sequence in sequences:
            engine.submit(sequence)
        while any(s.finish_reason is None for s in sequences):
            engine.step()
        return [list(s.output) for s in sequences], type(engine.backend).__name__

    want, _ = outputs(["CPUExecutionProvider"])
    got, backend = outputs(["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert backend == DevicePooledBackend.__name__
    assert [g[:4] for g in got] == [w[:4] for w in want]
