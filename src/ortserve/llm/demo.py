"""The demo LLM: a BPE tokenizer trained on the shipped corpus and a decoder fitted to it,
written as Optimum's ``text-generation-with-past`` export lays out a version folder."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import onnx
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ortserve.llm.fit import fit_trigram_decoder
from ortserve.llm.gqa_graph import build_gqa_decoder
from ortserve.llm.graph import build_decoder
from ortserve.llm.weights import DecoderShape, DecoderWeights

__all__ = [
    "DEMO_LLM_NAME",
    "EOS_TOKEN",
    "corpus_documents",
    "train_tokenizer",
    "write_demo_llm",
    "write_llm_version",
]

DEMO_LLM_NAME = "tiny_llm"
EOS_TOKEN = "<|endoftext|>"
_VOCAB = 400
_JSON_CHARACTERS = '{}[]":,-_/\\0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZz'
# The chat template renders the conversation as plain text, so the model continues it.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}{% if not loop.last %}\n{% endif %}{% endfor %}"
)
_CONFIG_YAML = """\
# A decoder-only LLM (Optimum layout): served with continuous batching on /v1/chat/completions.
kind: llm
llm:
  max_num_seqs: 16
  max_waiting: 64
  max_context_len: 2048
"""


def corpus_documents() -> list[str]:
    """The shipped corpus, one paragraph per document."""
    text = resources.files("ortserve.llm").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def train_tokenizer(documents: list[str], vocab_size: int = _VOCAB) -> Tokenizer:
    """A BPE tokenizer (sentencepiece-style spaces) trained on ``documents``; deterministic."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", EOS_TOKEN], show_progress=False
    )
    tokenizer.train_from_iterator(documents, trainer)
    return tokenizer


def _hf_config(shape: DecoderShape, eos: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.intermediate_size,
        "rope_theta": shape.rope_theta,
        "rms_norm_eps": shape.rms_norm_eps,
        "max_position_embeddings": shape.max_position_embeddings,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "torch_dtype": "float32",
    }


def _eos(tokenizer: Tokenizer) -> int:
    eos = tokenizer.token_to_id(EOS_TOKEN)
    if eos is None:
        raise ValueError(f"the tokenizer has no {EOS_TOKEN} token")
    return int(eos)


def _genai_config(shape: DecoderShape, eos: int) -> dict[str, object]:
    """What onnxruntime-genai's model builder writes next to a GroupQueryAttention decoder."""
    past = {"past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"}
    present = {"present_key_names": "present.%d.key", "present_value_names": "present.%d.value"}
    return {
        "model": {
            "type": "llama",
            "bos_token_id": eos,
            "eos_token_id": eos,
            "pad_token_id": eos,
            "context_length": shape.max_position_embeddings,
            "vocab_size": shape.vocab_size,
            "decoder": {
                "filename": "model.onnx",
                "head_size": shape.head_dim,
                "hidden_size": shape.hidden_size,
                "num_attention_heads": shape.num_attention_heads,
                "num_key_value_heads": shape.num_key_value_heads,
                "num_hidden_layers": shape.num_hidden_layers,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "position_ids": "position_ids",
                    **past,
                },
                "outputs": {"logits": "logits", **present},
            },
        },
        "search": {"max_length": shape.max_position_embeddings, "past_present_share_buffer": True},
    }


def write_llm_version(
    folder: Path, weights: DecoderWeights, tokenizer: Tokenizer, layout: str = "optimum"
) -> None:
    """Write model.onnx, config.json, generation_config.json and the tokenizer files.

    Args:
        layout: ``optimum`` (attention from plain ops, ``present = Concat(past, new)``) or
            ``genai`` (GroupQueryAttention with a shared past/present buffer, plus
            genai_config.json, as onnxruntime-genai's model builder lays a folder out).
    """
    folder.mkdir(parents=True, exist_ok=True)
    eos = _eos(tokenizer)
    if layout == "genai":
        onnx.save(build_gqa_decoder(weights), str(folder / "model.onnx"))
        genai = _genai_config(weights.shape, eos)
        (folder / "genai_config.json").write_text(json.dumps(genai, indent=2), encoding="utf-8")
    elif layout == "optimum":
        onnx.save(build_decoder(weights), str(folder / "model.onnx"))
    else:
        raise ValueError(f"unknown layout {layout!r} (optimum or genai)")
    tokenizer.save(str(folder / "tokenizer.json"))
    hf = _hf_config(weights.shape, eos)
    (folder / "config.json").write_text(json.dumps(hf, indent=2), encoding="utf-8")
    generation = {"bos_token_id": eos, "eos_token_id": eos, "max_new_tokens": 64}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "bos_token": EOS_TOKEN,
        "unk_token": "<unk>",
        "model_max_length": weights.shape.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2), encoding="utf-8")


def demo_weights() -> tuple[DecoderWeights, Tokenizer]:
    """The demo's tokenizer and its corpus-fitted decoder weights."""
    documents = corpus_documents()
    tokenizer = train_tokenizer(documents)
    # The corpus is prose: without these the demo could not write JSON or a tool call at all
    # (structured output masks the vocabulary, it cannot add to it). Added after training, so
    # the merges and the corpus's tokens do not change.
    tokenizer.add_tokens([c for c in _JSON_CHARACTERS if tokenizer.token_to_id(c) is None])
    eos = _eos(tokenizer)
    sequences = [[*tokenizer.encode(doc).ids, eos] for doc in documents]
    return fit_trigram_decoder(sequences, tokenizer.get_vocab_size()), tokenizer


def write_demo_llm(root: Path) -> str:
    """Write the demo LLM as model ``tiny_llm`` under ``root``; returns its name."""
    weights, tokenizer = demo_weights()
    write_llm_version(root / DEMO_LLM_NAME / "1", weights, tokenizer, layout="genai")
    (root / DEMO_LLM_NAME / "config.yaml").write_text(_CONFIG_YAML, encoding="utf-8")
    return DEMO_LLM_NAME
