"""The step graph (decode rows and one prompt chunk as one run): built only for decoders
ortserve wrote, from the weights taken back out of their graph, and used only once a run of
it agrees with the plain graph's two runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from ortserve.config.model import ModelConfig
from ortserve.llm.demo import train_tokenizer, write_llm_version
from ortserve.llm.fusion import agrees, fused_graph_for, recover_weights, step_session
from ortserve.llm.gqa_graph import build_gqa_decoder
from ortserve.llm.graph import build_decoder
from ortserve.llm.kv_backend import DecoderSession, StepFeeds
from ortserve.llm.layout import check_graph, read_llm_files
from ortserve.llm.loader import load_llm_version
from ortserve.llm.quantize import quantize_llm_folder
from ortserve.llm.weights import DecoderShape, DecoderWeights, random_weights
from ortserve.settings import ServerSettings

_SHAPE = DecoderShape(96, 64, 2, 4, 2, 96, 10000.0, 1e-5, 256)
_CONFIG = {"rope_theta": 10000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 256}


def _session(graph: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


def _decoder(folder: Path) -> DecoderSession:
    session = _session((folder / "model.onnx").read_bytes())

    def signature(args: list[ort.NodeArg]) -> dict[str, tuple[str, list[object]]]:
        return {a.name: (a.type, list(a.shape)) for a in args}

    layout = check_graph(
        read_llm_files(folder), signature(session.get_inputs()), signature(session.get_outputs())
    )
    return DecoderSession(session, layout)


def _folder(root: Path, seed: int = 3, layout: str = "genai") -> Path:
    tokenizer = train_tokenizer(["the quick brown fox jumps over the lazy dog " * 4], 96)
    shape = DecoderShape(tokenizer.get_vocab_size(), 64, 2, 4, 2, 96, 10000.0, 1e-5, 256)
    folder = root / f"{layout}-{seed}" / "1"
    write_llm_version(folder, random_weights(shape, seed=seed), tokenizer, layout=layout)
    return folder


def _same(a: DecoderWeights, b: DecoderWeights) -> bool:
    pairs = [(a.embed, b.embed), (a.final_norm, b.final_norm), (a.lm_head, b.lm_head)]
    for mine, theirs in zip(a.layers, b.layers, strict=True):
        pairs += [(getattr(mine, f), getattr(theirs, f)) for f in mine.__slots__]
    return a.shape == b.shape and all(np.array_equal(x, y) for x, y in pairs)


def test_the_weights_come_back_out_of_a_graph_ortserve_wrote() -> None:
    weights = random_weights(_SHAPE, seed=1)
    recovered = recover_weights(build_gqa_decoder(weights), _CONFIG)
    assert recovered is not None and _same(recovered, weights)


def test_other_graphs_are_not_recognised(tmp_path: Path) -> None:
    weights = random_weights(_SHAPE, seed=1)
    assert recover_weights(build_decoder(weights), _CONFIG) is None  # no GroupQueryAttention
    foreign = build_gqa_decoder(weights)
    foreign.producer_name = "someone else"
    assert recover_weights(foreign, _CONFIG) is None
    source = _folder(tmp_path)
    quantize_llm_folder(source, tmp_path / "int8" / "1", 8, 32)
    assert fused_graph_for((tmp_path / "int8" / "1" / "model.onnx").read_bytes(), _CONFIG) is None
    assert fused_graph_for(b"not a graph", _CONFIG) is None


def test_a_step_graph_that_computes_something_else_is_refused(tmp_path: Path) -> None:
    decoder = _decoder(_folder(tmp_path, seed=3))
    ours = (_folder(tmp_path, seed=3) / "model.onnx").read_bytes()
    other = (_folder(tmp_path, seed=4) / "model.onnx").read_bytes()
    fused = step_session(decoder, ours, _CONFIG, _session)
    assert fused is not None
    wrong = fused_graph_for(other, _CONFIG)
    assert wrong is not None and not agrees(decoder, _session(wrong))
    assert step_session(decoder, other, _CONFIG, _session) is None


def test_a_fused_run_without_decode_rows_is_refused_not_run(tmp_path: Path) -> None:
    """ONNX Runtime's attention ends the process on an empty batch: never hand it one."""
    folder = _folder(tmp_path)
    decoder = _decoder(folder)
    decoder.fused = step_session(decoder, (folder / "model.onnx").read_bytes(), _CONFIG, _session)
    layout = decoder.layout
    parts = [np.zeros((1, layout.kv_heads, 32, layout.head_dim), np.float32) for _ in decoder.past_names]
    chunk = StepFeeds(np.ones((1, 4), np.int64), np.arange(4)[None], [4], parts)
    nobody = StepFeeds(np.ones((0, 1), np.int64), np.ones((0, 1), np.int64), [], [p[:0] for p in parts])
    with pytest.raises(ValueError, match="decode rows"):
        decoder.run_fused(nobody, chunk)
    empty = StepFeeds(np.ones((1, 0), np.int64), np.ones((1, 0), np.int64), [1], parts)
    with pytest.raises(ValueError, match="chunk"):
        decoder.run_fused(chunk, empty)


@pytest.mark.parametrize("fuse", [True, False])
async def test_the_loader_builds_the_step_graph_unless_told_not_to(tmp_path: Path, fuse: bool) -> None:
    folder = _folder(tmp_path)
    config = ModelConfig.model_validate({"kind": "llm", "intra_op_threads": 1, "llm": {"fuse_steps": fuse}})
    settings = ServerSettings(model_repository=folder.parent.parent)
    served = await load_llm_version("m", 1, folder / "model.onnx", config, settings)
    try:
        assert (served.engine.decoder.fused is not None) == fuse
        onnx.checker.check_model(
            onnx.load_from_string(fused_graph_for((folder / "model.onnx").read_bytes(), _CONFIG) or b"")
        )
    finally:
        await served.unload(1.0)
