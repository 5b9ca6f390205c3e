"""Weight-only int4 / int8 quantization of an LLM version's MatMuls into ONNX Runtime's
``com.microsoft.MatMulNBits`` (blockwise, asymmetric, one scale and zero point per block of
``block_size`` weights along K), as onnxruntime-genai's model builder writes them.

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

__all__ = ["dequantize", "quantize_llm_folder", "quantize_llm_version", "quantize_matmuls", "quantize_weight"]

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


def quantize_weight(weight: F32, bits: int, block: int) -> tuple[U8, F32, U8]:
    """``weight`` [K, N] -> (B [N, K/block, block·bits/8], scales [N·K/block], zero points)."""
    k, n = weight.shape
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


def dequantize(weight: F32, bits: int, block: int) -> F32:
    """What the quantized weight multiplies by ([K, N], float32): the reference for tests."""
    k, n = weight.shape
    grouped = weight.T.reshape(n, k // block, block).astype(np.float64)
    low, high = np.minimum(grouped.min(axis=2), 0.0), np.maximum(grouped.max(axis=2), 0.0)
    top = (1 << bits) - 1
    scale = np.where(high > low, (high - low) / top, 1.0)
    zero = np.clip(np.round(-low / scale), 0, top)
    codes = np.clip(np.round(grouped / scale[..., None]) + zero[..., None], 0, top)
    out: F32 = ((codes - zero[..., None]) * scale[..., None]).reshape(n, k).T.astype(np.float32)
    return out


def quantize_matmuls(model: onnx.ModelProto, bits: int, block: int) -> tuple[onnx.ModelProto, int]:
    """Every MatMul by a 2-D float initializer whose K is a multiple of ``block`` becomes a
    MatMulNBits; returns the model and how many were converted.

    Raises:
        ConfigError: bits other than 4 or 8, or a block size ONNX Runtime does not take.
    """
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
        packed, scales, zeros = quantize_weight(array, bits, block)
        stem = node.input[1]
        extra = [
            numpy_helper.from_array(packed, f"{stem}_q{bits}"),
            numpy_helper.from_array(scales, f"{stem}_scales"),
            numpy_helper.from_array(zeros, f"{stem}_zero_points"),
        ]
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


def quantize_llm_folder(source: Path, target: Path, bits: int, block: int) -> int:
    """Write ``target``: ``source``'s LLM version with MatMulNBits weights and its other files
    copied (tokenizer, configs); returns the MatMuls converted.

    Raises:
        ConfigError: no model.onnx, nothing to quantize, or bad bits / block size.
    """
    model_path = source / "model.onnx"
    if not model_path.is_file():
        raise ConfigError(f"{source}: no model.onnx to quantize")
    model, converted = quantize_matmuls(onnx.load(str(model_path)), bits, block)
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
