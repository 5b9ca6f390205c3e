"""Write the benchmark decoder as a GGUF file for llama.cpp (run with a Python that has the
``gguf`` package: a benchmark-only dependency, never ortserve's).

Input: an ``.npz`` of the weights under Hugging Face ``LlamaForCausalLM`` names, matrices
[out, in] (``llm_checkpoint.hf_tensors``), and a JSON file of the shape and vocabulary (see
``bench_llm_peer.py``). What ``convert_hf_to_gguf.py`` does for a Llama model, done here for
these tensors only: q_proj and k_proj rows are permuted from Hugging Face's rotate-half rotary
layout to GGML's interleaved one (per head, the two halves of the head dimension interleaved),
names become GGUF's (``blk.N.attn_q.weight``...), the metadata is the ``llama`` architecture's.
The vocabulary is written as a ``llama`` (SentencePiece-style) tokenizer: the benchmark's BPE
uses ``▁`` for spaces as SentencePiece does, and the prompts are token ids, so llama.cpp's own
tokenizer never runs on text; ``add_bos_token`` is off, as ortserve adds none.

Types: ``F32``; ``Q8_0`` and ``Q4_0`` quantize every linear weight (the seven per layer and
the output head, as ``ortserve quantize --llm`` quantizes every MatMul) with gguf-py's
reference quantizers (llama-quantize's defaults would make the head Q6_K); the token
embedding and the norms stay F32, as in ortserve's int4/int8 models.

Usage: ``python bench_llm_peer_gguf.py WEIGHTS.npz META.json OUT.gguf F32|Q8_0|Q4_0``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np

_LINEAR = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_TYPES = {
    "F32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "Q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "Q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """Rows [heads * head_dim, in] from rotate-half order to GGML's pairs (convert_hf_to_gguf)."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def gguf_tensors(
    tensors: dict[str, np.ndarray], meta: dict[str, object]
) -> dict[str, tuple[np.ndarray, bool]]:
    """GGUF name -> (array, is a linear weight to quantize)."""
    heads, kv_heads = int(meta["num_attention_heads"]), int(meta["num_key_value_heads"])  # type: ignore[call-overload]
    out: dict[str, tuple[np.ndarray, bool]] = {
        "token_embd.weight": (tensors["model.embed_tokens.weight"], False),
        "output_norm.weight": (tensors["model.norm.weight"], False),
        "output.weight": (tensors["lm_head.weight"], True),
    }
    for layer in range(int(meta["num_hidden_layers"])):  # type: ignore[call-overload]
        hf, blk = f"model.layers.{layer}.", f"blk.{layer}."
        out[blk + "attn_norm.weight"] = (tensors[hf + "input_layernorm.weight"], False)
        out[blk + "ffn_norm.weight"] = (tensors[hf + "post_attention_layernorm.weight"], False)
        for name, short in _LINEAR.items():
            weight = tensors[hf + name + ".weight"]
            if short == "attn_q":
                weight = permute(weight, heads)
            elif short == "attn_k":
                weight = permute(weight, kv_heads)
            out[blk + short + ".weight"] = (weight, True)
    return out


def write_gguf(weights: Path, meta_path: Path, target: Path, kind: str) -> None:
    meta = json.loads(meta_path.read_text())
    quant, file_type = _TYPES[kind]
    with np.load(weights) as loaded:
        tensors = {name: np.ascontiguousarray(loaded[name], dtype=np.float32) for name in loaded.files}
    writer = gguf.GGUFWriter(str(target), "llama")
    writer.add_name(f"ortserve bench decoder {kind}")
    writer.add_context_length(int(meta["max_position_embeddings"]))
    writer.add_embedding_length(int(meta["hidden_size"]))
    writer.add_block_count(int(meta["num_hidden_layers"]))
    writer.add_feed_forward_length(int(meta["intermediate_size"]))
    writer.add_head_count(int(meta["num_attention_heads"]))
    writer.add_head_count_kv(int(meta["num_key_value_heads"]))
    writer.add_rope_dimension_count(int(meta["hidden_size"]) // int(meta["num_attention_heads"]))
    writer.add_rope_freq_base(float(meta["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(meta["rms_norm_eps"]))
    writer.add_vocab_size(len(meta["tokens"]))
    writer.add_file_type(file_type)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(meta["tokens"])
    writer.add_token_scores([-float(i) for i in range(len(meta["tokens"]))])
    writer.add_token_types(meta["token_types"])
    writer.add_unk_token_id(int(meta["unk_id"]))
    writer.add_bos_token_id(int(meta["bos_id"]))
    writer.add_eos_token_id(int(meta["eos_id"]))
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    for name, (array, linear) in gguf_tensors(tensors, meta).items():
        if linear and quant != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, gguf.quants.quantize(array, quant), raw_dtype=quant)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    write_gguf(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
