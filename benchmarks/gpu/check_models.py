"""The GPU check's measurements: a conv net and a transformer encoder on every provider.

Each (model, provider, precision, batch) row is run through ``session.run`` and through
ortserve's IOBinding path (``ortserve.core.binding``), compared with the CPU's answer within
a tolerance per precision, and timed (median of N runs): the two timing columns are IOBinding
off and on. TensorRT sessions get ortserve's own options (core/tensorrt.py: an engine cache
and one optimization profile per range between the batch sizes, so each precision builds one
engine per model); ``trt-int8`` runs with a calibration table that ortserve's tool
(quantization/tensorrt_int8.py) writes first from random inputs, which also runs on a CPU. Prints a Markdown table and writes
JSON; exits 1 on any wrong answer, 2 when a GPU provider was asked for and is absent (so a
CPU machine reports "not measured" instead of a table of CPU figures under GPU names).

    python benchmarks/gpu/check_models.py --providers cpu,cuda,trt,trt-fp16 --out gpu.json
    python benchmarks/gpu/check_models.py --providers cpu --runs 3   # the CPU dry run
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ortserve.core.binding import BindingRun, DeviceSpec, binding_device, staging_memory

_PROVIDERS: dict[str, tuple[list[tuple[str, dict[str, str]]], float]] = {
    # name -> (provider list, tolerance against the CPU answer)
    "cpu": ([("CPUExecutionProvider", {})], 1e-5),
    "cuda": ([("CUDAExecutionProvider", {}), ("CPUExecutionProvider", {})], 1e-3),
    "trt": ([("TensorrtExecutionProvider", {}), ("CUDAExecutionProvider", {})], 1e-3),
    "trt-fp16": (
        [("TensorrtExecutionProvider", {"trt_fp16_enable": "True"}), ("CUDAExecutionProvider", {})],
        5e-2,
    ),
    # INT8 from min-max ranges of random inputs: a coarse answer, checked coarsely.
    "trt-int8": ([("TensorrtExecutionProvider", {}), ("CUDAExecutionProvider", {})], 0.25),
}
_CACHE = Path(tempfile.gettempdir()) / "ortserve-check-trt"


def _options(
    provider: str, name: str, path: Path, batches: list[int], table: Path | None
) -> list[dict[str, str]]:
    """Each provider's options; TensorRT's completed as ortserve completes them."""
    chain, _ = _PROVIDERS[provider]
    options = [dict(o) for _, o in chain]
    if chain[0][0] == "TensorrtExecutionProvider":
        from ortserve.core.tensorrt import graph_inputs, tensorrt_options

        folder = _CACHE / f"{name}-{provider}"
        int8 = table if provider == "trt-int8" else None
        options[0] = tensorrt_options(
            options[0], graph_inputs(path.read_bytes()), max(batches), batches, folder, int8
        )
    return options


def _int8_table(path: Path, folder: Path) -> Path:
    """ortserve's calibration tool over 16 random inputs of the model (runs on the CPU)."""
    from ortserve.quantization.tensorrt_int8 import calibrate_tensorrt_int8

    arg = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_inputs()[0]
    rng = np.random.default_rng(7)
    shape = [1, *(int(d) for d in arg.shape[1:])]
    feeds = [{arg.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(16)]
    return calibrate_tensorrt_int8(path, feeds, folder)


@dataclass(frozen=True)
class Row:
    model: str
    provider: str
    batch: int
    run_ms: float
    bound_ms: float | None
    max_error: float
    ok: bool


def conv_model(seed: int = 0, side: int = 64) -> onnx.ModelProto:
    """Three 3x3 convolutions with ReLU over 3 x side x side images, global pooling, a dense head."""
    rng = np.random.default_rng(seed)
    inits, nodes, channels, last = [], [], [3, 32, 64, 64], "image"
    for layer in range(3):
        w = rng.standard_normal((channels[layer + 1], channels[layer], 3, 3)).astype(np.float32) * 0.1
        inits.append(numpy_helper.from_array(w, f"w{layer}"))
        nodes.append(helper.make_node("Conv", [last, f"w{layer}"], [f"c{layer}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{layer}"], [f"r{layer}"]))
        last = f"r{layer}"
    nodes.append(helper.make_node("GlobalAveragePool", [last], ["pooled"]))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["flat"]))
    inits.append(numpy_helper.from_array(rng.standard_normal((64, 10)).astype(np.float32), "head"))
    nodes.append(helper.make_node("MatMul", ["flat", "head"], ["logits"]))
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, side, side])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def encoder_model(seed: int = 0, width: int = 256, tokens: int = 64, layers: int = 2) -> onnx.ModelProto:
    """Single-head self-attention + MLP blocks with LayerNormalization (opset 17)."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def weight(name: str, shape: tuple[int, ...]) -> str:
        inits.append(
            numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)
        )
        return name

    inits.append(numpy_helper.from_array(np.ones(width, np.float32), "gamma"))
    inits.append(numpy_helper.from_array(np.zeros(width, np.float32), "beta"))
    inits.append(numpy_helper.from_array(np.array(1 / np.sqrt(width), np.float32), "scale"))
    last = "tokens"
    for i in range(layers):
        for part in "qkv":
            nodes.append(
                helper.make_node("MatMul", [last, weight(f"w{part}{i}", (width, width))], [f"{part}{i}"])
            )
        nodes.append(helper.make_node("Transpose", [f"k{i}"], [f"kt{i}"], perm=[0, 2, 1]))
        nodes.append(helper.make_node("MatMul", [f"q{i}", f"kt{i}"], [f"s{i}"]))
        nodes.append(helper.make_node("Mul", [f"s{i}", "scale"], [f"ss{i}"]))
        nodes.append(helper.make_node("Softmax", [f"ss{i}"], [f"p{i}"], axis=-1))
        nodes.append(helper.make_node("MatMul", [f"p{i}", f"v{i}"], [f"a{i}"]))
        nodes.append(helper.make_node("Add", [last, f"a{i}"], [f"h{i}"]))
        nodes.append(helper.make_node("LayerNormalization", [f"h{i}", "gamma", "beta"], [f"n{i}"], axis=-1))
        nodes.append(helper.make_node("MatMul", [f"n{i}", weight(f"up{i}", (width, 4 * width))], [f"u{i}"]))
        nodes.append(helper.make_node("Relu", [f"u{i}"], [f"ur{i}"]))
        nodes.append(
            helper.make_node("MatMul", [f"ur{i}", weight(f"down{i}", (4 * width, width))], [f"d{i}"])
        )
        nodes.append(helper.make_node("Add", [f"n{i}", f"d{i}"], [f"o{i}"]))
        last = f"o{i}"
    graph = helper.make_graph(
        nodes,
        "encoder",
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", tokens, width])],
        [helper.make_tensor_value_info(last, TensorProto.FLOAT, ["batch", tokens, width])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _median_ms(call: object, runs: int) -> float:
    assert callable(call)
    call()  # the first run builds engines and arenas
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def measure(
    name: str, model: onnx.ModelProto, providers: list[str], batches: list[int], runs: int
) -> list[Row]:
    rows: list[Row] = []
    available = ort.get_available_providers()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{name}.onnx"
        onnx.save(model, path)
        table = None
        if "trt-int8" in providers:
            table = _int8_table(path, Path(folder) / "int8")
            ranges = (table.parent / "calibration.cache").read_text().count("\n")
            print(f"{name}: INT8 calibration table written ({ranges} tensor ranges)", file=sys.stderr)
        sessions: dict[str, ort.InferenceSession] = {}
        for provider in providers:
            chain, _ = _PROVIDERS[provider]
            if chain[0][0] not in available:
                continue
            options = ort.SessionOptions()
            sessions[provider] = ort.InferenceSession(
                str(path),
                options,
                providers=[p for p, _ in chain],
                provider_options=_options(provider, name, path, batches, table),
            )
        reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feed_arg = reference.get_inputs()[0]
        output = reference.get_outputs()[0].name
        for batch in batches:
            shape = [batch, *(int(d) for d in feed_arg.shape[1:])]
            x = np.random.default_rng(batch).standard_normal(shape).astype(np.float32)
            want = reference.run([output], {feed_arg.name: x})[0]
            for provider, session in sessions.items():
                got = session.run([output], {feed_arg.name: x})[0]
                scale = float(np.max(np.abs(want))) or 1.0
                error = float(np.max(np.abs(got - want))) / scale
                device = binding_device(session) or DeviceSpec("cpu")
                bound = BindingRun(session, [output], device)
                bound_answer = bound({feed_arg.name: x})[0]
                bound_error = float(np.max(np.abs(bound_answer - want))) / scale
                tolerance = _PROVIDERS[provider][1]
                feeds: dict[str, np.ndarray] = {feed_arg.name: x}
                rows.append(
                    Row(
                        name,
                        provider,
                        batch,
                        _median_ms(partial(session.run, [output], feeds), runs),
                        _median_ms(partial(bound, feeds), runs),
                        max(error, bound_error),
                        max(error, bound_error) <= tolerance,
                    )
                )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--providers", default="cpu,cuda,trt,trt-fp16,trt-int8")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="tiny models (the CPU dry run in tests)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    unknown = [p for p in providers if p not in _PROVIDERS]
    if unknown:
        parser.error(f"unknown providers {unknown}; choose from {sorted(_PROVIDERS)}")
    available = ort.get_available_providers()
    absent = [p for p in providers if _PROVIDERS[p][0][0][0] not in available]
    batches = [int(b) for b in args.batches.split(",")]
    encoder = encoder_model(width=32, tokens=8, layers=1) if args.small else encoder_model()
    rows = measure("conv", conv_model(side=8 if args.small else 64), providers, batches, args.runs)
    rows += measure("encoder", encoder, providers, batches, args.runs)
    print(f"onnxruntime {ort.__version__}; available providers: {', '.join(available)}")
    print(f"IOBinding on cuda:0: {staging_memory(DeviceSpec('cuda', 0))[1]}", file=sys.stderr)
    print("| model | provider | batch | session.run ms | IOBinding ms | max rel. error | ok |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        bound = "-" if row.bound_ms is None else f"{row.bound_ms:.3f}"
        print(
            f"| {row.model} | {row.provider} | {row.batch} | {row.run_ms:.3f} | {bound} | "
            f"{row.max_error:.2e} | {'yes' if row.ok else 'NO'} |"
        )
    if args.out:
        args.out.write_text(json.dumps([asdict(row) for row in rows], indent=1))
    if absent:
        print(
            f"NOT MEASURED: providers {absent} are not available in this ONNX Runtime build", file=sys.stderr
        )
    if not all(row.ok for row in rows):
        print("WRONG ANSWERS: see the rows marked NO", file=sys.stderr)
        return 1
    return 2 if absent else 0


if __name__ == "__main__":
    sys.exit(main())
