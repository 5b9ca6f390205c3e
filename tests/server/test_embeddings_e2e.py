"""/v1/embeddings against a real server serving an ONNX encoder built here (token embeddings
masked by the attention mask, a sentence-transformers-like folder), through the official client:
mean and CLS pooling, normalisation, batching by the dynamic batcher, refusals by name."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
import openai
import pytest
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer

from ortserve.llm.demo import train_tokenizer
from ortserve.testing import ServerProcess, run_server

pytestmark = pytest.mark.e2e

_HIDDEN = 8


def _encoder(vocab: int, seed: int) -> tuple[onnx.ModelProto, npt.NDArray[np.float32]]:
    """last_hidden_state = table[input_ids] * attention_mask (an encoder's shape, not its maths)."""
    table = np.random.default_rng(seed).normal(0, 1, (vocab, _HIDDEN)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["states"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis"], ["mask3"]),
        helper.make_node("Mul", ["states", "mask3"], ["last_hidden_state"]),
    ]
    graph = helper.make_graph(
        nodes,
        "encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "length"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "length"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "length", _HIDDEN])],
        [
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "axis"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, table


@pytest.fixture(scope="module")
def encoders(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, Tokenizer, dict[str, npt.NDArray[np.float32]]]:
    root = tmp_path_factory.mktemp("encoders")
    tokenizer = train_tokenizer(["the quick brown fox jumps over the lazy dog " * 4], 60)
    tables = {}
    for name, seed, cls in (("mean_encoder", 1, False), ("cls_encoder", 2, True)):
        folder = root / name / "1"
        folder.mkdir(parents=True)
        model, tables[name] = _encoder(tokenizer.get_vocab_size(), seed)
        onnx.save(model, str(folder / "model.onnx"))
        tokenizer.save(str(folder / "tokenizer.json"))
        if cls:  # sentence-transformers layout: CLS pooling, normalised
            (folder / "modules.json").write_text("[]")
            (folder / "1_Pooling").mkdir()
            (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
            (folder / "2_Normalize").mkdir()
    return root, tokenizer, tables


@pytest.fixture(scope="module")
def server(
    encoders: tuple[Path, Tokenizer, dict[str, npt.NDArray[np.float32]]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("encoder_logs") / "server.log"
    with run_server(encoders[0], log, ["--intra-op-threads", "1"]) as running:
        yield running


def _reference(table: npt.NDArray[np.float32], ids: list[int], cls: bool) -> npt.NDArray[np.float32]:
    vector = table[ids[0]] if cls else table[ids].mean(axis=0)
    result: npt.NDArray[np.float32] = vector / np.linalg.norm(vector)
    return result


def test_embeddings_are_the_pooled_normalised_states(
    server: ServerProcess, encoders: tuple[Path, Tokenizer, dict[str, npt.NDArray[np.float32]]]
) -> None:
    _, tokenizer, tables = encoders
    client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="-", max_retries=0, timeout=30)
    texts = ["the quick brown fox", "lazy dog", "the fox jumps over the lazy dog again and again"]
    for name, cls in (("mean_encoder", False), ("cls_encoder", True)):
        for encoding in ("float", "base64"):
            reply = client.embeddings.create(model=name, input=texts, encoding_format=encoding)
            assert [d.index for d in reply.data] == [0, 1, 2] and reply.model == name
            for text, item in zip(texts, reply.data, strict=True):
                vector = item.embedding
                if isinstance(vector, str):
                    vector = np.frombuffer(base64.b64decode(vector), dtype=np.float32).tolist()
                expected = _reference(tables[name], tokenizer.encode(text).ids, cls)
                assert np.allclose(vector, expected, atol=1e-5)
            assert reply.usage.prompt_tokens == sum(len(tokenizer.encode(t).ids) for t in texts)


def _post(server: ServerProcess, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        f"{server.http_url}/v1/embeddings", data=json.dumps(body).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "mean_encoder", "input": "x", "truncate": 5}, "truncate"),
        ({"model": "mean_encoder", "input": []}, "input"),
        ({"model": "mean_encoder", "input": [[10**6]]}, "input"),
        ({"model": "mean_encoder", "input": "x", "dimensions": 3}, "dimensions"),
        ({"model": "mean_encoder", "input": "x", "encoding_format": "hex"}, "encoding_format"),
    ],
)
def test_bad_fields_are_refused_by_name(server: ServerProcess, body: dict[str, object], param: str) -> None:
    status, answer = _post(server, body)
    assert status == 400 and answer["error"]["param"] == param  # type: ignore[index]


def test_many_concurrent_inputs_are_batched_and_all_answered(server: ServerProcess) -> None:
    status, answer = _post(server, {"model": "mean_encoder", "input": ["the dog"] * 64})
    vectors = [d["embedding"] for d in answer["data"]]  # type: ignore[attr-defined]
    assert status == 200 and len(vectors) == 64 and all(v == vectors[0] for v in vectors)
    with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=10) as reply:
        metrics = reply.read().decode()
    series = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("ortserve_batch_rows_")
        and 'model="mean_encoder"' in line
        and "_bucket" not in line
    }
    # rows run > executions: inputs from one request went through the batcher together
    assert series["ortserve_batch_rows_sum"] > series["ortserve_batch_rows_count"] > 0
