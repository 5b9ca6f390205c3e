"""The device data path on a real CUDA device: run by benchmarks/gpu/check.sh where one is lent."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from binding_models import every_type_feeds, every_type_model
from model_builders import serialized
from ortserve.core.binding import BindingRun, DeviceSpec, binding_device, staging_memory
from ortserve.core.runner import OrtRunner

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        "CUDAExecutionProvider" not in ort.get_available_providers(),
        reason="this ONNX Runtime has no CUDAExecutionProvider (install onnxruntime-gpu on a GPU machine)",
    ),
]


def test_a_cuda_session_binds_on_its_device_and_answers_as_the_cpu() -> None:
    model = serialized(every_type_model())
    cuda = ort.InferenceSession(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert binding_device(cuda) == DeviceSpec("cuda", 0)
    runner = OrtRunner(cuda, 2, "cuda")
    try:
        for rows in (1, 7, 32, 7):
            feeds = every_type_feeds(rows, rows)
            got, _ = runner.run_blocking(feeds)
            want = cpu.run(None, feeds)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-3, atol=1e-3)
    finally:
        runner.close()


def test_inputs_are_staged_in_pinned_memory_and_answer_as_the_cpu() -> None:
    model = serialized(every_type_model())
    cuda = ort.InferenceSession(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    staging, why = staging_memory(DeviceSpec("cuda", 0))
    if staging is None:
        pytest.skip(f"no pinned staging on this ONNX Runtime: {why}")
    names = [arg.name for arg in cuda.get_outputs()]
    bound = BindingRun(cuda, names, DeviceSpec("cuda", 0))
    assert bound.staging == staging
    for rows in (1, 7, 32, 7, 1):
        feeds = every_type_feeds(rows, rows)
        for g, w in zip(bound(feeds), cpu.run(names, feeds)):
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-3, atol=1e-3)
