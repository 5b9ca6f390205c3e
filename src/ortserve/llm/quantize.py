"""Weight-only int4 / int8 quantization of an LLM version's MatMuls into ONNX Runtime's
``com.microsoft.MatMulNBits`` (blockwise, asymmetric, one scale and zero point per block of
``block_size`` weights along K), as onnxruntime-genai's model builder writes them.

``symmetric`` writes no zero points (ONNX Runtime then takes 2^(bits-1)) and rounds as
GGML's Q4_0 / Q8_0 do, scales rounded to float16: with a block of 32, the same weights as a
llama.cpp Q4_0 / Q8_0 file made from the same float weights, code for code.
``accuracy_level`` is MatMulNBits' attribute: 0 computes in float32, 4 quantizes the
activations to int8 per block and multiplies in integers (VNNI where the CPU has it). A
quantized LLM version (``ortserve quantize --llm``) gets 4: on a 2-vCPU AMD EPYC with ONNX
Runtime 1.32, 8-bit weights at level 0 decoded 5x slower than fp32 (a float32 kernel that
dequantizes every block), at level 4 2-3x faster; the perplexity moved by 0.1% (see
benchmarks/RESULTS.md, "llama.cpp on the same weights").

Written here rather than through onnxruntime.quantization's MatMulNBitsQuantizer, which needs
``onnx_ir`` (not a dependency); the layout is ONNX Runtime's: ``B`` [N, K/block, block·bits/8]
uint8 (low nibble first for 4 bits), ``scales`` [N·K/block] float32, ``zero_points``
[N, ceil(K/block·bits/8)] uint8.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
from onnx import helper, numpy_helper

from ortserve.errors import ConfigError

__all__ = [
    "LLM_ACCURACY_LEVEL",
    "dequantize",
    "quantize_llm_folder",
    "quantize_llm_version",
    "quantize_matmuls",
    "quantize_weight",
]

LLM_ACCURACY_LEVEL = 4
"""MatMulNBits' accuracy level in a quantized LLM version: int8 activations (see above)."""

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]


def _pack(values: U8, bits: int) -> U8:
    """[..., n] codes -> [..., n·bits/8] bytes (4 bits: element 2i low nibble, 2i+1 high)."""
    if bits == 8:
        return values
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros((*values.shape[:-1], 1), np.uint8)], axis=-1)
    packed: U8 = (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)
    return packed


