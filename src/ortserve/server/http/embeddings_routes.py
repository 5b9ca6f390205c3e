"""OpenAI's ``POST /v1/embeddings`` for ONNX encoder models: a model folder whose version holds
``tokenizer.json`` beside ``model.onnx`` (a sentence-transformers export). Each input is
tokenized, padded to a power-of-two length and sent as its own one-row request, so the
dynamic batcher batches inputs of the same padded length from every client together; the
token states are pooled (mean over the attention mask, or the CLS token, as
``1_Pooling/config.json`` says; mean by default) and L2-normalised (unless the folder is a
sentence-transformers export without a ``2_Normalize`` module).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import orjson

from ortserve.core.model import ServedVersion
from ortserve.core.types import InferInput, InferRequest
from ortserve.errors import InvalidField, InvalidInput, ModelNotFound
from ortserve.llm.tokenizer import TextTokenizer
from ortserve.repository.registry import ModelRegistry
from ortserve.server.exchange import Exchange
from ortserve.server.http.answers import begun
from ortserve.server.http.app import HttpApp, Operation
from ortserve.server.http.errors import OPENAI
from ortserve.server.http.messages import HttpRequest, HttpResponse, json_response

__all__ = ["add_embeddings_route"]

logger = logging.getLogger(__name__)

_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})
_MAX_INPUTS = 256
_MAX_TOKENS = 512
_DTYPES = {"INT64": np.int64, "INT32": np.int32}


@dataclass(frozen=True, slots=True)
class _Encoder:
    tokenizer: TextTokenizer
    cls_pooling: bool
    normalize: bool


def _pooling(folder: Path) -> tuple[bool, bool]:
    """(CLS pooling, normalise) from a sentence-transformers layout; mean and normalised otherwise."""
    config = folder / "1_Pooling" / "config.json"
    cls = False
    if config.is_file():
        settings = json.loads(config.read_text(encoding="utf-8"))
        cls = bool(settings.get("pooling_mode_cls_token")) and not settings.get("pooling_mode_mean_tokens")
    sentence_transformers = (folder / "modules.json").is_file()
    return cls, (folder / "2_Normalize").exists() or not sentence_transformers


def _inputs(value: object, tokenizer: TextTokenizer) -> list[list[int]]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or len(value) > _MAX_INPUTS:
        raise InvalidField(
            "input", f"input must be a string, or a list of 1 to {_MAX_INPUTS} strings or token lists"
        )
    if all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        value = [value]
    texts: list[list[int]] = []
    for index, item in enumerate(value):
        if isinstance(item, str):
            tokens = tokenizer.encode(item)
        elif isinstance(item, list) and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < tokenizer.vocab_size for t in item
        ):
            tokens = list(item)
        else:
            raise InvalidField(
                "input", f"input[{index}] must be a string or token ids in [0, {tokenizer.vocab_size})"
            )
        if not tokens or len(tokens) > _MAX_TOKENS:
            raise InvalidField(
                "input", f"input[{index}] has {len(tokens)} tokens; 1 to {_MAX_TOKENS} are accepted"
            )
        texts.append(tokens)
    return texts


def _padded(tokens: list[int]) -> int:
    return max(8, 1 << (len(tokens) - 1).bit_length())


class _EmbeddingsRoute:
    def __init__(self, registry: ModelRegistry, exchange: Exchange, repository: Path) -> None:
        self._registry = registry
        self._exchange = exchange
        self._repository = repository
        self._encoders: dict[tuple[str, str], _Encoder] = {}

    def _encoder(self, served: ServedVersion) -> _Encoder:
        key = (served.info.name, served.info.version)
        encoder = self._encoders.get(key)
        if encoder is None:
            folder = self._repository / served.info.name / served.info.version
            if not (folder / "tokenizer.json").is_file():
                raise ModelNotFound(
                    f"model {served.info.name!r} is not an embedding model (no tokenizer.json)"
                )
            cls, normalize = _pooling(folder)
            if len(self._encoders) > 64:  # versions come and go: keep the map bounded
                self._encoders.clear()
            encoder = self._encoders[key] = _Encoder(TextTokenizer(folder, {}), cls, normalize)
        return encoder

    async def _embed(
        self, served: ServedVersion, encoder: _Encoder, tokens: list[int]
    ) -> npt.NDArray[np.float32]:
        length = _padded(tokens)
        ids = np.zeros((1, length), dtype=np.int64)
        ids[0, : len(tokens)] = tokens
        mask = (np.arange(length) < len(tokens)).astype(np.int64)[None]
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        inputs = []
        for spec in served.info.inputs:
            if spec.name not in feeds or spec.datatype not in _DTYPES:
                raise InvalidInput(f"model {served.info.name!r} is not an encoder (input {spec.name!r})")
            data = feeds[spec.name].astype(_DTYPES[spec.datatype])
            inputs.append(InferInput(spec.name, spec.datatype, data.shape, data))
        answer = await served.submit(InferRequest(served.info.name, inputs, served.info.version))
        states = np.asarray(answer.outputs[0].data, dtype=np.float32)
        if states.ndim == 2:  # already pooled by the graph
            vector = states[0]
        elif encoder.cls_pooling:
            vector = states[0, 0]
        else:
            vector = (states[0] * mask[0, :, None]).sum(axis=0) / mask.sum()
        if encoder.normalize:
            vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
        result: npt.NDArray[np.float32] = vector.astype(np.float32)
        return result

    async def embeddings(self, request: HttpRequest) -> HttpResponse:
        """Decode, embed, encode; counted under the model at the Exchange (the app finishes the
        request's scope with the answer or the error)."""
        scope = begun(self._exchange, request, "", None, OPENAI)
        try:
            fields = orjson.loads(request.body)
        except orjson.JSONDecodeError as exc:
            raise InvalidInput(f"the body is not JSON: {exc}") from exc
        if not isinstance(fields, dict):
            raise InvalidInput("the body must be a JSON object")
        for name in fields:
            if name not in _FIELDS:
                raise InvalidField(name, f"{name}: unknown field (accepted: {', '.join(sorted(_FIELDS))})")
        model = fields.get("model")
        if not isinstance(model, str):
            raise InvalidField("model", "model: a model name is required")
        scope.model = model
        served = self._registry.resolve(model, None)
        if not isinstance(served, ServedVersion):
            raise ModelNotFound(f"model {model!r} is not an embedding model")
        scope.version = served.info.version
        encoder = self._encoder(served)
        fmt = fields.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise InvalidField("encoding_format", 'encoding_format must be "float" or "base64"')
        texts = _inputs(fields.get("input"), encoder.tokenizer)
        vectors = await asyncio.gather(*(self._embed(served, encoder, t) for t in texts))
        dimensions = fields.get("dimensions")
        if dimensions is not None and dimensions != vectors[0].size:
            raise InvalidField(
                "dimensions", f"dimensions: this model gives {vectors[0].size} (no truncation)"
            )
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(v.tobytes()).decode() if fmt == "base64" else v.tolist(),
            }
            for i, v in enumerate(vectors)
        ]
        used = sum(len(t) for t in texts)
        body = {"object": "list", "data": data, "model": model,
                "usage": {"prompt_tokens": used, "total_tokens": used}}  # fmt: skip
        return json_response(200, orjson.dumps(body))


def add_embeddings_route(app: HttpApp, registry: ModelRegistry, repository: Path) -> None:
    """Add ``POST /v1/embeddings`` for the encoder models under ``repository``."""
    operation: Operation = {
        "operationId": "openai_embeddings",
        "summary": "OpenAI embeddings (ONNX encoder models with tokenizer.json)",
        "tags": ["openai"],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}},
        "responses": {
            "200": {"description": "the embeddings"},
            "400": {"description": "invalid request, OpenAI's error shape"},
            "404": {"description": "unknown model, or not an embedding model"},
        },
    }
    app.add_route(
        "POST", "/v1/embeddings", _EmbeddingsRoute(registry, app.exchange, repository).embeddings, operation
    )
