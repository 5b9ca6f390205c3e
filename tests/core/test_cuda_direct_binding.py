"""A request run alone straight on its CUDA shared-memory windows (core/binding.py's
``_run_on_windows``), on the CPU: which decoded arrays still name their window, when outputs are
linked, and BindingRun binding the windows (``cpu`` memory standing for the device) with answers
equal to the arena path's, or falling back to it."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from fake_cuda import FakeCuda
from model_builders import scaled_model, serialized
from ortserve.core.binding import BindingRun, DeviceSpec
from ortserve.core.cuda_shared_memory import CudaRegion, SharedMemoryRegions
from ortserve.core.cuda_windows import CudaWindow, input_window, link_outputs
from ortserve.core.runner import OrtRunner
from ortserve.core.types import InferInput
from ortserve.protocol.grpc import grpc_service_pb2 as pb
from ortserve.protocol.grpc.codec import decode_infer_request
from ortserve.protocol.tensors import TensorLimits

X = np.arange(8, dtype=np.float32).reshape(2, 4)


def _region(
    fake: FakeCuda, size: int = 96, kind: str = "cpu", device: int = 0
) -> tuple[CudaRegion, np.ndarray]:
    handle, memory = fake.export(size)
    regions = SharedMemoryRegions(0, 4, runtime=lambda: fake, memory_kind=kind)
    regions.cuda.register("r", handle, device, size)
    return regions.cuda.region("r", None), memory


def _decoded(region: CudaRegion, offset: int, array: np.ndarray) -> np.ndarray:
    """What the decoders make of a window: frombuffer of the read, reshaped."""
    return np.frombuffer(region.read(offset, array.nbytes, "input 'x'"), dtype=array.dtype).reshape(
        array.shape
    )


def test_a_decoded_window_names_its_window_and_anything_made_from_it_does_not() -> None:
    fake = FakeCuda(devices=2)
    region, memory = _region(fake)
    memory[8:40] = np.frombuffer(X.tobytes(), dtype=np.uint8)
    decoded = _decoded(region, 8, X)
    np.testing.assert_array_equal(decoded, X)
    window = input_window(decoded)
    assert window is not None and (window.region, window.offset, window.size) == (region, 8, 32)
    assert input_window(decoded[:1]) is None  # a part of the window is not the window's tensor
    assert input_window(decoded[:, :2]) is None
    assert input_window(decoded.astype(np.float64)) is None  # the validator converted it
    assert input_window(np.concatenate([decoded, decoded])) is None  # a joined batch
    assert input_window(X) is None


def test_outputs_are_linked_only_when_every_input_came_from_a_cuda_window() -> None:
    fake = FakeCuda()
    region, _ = _region(fake)
    decoded = _decoded(region, 0, X)
    target = CudaWindow(region, 32, 32, "output 'y'")
    plain = InferInput("z", "FP32", (2, 4), X.copy(), {})
    link_outputs([InferInput("x", "FP32", (2, 4), decoded, {}), plain], {"y": target})
    window = input_window(decoded)
    assert window is not None and window.outputs is None
    link_outputs([InferInput("x", "FP32", (2, 4), decoded, {})], {"y": target})
    assert window.outputs == {"y": target}


def test_a_filled_window_skips_the_answers_copy() -> None:
    fake = FakeCuda()
    region, memory = _region(fake)
    target = CudaWindow(region, 0, 8, "output 'y'")
    target.filled = True
    target[0:8] = b"\x01" * 8
    assert not memory.any() and not [call for call in fake.calls if call[0] == "copy_from_host"]


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    return ort.InferenceSession(serialized(scaled_model(3.0)), providers=["CPUExecutionProvider"])


def test_binding_run_binds_a_lone_requests_windows_and_answers_as_the_arena_path(
    session: ort.InferenceSession,
) -> None:
    fake = FakeCuda()
    region, memory = _region(fake)
    memory[:32] = np.frombuffer(X.tobytes(), dtype=np.uint8)
    decoded = _decoded(region, 0, X)
    target = CudaWindow(region, 32, 32, "output 'y'")
    link_outputs([InferInput("x", "FP32", (2, 4), decoded, {})], {"y": target})
    bound = BindingRun(session, ["y"], DeviceSpec("cpu"))
    want = bound({"x": X.copy()})[0]
    memory[:32] = np.frombuffer((X + 1).tobytes(), dtype=np.uint8)  # the run reads the window itself
    fake.calls.clear()
    (got,) = bound({"x": decoded})
    np.testing.assert_array_equal(got, 3.0 * (X + 1))
    np.testing.assert_array_equal(memory[32:64].view(np.float32).reshape(2, 4), got)
    assert target.filled and fake.calls == []  # no copy through CUDA's runtime at all
    assert bound.arena_size() == 2  # only the arena run's tensors: the windows were bound
    np.testing.assert_array_equal(want, 3.0 * X)
    assert fake.opened == {region.pointer: 1}  # the bindings released the region


def test_a_window_on_another_device_or_an_unlinked_output_keeps_the_arena(
    session: ort.InferenceSession,
) -> None:
    fake = FakeCuda(devices=2)
    region, memory = _region(fake, device=1)
    memory[:32] = np.frombuffer(X.tobytes(), dtype=np.uint8)
    bound = BindingRun(session, ["y"], DeviceSpec("cpu"))  # device 0: the window is on 1
    (got,) = bound({"x": _decoded(region, 0, X)})
    np.testing.assert_array_equal(got, 3.0 * X)
    assert bound.arena_size() == 2 and not memory[32:].any()
    other, memory = _region(FakeCuda())
    memory[:32] = np.frombuffer(X.tobytes(), dtype=np.uint8)
    fresh = BindingRun(session, ["y"], DeviceSpec("cpu"))
    (got,) = fresh({"x": _decoded(other, 0, X)})  # input bound, no output window linked
    np.testing.assert_array_equal(got, 3.0 * X)
    assert fresh.arena_size() == 1  # the output's arena tensor only


def test_a_screened_version_never_runs_on_the_windows(session: ort.InferenceSession) -> None:
    """The screen read the decoded copy; the client could change the device memory after it."""
    fake = FakeCuda()
    region, memory = _region(fake)
    memory[:32] = np.frombuffer(X.tobytes(), dtype=np.uint8)
    decoded = _decoded(region, 0, X)
    target = CudaWindow(region, 32, 32, "output 'y'")
    link_outputs([InferInput("x", "FP32", (2, 4), decoded, {})], {"y": target})
    memory[:32] = 0  # changed after the decoded copy was made (and screened)
    runner = OrtRunner(session, 1, "screened", bind_on=DeviceSpec("cpu"), screened=True)
    try:
        (got,), _ = runner.run_blocking({"x": decoded})
    finally:
        runner.close()
    np.testing.assert_array_equal(got, 3.0 * X)  # the screened values ran
    assert not target.filled and not memory[32:].any()


def test_an_output_window_over_an_input_window_is_written_after_the_run(
    session: ort.InferenceSession,
) -> None:
    """In place (the output's window is the input's): bound straight to both, ONNX Runtime could
    overwrite an input it has yet to read; the copy path's answer is what the client gets."""
    fake = FakeCuda()
    region, memory = _region(fake)
    memory[:32] = np.frombuffer(X.tobytes(), dtype=np.uint8)
    decoded = _decoded(region, 0, X)
    target = CudaWindow(region, 16, 32, "output 'y'")  # overlaps the input's second half
    link_outputs([InferInput("x", "FP32", (2, 4), decoded, {})], {"y": target})
    (got,) = BindingRun(session, ["y"], DeviceSpec("cpu"))({"x": decoded})
    np.testing.assert_array_equal(got, 3.0 * X)
    assert not target.filled  # written by the answer's copy, after the run


