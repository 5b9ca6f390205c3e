"""Calibration inputs: real requests as feeds (one mapping of input name to array per request).

From an ``.npz`` (arrays keyed by input name, one request per row, or per first-axis slice),
from a capture directory of the server's own traffic (OIP infer requests to the model decoded
as the server decodes them; pipeline requests run through the pipeline's ``parse`` and
``preprocess`` to the feeds they send the model), or generated (random normal, for float
inputs only, when nothing is given).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import orjson

from ortserve.capture_records import CapturedRequest, read_capture
from ortserve.errors import InvalidInput, OrtServeError
from ortserve.pipeline.contract import ModelCall, Pipeline, PipelineContext
from ortserve.pipeline.runtime import pipeline_model_name
from ortserve.pipeline.spec import import_pipeline
from ortserve.protocol.http_codec import decode_infer_request
from ortserve.protocol.tensors import TensorLimits

__all__ = ["Feeds", "captured_feeds", "generated_feeds", "npz_feeds"]

Feeds = dict[str, npt.NDArray[np.generic]]
_LIMITS = TensorLimits(1 << 26, 64, 1 << 26)


def npz_feeds(path: Path, inputs: Sequence[str], limit: int) -> list[Feeds]:
    """One request per first-axis row of the arrays (each keeps a batch dimension of 1).

    Raises:
        InvalidInput: an input is missing, or the arrays disagree on the count.
    """
    with np.load(path, allow_pickle=False) as archive:
        missing = [name for name in inputs if name not in archive.files]
        if missing:
            raise InvalidInput(f"{path}: no array for input(s) {missing}; it holds {archive.files}")
        arrays = {name: archive[name] for name in inputs}
    counts = {array.shape[0] for array in arrays.values()}
    if len(counts) != 1:
        raise InvalidInput(f"{path}: the arrays have different first dimensions {sorted(counts)}")
    count = min(counts.pop(), limit)
    return [{name: array[i : i + 1] for name, array in arrays.items()} for i in range(count)]


def captured_feeds(
    directory: Path, model: str, version_dir: Path, pipeline: str | None, limit: int
) -> list[Feeds]:
    """The feeds of captured requests to ``model`` (OIP) or to its pipeline's routes.

    Raises:
        InvalidInput: the capture holds no usable request for the model.
    """
    feeds: list[Feeds] = []
    prepare = _pipeline_preparer(model, version_dir, pipeline) if pipeline is not None else None
    for record in read_capture([directory]):
        if len(feeds) >= limit:
            break
        feeds.extend(_record_feeds(record, model, prepare))
    if not feeds:
        raise InvalidInput(f"{directory}: no captured request to model {model!r} (or its pipeline) decodes")
    return feeds[:limit]


def _record_feeds(record: CapturedRequest, model: str, prepare: _Preparer | None) -> Iterator[Feeds]:
    if record.status not in (0, 200):
        return
    if record.model == model and record.path.endswith("/infer"):
        headers = dict(record.headers)
        raw = headers.get("inference-header-content-length")
        try:
            request = decode_infer_request(record.body, int(raw) if raw else None, model, None, _LIMITS)
        except (OrtServeError, ValueError):
            return
        yield {tensor.name: tensor.data for tensor in request.inputs}
    elif prepare is not None and record.model == pipeline_model_name(model):
        yield from prepare.feeds(record.body)


class _Preparer:
    """Runs a pipeline's parse and preprocess on captured bodies (its model calls' feeds)."""

    def __init__(self, model: str, pipeline: Pipeline[Any]) -> None:
        self.model = model
        self.pipeline = pipeline

    def feeds(self, body: bytes) -> Iterator[Feeds]:
        try:
            request = self.pipeline.parse(orjson.loads(body))
            prepared = self.pipeline.preprocess(request)
            calls = asyncio.run(_awaited(prepared)) if inspect.isawaitable(prepared) else prepared
        except (OrtServeError, orjson.JSONDecodeError):
            return
        for call in calls:
            if call.model == self.model and call.inputs:
                yield {name: np.asarray(array) for name, array in call.inputs.items()}


async def _awaited(calls: Awaitable[Sequence[ModelCall]]) -> Sequence[ModelCall]:
    return await calls


def _pipeline_preparer(model: str, version_dir: Path, spec: str) -> _Preparer:
    factory = import_pipeline(spec)
    return _Preparer(model, factory(PipelineContext(model, version_dir.name, version_dir)))


def generated_feeds(session: ort.InferenceSession, count: int, rows: int, seed: int = 0) -> list[Feeds]:
    """Random normal feeds for a model whose inputs are all float (dynamic dims: ``rows`` for
    the first, 1 for the others).

    Raises:
        InvalidInput: an input is not float (give real inputs with --calibration).
    """
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(count):
        feed: Feeds = {}
        for spec in session.get_inputs():
            if spec.type not in ("tensor(float)", "tensor(float16)", "tensor(double)"):
                raise InvalidInput(f"input {spec.name!r} is {spec.type}: give real inputs with --calibration")
            shape = [
                d if isinstance(d, int) and d > 0 else (rows if i == 0 else 1)
                for i, d in enumerate(spec.shape)
            ]
            dtype = np.float16 if spec.type == "tensor(float16)" else np.float32
            feed[spec.name] = rng.standard_normal(shape).astype(dtype)
        feeds.append(feed)
    return feeds
