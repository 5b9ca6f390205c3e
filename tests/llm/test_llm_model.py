"""The demo decoder's ONNX graph against a NumPy reference, the demo's fit to its corpus, and
which version folders load as kind ``llm`` (Optimum layouts of other sizes) or are refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
import pytest

from llm_reference import F32, I64, reference_forward, small_shape, write_random_llm
from ortserve.config.model import ModelConfig
from ortserve.demo import build_mlp
from ortserve.errors import ConfigError
from ortserve.llm.demo import EOS_TOKEN, corpus_documents, demo_weights
from ortserve.llm.graph import build_decoder
from ortserve.llm.loader import load_llm_version
from ortserve.llm.servable import sampling_from
from ortserve.llm.stats import LlmCollector
from ortserve.llm.weights import DecoderWeights, random_weights
from ortserve.settings import ServerSettings


def _session(weights: DecoderWeights) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(
        build_decoder(weights).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _past(weights: DecoderWeights, rows: int, length: int, seed: int) -> list[F32]:
    s = weights.shape
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal((rows, s.num_key_value_heads, length, s.head_dim)).astype(np.float32)
        for _ in range(2 * s.num_hidden_layers)
    ]


def _feeds(ids: I64, mask: I64, positions: I64, past: list[F32]) -> dict[str, npt.NDArray[np.generic]]:
    feeds: dict[str, npt.NDArray[np.generic]] = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": positions,
    }
    for i, part in enumerate(past):
        feeds[f"past_key_values.{i // 2}.{'key' if i % 2 == 0 else 'value'}"] = part
    return feeds


@pytest.mark.parametrize(("layers", "heads", "kv_heads"), [(2, 4, 2), (1, 4, 4), (3, 4, 1)])
def test_onnx_logits_and_present_match_the_numpy_reference(layers: int, heads: int, kv_heads: int) -> None:
    weights = random_weights(small_shape(layers, heads, kv_heads), seed=layers)
    session = _session(weights)
    past = _past(weights, 2, 3, seed=1)
    ids = np.array([[5, 9, 2, 7], [1, 3, 3, 8]], dtype=np.int64)
    # Row 1 has a masked hole in its cache, as a row that joined a longer batch has.
    mask = np.array([[1, 1, 1, 1, 1, 1, 1], [0, 1, 0, 1, 1, 1, 1]], dtype=np.int64)
    positions = np.array([[3, 4, 5, 6], [1, 2, 3, 4]], dtype=np.int64)
    outputs = session.run(None, _feeds(ids, mask, positions, past))
    logits, present = reference_forward(weights, ids, mask, positions, past)
    np.testing.assert_allclose(outputs[0], logits, rtol=1e-4, atol=1e-4)
    for got, want in zip(outputs[1:], present, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_demo_decoder_matches_the_reference_and_continues_its_corpus() -> None:
    weights, tokenizer = demo_weights()
    session = _session(weights)
    document = corpus_documents()[0]
    ids = np.array([tokenizer.encode(document).ids[:12]], dtype=np.int64)
    positions = np.arange(12, dtype=np.int64)[None]
    outputs = session.run(None, _feeds(ids, np.ones_like(ids), positions, _past(weights, 1, 0, 0)))
    logits, _ = reference_forward(weights, ids, np.ones_like(ids), positions, _past(weights, 1, 0, 0))
    np.testing.assert_allclose(outputs[0], logits, rtol=1e-4, atol=1e-3)
    # Greedy continuation of the first 12 tokens is the document's 13th token, and so on.
    expected = tokenizer.encode(document).ids
    generated = list(ids[0])
    past = list(outputs[1:])
    token = int(outputs[0][0, -1].argmax())
    for step in range(8):
        assert token == expected[12 + step], tokenizer.decode([*generated, token])
        generated.append(token)
        length = len(generated)
        step_out = session.run(
            None,
            _feeds(np.array([[token]]), np.ones((1, length), np.int64), np.array([[length - 1]]), past),
        )
        past, token = list(step_out[1:]), int(step_out[0][0, -1].argmax())


def test_the_demo_build_is_deterministic() -> None:
    first, tokenizer_a = demo_weights()
    second, tokenizer_b = demo_weights()
    assert tokenizer_a.to_str() == tokenizer_b.to_str()
    assert np.array_equal(first.lm_head, second.lm_head) and np.array_equal(
        first.layers[0].w_down, second.layers[0].w_down
    )
    assert tokenizer_a.token_to_id(EOS_TOKEN) is not None


def _config() -> ModelConfig:
    return ModelConfig.model_validate({"kind": "llm", "intra_op_threads": 1, "llm": {"max_num_seqs": 4}})


@pytest.mark.parametrize(("layers", "heads", "kv_heads"), [(1, 4, 4), (3, 8, 2)])
async def test_optimum_layouts_of_other_sizes_load_and_generate(
    tmp_path: Path, layers: int, heads: int, kv_heads: int
) -> None:
    shape = small_shape(layers, heads, kv_heads)
    write_random_llm(tmp_path / "1", shape)
    served = await load_llm_version(
        "m", 1, tmp_path / "1" / "model.onnx", _config(), ServerSettings(model_repository=tmp_path)
    )
    try:
        assert served.engine.decoder.layout.layers == layers
        stream = served.generate(
            served.tokenizer.encode("the quick"), sampling_from({"max_tokens": 5, "ignore_eos": True}, 8)
        )
        result = await stream.collect()
        assert len(result.token_ids) == 5 and result.finish_reason == "length"
    finally:
        await served.unload(1.0)


async def _refusal(folder: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        await load_llm_version(
            "m", 1, folder / "model.onnx", _config(), ServerSettings(model_repository=folder)
        )
    return caught.value.message


async def test_a_graph_without_past_key_values_is_refused_with_the_reason(tmp_path: Path) -> None:
    write_random_llm(tmp_path, small_shape())
    onnx.save(build_mlp([8, 4], 0, "mlp"), str(tmp_path / "model.onnx"))
    assert "input 'input_ids'" in await _refusal(tmp_path)


async def test_layer_count_mismatch_and_missing_files_are_refused(tmp_path: Path) -> None:
    write_random_llm(tmp_path, small_shape(layers=2))
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    assert "2 layer(s), config.json says num_hidden_layers 3" in await _refusal(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    assert "needs tokenizer.json" in await _refusal(tmp_path)


async def test_kv_heads_that_disagree_with_config_are_refused(tmp_path: Path) -> None:
    write_random_llm(tmp_path, small_shape(heads=4, kv_heads=2))
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 4}))
    assert "expected [batch, 4, past, 16]" in await _refusal(tmp_path)


@pytest.mark.parametrize("max_itl_ms", [0.0, 250.0])
async def test_the_itl_target_is_exported_configured_or_measured(tmp_path: Path, max_itl_ms: float) -> None:
    write_random_llm(tmp_path / "1", small_shape(1, 4, 4))
    config = ModelConfig.model_validate(
        {"kind": "llm", "intra_op_threads": 1, "llm": {"max_num_seqs": 4, "max_itl_ms": max_itl_ms}}
    )
    served = await load_llm_version(
        "m", 1, tmp_path / "1" / "model.onnx", config, ServerSettings(model_repository=tmp_path)
    )
    try:
        families = {f.name: f for f in LlmCollector(lambda: [("m", "1", served)]).collect()}
        (sample,) = families["ortserve_llm_itl_target_seconds"].samples
        assert sample.labels == {"model": "m", "version": "1"}
        assert sample.value == served.engine.itl_target_s() > 0  # from the steps measured at load
        if max_itl_ms:
            assert sample.value == pytest.approx(0.25)
        # The engine's own view of the streams' gaps, and its guard (issue 35).
        served.engine.guard.observe(2.0 * sample.value, served.engine.itl_target_s())
        families = {f.name: f for f in LlmCollector(lambda: [("m", "1", served)]).collect()}
        (past,) = [
            s
            for s in families["ortserve_llm_engine_itl_gaps_over_target"].samples
            if s.name.endswith("_total")
        ]
        assert past.value == 1.0
        (scale,) = families["ortserve_llm_itl_guard_scale"].samples
        assert scale.value == served.engine.guard.scale < 1.0
    finally:
        await served.unload(1.0)
