"""int4 / int8 MatMulNBits weights: ONNX Runtime multiplies by exactly the dequantized weights
the packer meant, and a quantized LLM version (made at test time) loads and generates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortserve.config.model import ModelConfig
from ortserve.errors import ConfigError
from ortserve.llm.demo import train_tokenizer, write_llm_version
from ortserve.llm.loader import load_llm_version
from ortserve.llm.quantize import dequantize, quantize_llm_folder, quantize_matmuls
from ortserve.llm.servable import sampling_from
from ortserve.llm.weights import DecoderShape, random_weights
from ortserve.settings import ServerSettings


def _matmul_model(weight: np.ndarray) -> onnx.ModelProto:
    k, n = weight.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, n])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize(("bits", "block"), [(4, 32), (4, 128), (8, 32), (8, 128)])
def test_matmulnbits_multiplies_by_the_dequantized_weights(bits: int, block: int) -> None:
    rng = np.random.default_rng(bits + block)
    weight = rng.standard_normal((256, 40)).astype(np.float32)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    model, converted = quantize_matmuls(_matmul_model(weight), bits, block)
    assert converted == 1 and model.graph.node[0].op_type == "MatMulNBits"
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x @ dequantize(weight, bits, block), rtol=1e-3, atol=1e-3)
    error = np.abs(dequantize(weight, bits, block) - weight).max()
    assert error < (0.5 if bits == 4 else 0.04)


@pytest.mark.parametrize(("bits", "level"), [(4, 0), (4, 4), (8, 0), (8, 4)])
def test_symmetric_weights_have_no_zero_points_and_onnx_runtime_multiplies_by_them(
    bits: int, level: int
) -> None:
    rng = np.random.default_rng(bits * 10 + level)
    weight = rng.standard_normal((256, 40)).astype(np.float32)
    weight[:32, 0] = 0.0  # an all-zero block: scale 0, every code the middle one
    x = rng.standard_normal((3, 256)).astype(np.float32)
    model, _ = quantize_matmuls(_matmul_model(weight), bits, 32, symmetric=True, accuracy_level=level)
    node = model.graph.node[0]
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert len(node.input) == 3 and attributes["accuracy_level"] == level
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = x @ dequantize(weight, bits, 32, symmetric=True)
    # level 4 rounds the activations to int8 per block too: about 1% of a product's size
    tolerance = 1e-3 if level == 0 else 0.05 * np.abs(x).max() * np.abs(weight).max() * 16
    np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, rtol=1e-3, atol=tolerance)


def test_symmetric_rounding_is_ggmls_q4_0_and_q8_0() -> None:
    """Hand-worked blocks: Q4_0's scale is the signed value of largest magnitude over -8 and
    its codes trunc(x/scale + 8.5); Q8_0's scale is the largest magnitude over 127, codes
    rounded half away from zero; scales are stored as float16."""
    block = np.zeros((32, 1), np.float32)
    block[:4, 0] = [-2.0, 1.0, 0.25, 0.5]  # largest magnitude -2.0: Q4_0 scale 0.25
    q4 = dequantize(block, 4, 32, symmetric=True)[:4, 0]
    # codes: trunc(-2/0.25 + 8.5) = 0 -> -8 * 0.25; trunc(4 + 8.5) = 12 -> 1.0; 9 -> 0.25; 10 -> 0.5
    np.testing.assert_array_equal(q4, [-2.0, 1.0, 0.25, 0.5])
    block[:4, 0] = [1.27, 0.005, -0.015, 0.0]  # Q8_0 scale 0.01 (float16: 0.010002136)
    q8 = dequantize(block, 8, 32, symmetric=True)[:4, 0]
    scale = float(np.float16(np.float32(1.27) / np.float32(127)))
    # 0.005 / 0.01 = 0.5 rounds away from zero to 1, -1.5 to -2 (round-half-even would give 0, -2)
    np.testing.assert_allclose(q8, [127 * scale, scale, -2 * scale, 0.0], rtol=1e-6)
    with pytest.raises(ConfigError, match="accuracy_level"):
        quantize_matmuls(_matmul_model(np.ones((64, 8), np.float32)), 4, 32, accuracy_level=5)


def test_bad_bits_and_block_sizes_are_refused() -> None:
    weight = np.ones((64, 8), np.float32)
    with pytest.raises(ConfigError, match="int4 or int8"):
        quantize_matmuls(_matmul_model(weight), 3, 32)
    with pytest.raises(ConfigError, match="power of two"):
        quantize_matmuls(_matmul_model(weight), 4, 48)


@pytest.mark.parametrize("bits", [4, 8])
async def test_a_quantized_llm_version_loads_and_generates(tmp_path: Path, bits: int) -> None:
    tokenizer = train_tokenizer(["the quick brown fox jumps over the lazy dog " * 4], 96)
    shape = DecoderShape(tokenizer.get_vocab_size(), 64, 2, 4, 2, 128, 10000.0, 1e-5, 256)
    write_llm_version(tmp_path / "m" / "1", random_weights(shape, seed=2), tokenizer, layout="genai")
    converted = quantize_llm_folder(tmp_path / "m" / "1", tmp_path / "m" / "2", bits, 32)
    assert converted == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the head
    config = ModelConfig.model_validate({"kind": "llm", "intra_op_threads": 1})
    model = tmp_path / "m" / "2" / "model.onnx"
    served = await load_llm_version("m", 2, model, config, ServerSettings(model_repository=tmp_path))
    try:
        stream = served.generate(
            [5, 9, 13, 2, 7] * 4, sampling_from({"max_tokens": 10, "ignore_eos": True}, 10)
        )
        assert len((await stream.collect()).token_ids) == 10
    finally:
        await served.unload(1.0)


def test_the_cli_writes_the_next_version_with_nbit_weights(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ortserve.cli.main import main

    tokenizer = train_tokenizer(["the quick brown fox jumps over the lazy dog " * 4], 96)
    shape = DecoderShape(tokenizer.get_vocab_size(), 64, 1, 4, 2, 128, 10000.0, 1e-5, 256)
    write_llm_version(tmp_path / "m" / "1", random_weights(shape, seed=4), tokenizer, layout="genai")
    args = [
        "quantize",
        "--model-repository",
        str(tmp_path),
        "--model",
        "m",
        "--llm",
        "int4",
        "--block-size",
        "32",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "version 2: 8 MatMuls as int4" in result.output
    ops = {node.op_type for node in onnx.load(str(tmp_path / "m" / "2" / "model.onnx")).graph.node}
    assert "MatMulNBits" in ops and "MatMul" not in ops
    assert (tmp_path / "m" / "2" / "tokenizer.json").is_file()
