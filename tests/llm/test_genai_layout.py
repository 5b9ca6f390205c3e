"""A folder in onnxruntime-genai's layout (GroupQueryAttention, shared buffer, genai_config.json
and no config.json) loads, runs on the in-place pool and says what its Optimum twin says."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ortserve.config.model import ModelConfig
from ortserve.errors import ConfigError
from ortserve.llm.demo import train_tokenizer, write_llm_version
from ortserve.llm.kv_backend import PaddedBackend, PooledBackend
from ortserve.llm.loader import load_llm_version
from ortserve.llm.servable import LlmVersion, sampling_from
from ortserve.llm.weights import DecoderShape, random_weights
from ortserve.settings import ServerSettings


def _write(root: Path) -> None:
    tokenizer = train_tokenizer(["the quick brown fox jumps over the lazy dog " * 4], 96)
    shape = DecoderShape(tokenizer.get_vocab_size(), 64, 2, 4, 2, 96, 10000.0, 1e-5, 256)
    weights = random_weights(shape, seed=11)
    write_llm_version(root / "optimum" / "1", weights, tokenizer, layout="optimum")
    write_llm_version(root / "genai" / "1", weights, tokenizer, layout="genai")
    (root / "genai" / "1" / "config.json").unlink()  # the model builder writes genai_config.json


async def _load(root: Path, name: str) -> LlmVersion:
    config = ModelConfig.model_validate({"kind": "llm", "intra_op_threads": 1})
    model = root / name / "1" / "model.onnx"
    return await load_llm_version(name, 1, model, config, ServerSettings(model_repository=root))


async def test_a_genai_folder_loads_on_the_pool_and_matches_its_optimum_twin(tmp_path: Path) -> None:
    _write(tmp_path)
    genai, optimum = await _load(tmp_path, "genai"), await _load(tmp_path, "optimum")
    try:
        assert isinstance(genai.engine.backend, PooledBackend)
        assert isinstance(optimum.engine.backend, PaddedBackend)
        params = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}
        prompts = [[5, 9, 13, 2, 7] * n for n in (1, 3, 8)]

        async def answers(served: LlmVersion) -> list[list[int]]:
            streams = [served.generate(p, sampling_from(params, 12)) for p in prompts]
            return [(await s.collect()).token_ids for s in streams]

        together = await asyncio.gather(answers(genai), answers(optimum))
        assert together[0] == together[1]
        assert all(len(tokens) == 12 for tokens in together[0])
    finally:
        await genai.unload(1.0)
        await optimum.unload(1.0)


async def test_a_genai_config_without_its_decoder_section_is_refused_naming_it(tmp_path: Path) -> None:
    _write(tmp_path)
    (tmp_path / "genai" / "1" / "genai_config.json").write_text(json.dumps({"search": {}}))
    with pytest.raises(ConfigError, match=r"model\.decoder"):
        await _load(tmp_path, "genai")