def test_a_grpc_input_in_a_cuda_window_decodes_to_an_array_naming_its_window() -> None:
    fake = FakeCuda()
    handle, memory = fake.export(64)
    memory[:32] = np.frombuffer(X.tobytes(), dtype=np.uint8)
    regions = SharedMemoryRegions(0, 4, runtime=lambda: fake, memory_kind="cpu")
    regions.cuda.register("io", handle, 0, 64)
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[2, 4])
    tensor.parameters["shared_memory_region"].string_param = "io"
    tensor.parameters["shared_memory_byte_size"].int64_param = 32
    request = decode_infer_request(
        pb.ModelInferRequest(model_name="m", inputs=[tensor]), TensorLimits(1 << 20, 8, 1 << 20), regions
    )
    data = request.inputs[0].data
    np.testing.assert_array_equal(data, X)
    window = input_window(data)
    assert window is not None and window.offset == 0 and window.size == 32


def test_a_binding_onnx_runtime_refuses_leaves_the_region_free_to_close() -> None:
    fake = FakeCuda()
    region, _ = _region(fake)

    class Refusing:
        def bind_input(self, *args: object) -> None:
            raise RuntimeError("refused")

    with pytest.raises(RuntimeError, match="refused"):
        region.bind_input(Refusing(), "x", 0, (2, 4), np.dtype(np.float32))
    region.close()
    assert fake.opened == {}  # closed at once: no use was left counted
