"""Reading an LLM version folder in Optimum's ``text-generation-with-past`` layout and checking
that its graph is a decoder ortserve can drive; anything else is refused with the reason."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ortserve.errors import ConfigError

__all__ = ["DecoderLayout", "LlmFiles", "check_graph", "read_llm_files"]

_REQUIRED = ("config.json", "tokenizer.json")
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_FLOAT = "tensor(float)"


@dataclass(frozen=True, slots=True)
class LlmFiles:
    """What the JSON files of a version folder say about the decoder."""

    folder: Path
    layers: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    config: dict[str, object]
    generation: dict[str, object]
    tokenizer_config: dict[str, object]
    shared_buffer: bool = False
    """genai_config.json asks for a shared past/present buffer (GroupQueryAttention writes
    keys and values in place): the engine keeps rows in a slot pool."""


@dataclass(frozen=True, slots=True)
class DecoderLayout:
    """The graph's inputs and outputs the engine feeds and reads."""

    layers: int
    kv_heads: int
    head_dim: int
    has_position_ids: bool
    has_cache_branch: bool
    output_names: tuple[str, ...]
    """``logits`` then ``present.{i}.key``, ``present.{i}.value`` for every layer."""
    shared_buffer: bool = False
    """``present`` may be bound to the buffer given as ``past`` (rows right-padded)."""


def _read_json(path: Path, required: bool) -> dict[str, object]:
    if not path.exists():
        if required:
            raise ConfigError(f"{path.parent}: an llm version needs {path.name} (Optimum's export writes it)")
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: the top level must be an object")
    return value


def _int_field(config: dict[str, object], key: str, where: Path, default: int | None = None) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{where}: field {key} must be a positive integer (found {value!r})")
    return value


def _eos_ids(*sources: dict[str, object]) -> tuple[int, ...]:
    for source in sources:
        value = source.get("eos_token_id")
        if isinstance(value, int):
            return (value,)
        if isinstance(value, list) and all(isinstance(v, int) for v in value):
            return tuple(value)
    return ()


def _config_from_genai(genai: dict[str, object], where: Path) -> dict[str, object]:
    """config.json's fields from what onnxruntime-genai's model builder writes instead
    (``model.decoder``: head_size, hidden_size, heads, layers; ``model``: vocabulary, context, EOS)."""
    model = genai.get("model")
    decoder = model.get("decoder") if isinstance(model, dict) else None
    if not isinstance(model, dict) or not isinstance(decoder, dict):
        raise ConfigError(f"{where}: needs model.decoder (onnxruntime-genai's layout)")
    return {
        "num_attention_heads": decoder.get("num_attention_heads"),
        "num_key_value_heads": decoder.get("num_key_value_heads"),
        "hidden_size": decoder.get("hidden_size"),
        "head_dim": decoder.get("head_size"),
        "num_hidden_layers": decoder.get("num_hidden_layers"),
        "vocab_size": model.get("vocab_size"),
        "max_position_embeddings": model.get("context_length", 2048),
        "eos_token_id": model.get("eos_token_id"),
    }


def read_llm_files(folder: Path) -> LlmFiles:
    """Read config.json (or genai_config.json), generation_config.json and tokenizer_config.json
    of a version folder.

    Raises:
        ConfigError: a required file is missing, or a field is unusable (named).
    """
    genai = _read_json(folder / "genai_config.json", False)
    search = genai.get("search")
    for name in _REQUIRED:
        if not (folder / name).is_file() and not (name == "config.json" and genai):
            raise ConfigError(f"{folder}: an llm version needs {name} (Optimum's export writes it)")
    if (folder / "config.json").is_file():
        config, where = _read_json(folder / "config.json", True), folder / "config.json"
    else:
        config, where = _config_from_genai(genai, folder / "genai_config.json"), folder / "genai_config.json"
    generation = _read_json(folder / "generation_config.json", False)
    tokenizer_config = _read_json(folder / "tokenizer_config.json", False)
    heads = _int_field(config, "num_attention_heads", where)
    hidden = _int_field(config, "hidden_size", where)
    head_dim = config.get("head_dim") or hidden // heads
    if not isinstance(head_dim, int):
        raise ConfigError(f"{where}: field head_dim must be an integer")
    return LlmFiles(
        folder=folder,
        layers=_int_field(config, "num_hidden_layers", where),
        kv_heads=_int_field(config, "num_key_value_heads", where, heads),
        head_dim=head_dim,
        vocab_size=_int_field(config, "vocab_size", where),
        max_position_embeddings=_int_field(config, "max_position_embeddings", where, 2048),
        eos_token_ids=_eos_ids(generation, config),
        config=config,
        generation=generation,
        tokenizer_config=tokenizer_config,
        shared_buffer=isinstance(search, dict) and search.get("past_present_share_buffer") is True,
    )


def check_graph(
    files: LlmFiles, inputs: dict[str, tuple[str, list[object]]], outputs: dict[str, tuple[str, list[object]]]
) -> DecoderLayout:
    """Check the graph's signature (name -> (type, shape)) against the Optimum layout.

    Raises:
        ConfigError: the graph is not a decoder with past key values ortserve can drive.
    """
    where = files.folder / "model.onnx"
    for name in ("input_ids", "attention_mask"):
        if name not in inputs:
            raise ConfigError(f"{where}: an llm graph needs input {name!r} (Optimum layout)")
    past = {m.group(1, 2) for name in inputs if (m := _PAST.match(name))}
    if not past:
        raise ConfigError(
            f"{where}: the graph has no past_key_values inputs: export it with "
            "`optimum-cli export onnx --task text-generation-with-past`"
        )
    layers = len({layer for layer, _ in past})
    if layers != files.layers or len(past) != 2 * layers:
        raise ConfigError(
            f"{where}: the graph has past key/values for {layers} layer(s), config.json says "
            f"num_hidden_layers {files.layers}"
        )
    names = ["logits"]
    for layer in range(layers):
        for part in ("key", "value"):
            past_type, shape = inputs[f"past_key_values.{layer}.{part}"]
            if past_type != _FLOAT:
                raise ConfigError(
                    f"{where}: past key values of type {past_type} are not supported (float32 only)"
                )
            if len(shape) != 4 or shape[1] != files.kv_heads or shape[3] != files.head_dim:
                raise ConfigError(
                    f"{where}: past_key_values.{layer}.{part} has shape {shape}, expected "
                    f"[batch, {files.kv_heads}, past, {files.head_dim}] from config.json"
                )
            names.append(f"present.{layer}.{part}")
    missing = [n for n in names if n not in outputs]
    if missing:
        raise ConfigError(f"{where}: the graph lacks output(s) {missing} (Optimum layout)")
    if outputs["logits"][0] != _FLOAT:
        raise ConfigError(f"{where}: logits of type {outputs['logits'][0]} are not supported (float32 only)")
    known = {"input_ids", "attention_mask", "position_ids", "use_cache_branch"}
    unknown = sorted(n for n in inputs if n not in known and not _PAST.match(n))
    if unknown:
        raise ConfigError(f"{where}: unsupported graph input(s) {unknown}")
    return DecoderLayout(
        layers,
        files.kv_heads,
        files.head_dim,
        "position_ids" in inputs,
        "use_cache_branch" in inputs,
        tuple(names),
        files.shared_buffer,
    )