def _symmetric(grouped: npt.NDArray[np.float64], bits: int) -> tuple[U8, F32]:
    """GGML's Q4_0 / Q8_0 rounding of blocks ``grouped`` [N, blocks, block]: (codes, scales).

    Q4_0: the scale is the block's value of largest magnitude (sign kept) over -8, codes
    trunc(x / scale + 8.5) clipped to 0..15. Q8_0: the largest magnitude over 127, codes
    round-half-away(x / scale) + 128. Scales are float16, as GGML stores them; the division is
    by the float32 reciprocal, as GGML's reference quantizers compute it.
    """
    values = grouped.astype(np.float32)
    if bits == 4:
        at = np.abs(values).argmax(axis=2)[..., None]
        scale = (np.take_along_axis(values, at, axis=2)[..., 0] / np.float32(-8)).astype(np.float32)
    else:
        scale = (np.abs(values).max(axis=2) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inverse = np.where(scale == 0, np.float32(0), np.float32(1) / scale).astype(np.float32)
    scaled = values * inverse[..., None]
    if bits == 4:
        codes = np.clip(np.trunc(scaled + np.float32(8.5)), 0, 15)
    else:
        codes = np.sign(scaled) * np.floor(np.abs(scaled) + np.float32(0.5)) + 128
    stored = scale.astype(np.float16).astype(np.float32)
    return codes.astype(np.uint8), stored


def quantize_weight(weight: F32, bits: int, block: int, symmetric: bool = False) -> tuple[U8, F32, U8 | None]:
    """``weight`` [K, N] -> (B [N, K/block, block·bits/8], scales [N·K/block], zero points;
    None when ``symmetric``)."""
    k, n = weight.shape
    if symmetric:
        codes, scales = _symmetric(weight.T.reshape(n, k // block, block).astype(np.float64), bits)
        return _pack(codes, bits), scales.reshape(-1), None
    blocks = k // block
    grouped = weight.T.reshape(n, blocks, block).astype(np.float64)
    low = np.minimum(grouped.min(axis=2), 0.0)
    high = np.maximum(grouped.max(axis=2), 0.0)
    top = (1 << bits) - 1
    scale = np.where(high > low, (high - low) / top, 1.0)
    zero = np.clip(np.round(-low / scale), 0, top)
    codes = np.clip(np.round(grouped / scale[..., None]) + zero[..., None], 0, top).astype(np.uint8)
    zeros = _pack(zero.astype(np.uint8), bits)
    return _pack(codes, bits), scale.astype(np.float32).reshape(-1), zeros


def dequantize(weight: F32, bits: int, block: int, symmetric: bool = False) -> F32:
    """What the quantized weight multiplies by ([K, N], float32): the reference for tests."""
    k, n = weight.shape
    if symmetric:
        codes, scales = _symmetric(weight.T.reshape(n, k // block, block).astype(np.float64), bits)
        middle = 1 << (bits - 1)
        values = (codes.astype(np.float32) - middle) * scales[..., None]
        result: F32 = values.reshape(n, k).T.astype(np.float32)
        return result
    grouped = weight.T.reshape(n, k // block, block).astype(np.float64)
    low, high = np.minimum(grouped.min(axis=2), 0.0), np.maximum(grouped.max(axis=2), 0.0)
    top = (1 << bits) - 1
    scale = np.where(high > low, (high - low) / top, 1.0)
    zero = np.clip(np.round(-low / scale), 0, top)
    codes = np.clip(np.round(grouped / scale[..., None]) + zero[..., None], 0, top)
    out: F32 = ((codes - zero[..., None]) * scale[..., None]).reshape(n, k).T.astype(np.float32)
    return out


def quantize_matmuls(
    model: onnx.ModelProto, bits: int, block: int, symmetric: bool = False, accuracy_level: int = 0
) -> tuple[onnx.ModelProto, int]:
    """Every MatMul by a 2-D float initializer whose K is a multiple of ``block`` becomes a
    MatMulNBits; returns the model and how many were converted.

    Raises:
        ConfigError: bits other than 4 or 8, a block size ONNX Runtime does not take, or an
            accuracy level other than 0-4.
    """
    if accuracy_level not in range(5):
        raise ConfigError(f"MatMulNBits' accuracy_level is 0-4, not {accuracy_level}")
    if bits not in (4, 8):
        raise ConfigError(f"--llm quantizes to int4 or int8, not {bits} bits")
    if block < 16 or block & (block - 1):
        raise ConfigError(f"the block size must be a power of two of at least 16 (got {block})")
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    nodes, used, converted = [], set(), 0
    for node in graph.node:
        tensor = weights.get(node.input[1]) if node.op_type == "MatMul" and not node.domain else None
        array = numpy_helper.to_array(tensor) if tensor is not None else None
        if array is None or array.ndim != 2 or array.dtype != np.float32 or array.shape[0] % block:
            nodes.append(node)
            continue
        k, n = array.shape
        packed, scales, zeros = quantize_weight(array, bits, block, symmetric)
        stem = node.input[1]
        extra = [
            numpy_helper.from_array(packed, f"{stem}_q{bits}"),
            numpy_helper.from_array(scales, f"{stem}_scales"),
        ]
        if zeros is not None:
            extra.append(numpy_helper.from_array(zeros, f"{stem}_zero_points"))
        graph.initializer.extend(extra)
        nodes.append(
            helper.make_node(
                "MatMulNBits",
                [node.input[0], *(t.name for t in extra)],
                list(node.output),
                domain="com.microsoft",
                K=k,
                N=n,
                bits=bits,
                block_size=block,
                accuracy_level=accuracy_level,
            )
        )
        used.add(stem)
        converted += 1
    kept = [t for t in graph.initializer if t.name not in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model, converted


def quantize_llm_folder(
    source: Path,
    target: Path,
    bits: int,
    block: int,
    symmetric: bool = False,
    accuracy_level: int = LLM_ACCURACY_LEVEL,
) -> int:
    """Write ``target``: ``source``'s LLM version with MatMulNBits weights and its other files
    copied (tokenizer, configs); returns the MatMuls converted.

    Raises:
        ConfigError: no model.onnx, nothing to quantize, or bad bits / block size.
    """
    model_path = source / "model.onnx"
    if not model_path.is_file():
        raise ConfigError(f"{source}: no model.onnx to quantize")
    model, converted = quantize_matmuls(onnx.load(str(model_path)), bits, block, symmetric, accuracy_level)
    if not converted:
        raise ConfigError(f"{model_path}: no MatMul by a float weight with K a multiple of {block}")
    target.mkdir(parents=True, exist_ok=False)
    for item in source.iterdir():
        if item.is_file() and item.name != "model.onnx" and not item.name.endswith(".data"):
            shutil.copy2(item, target / item.name)
    onnx.save(model, str(target / "model.onnx"))
    return converted


def quantize_llm_version(
    repository: Path, model: str, source: int | None, bits: int, block: int
) -> tuple[int, int]:
    """Write the next version of ``model``: ``source`` (default: the highest) with int4/int8
    weights; returns (new version, MatMuls converted).

    Raises:
        ConfigError: no such model or version, or nothing to quantize.
    """
    folder = repository / model
    versions = (
        sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
        if folder.is_dir()
        else []
    )
    if not versions:
        raise ConfigError(f"{folder}: no numbered version to quantize")
    chosen = versions[-1] if source is None else source
    if chosen not in versions:
        raise ConfigError(f"{folder}: no version {chosen}")
    target = versions[-1] + 1
    return target, quantize_llm_folder(folder / str(chosen), folder / str(target), bits, block)
