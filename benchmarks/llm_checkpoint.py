"""One set of decoder weights in three checkpoints: the Optimum-layout ONNX version folder
(ortserve), the same folder plus a ``genai_config.json`` (onnxruntime-genai), and a Hugging
Face folder (config.json, model.safetensors, tokenizer files) that vLLM loads.

The safetensors file is written by hand (an 8-byte little-endian header length, a JSON header
of dtype / shape / byte offsets, then the raw tensors), so the benchmark needs neither torch
nor the ``safetensors`` package in ortserve's environment. Matrices are stored as Hugging Face's
``nn.Linear`` keeps them, [out, in], the transpose of what the ONNX MatMuls multiply by.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ortserve.llm.weights import DecoderWeights

__all__ = ["hf_tensors", "write_genai_config", "write_hf_checkpoint", "write_safetensors"]

F32 = npt.NDArray[np.float32]
_HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def hf_tensors(weights: DecoderWeights) -> dict[str, F32]:
    """The weights under ``LlamaForCausalLM``'s parameter names."""
    tensors: dict[str, F32] = {"model.embed_tokens.weight": weights.embed}
    for i, layer in enumerate(weights.layers):
        prefix = f"model.layers.{i}."
        tensors[prefix + "input_layernorm.weight"] = layer.attn_norm
        tensors[prefix + "post_attention_layernorm.weight"] = layer.mlp_norm
        for name, matrix in (
            ("self_attn.q_proj", layer.wq),
            ("self_attn.k_proj", layer.wk),
            ("self_attn.v_proj", layer.wv),
            ("self_attn.o_proj", layer.wo),
            ("mlp.gate_proj", layer.w_gate),
            ("mlp.up_proj", layer.w_up),
            ("mlp.down_proj", layer.w_down),
        ):
            tensors[prefix + name + ".weight"] = matrix.T
    tensors["model.norm.weight"] = weights.final_norm
    tensors["lm_head.weight"] = weights.lm_head.T
    return tensors


def write_safetensors(path: Path, tensors: dict[str, F32]) -> None:
    """Write float32 tensors in the safetensors format."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name, value in tensors.items():
        blob = np.ascontiguousarray(value, dtype="<f4").tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(value.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for blob in blobs:
            out.write(blob)


def write_hf_checkpoint(onnx_version: Path, weights: DecoderWeights, folder: Path) -> None:
    """A Hugging Face folder with the ONNX version's config and tokenizer, and its weights."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in _HF_FILES:
        shutil.copy(onnx_version / name, folder / name)
    write_safetensors(folder / "model.safetensors", hf_tensors(weights))


def write_genai_config(onnx_version: Path, weights: DecoderWeights, threads: int = 1) -> None:
    """onnxruntime-genai's description of the Optimum-layout graph in ``onnx_version``.

    ``past_present_share_buffer`` is off: sharing needs a graph whose attention writes into a
    preallocated cache (ORT's GroupQueryAttention); this graph concatenates, as Optimum's do.
    """
    shape = weights.shape
    hf = json.loads((onnx_version / "config.json").read_text())
    eos = int(hf["eos_token_id"])
    config = {
        "model": {
            "bos_token_id": int(hf["bos_token_id"]),
            "context_length": shape.max_position_embeddings,
            "decoder": {
                "session_options": {
                    "log_id": "onnxruntime-genai",
                    "intra_op_num_threads": threads,
                    "inter_op_num_threads": 1,
                    "provider_options": [],
                },
                "filename": "model.onnx",
                "head_size": shape.head_dim,
                "hidden_size": shape.hidden_size,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "position_ids": "position_ids",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": shape.num_attention_heads,
                "num_hidden_layers": shape.num_hidden_layers,
                "num_key_value_heads": shape.num_key_value_heads,
            },
            "eos_token_id": eos,
            "pad_token_id": eos,
            "type": "llama",
            "vocab_size": shape.vocab_size,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": shape.max_position_embeddings,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": False,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }
    (onnx_version / "genai_config.json").write_text(json.dumps(config, indent=2))
