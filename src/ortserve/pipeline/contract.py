"""The plug-in contract of a pipeline: parse, preprocess, model calls, postprocess."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt

__all__ = [
    "JsonObject",
    "ModelCall",
    "ModelOutputs",
    "Pipeline",
    "PipelineContext",
]

Array = npt.NDArray[np.generic]
JsonObject = dict[str, object]
ModelOutputs = Mapping[str, Array]

T = TypeVar("T")
RequestT = TypeVar("RequestT")
MaybeAwaitable: TypeAlias = T | Awaitable[T]


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model stage: feeds for a repository model, queued on that model's scheduler.

    Rows from every request's calls to the same model batch together; calls with more rows
    than the model's ``max_batch_size`` are split into chunks and the outputs concatenated.
    """

    model: str
    inputs: Mapping[str, Array]


@dataclass(frozen=True, slots=True)
class PipelineContext:
    """What a pipeline is built from.

    Args:
        model_name: the repository model whose ``config.yaml`` names the pipeline.
        model_version: the version folder the artefacts come from.
        version_dir: that folder: ``model.onnx`` and the pipeline's artefacts live there.
    """

    model_name: str
    model_version: str
    version_dir: Path


class Pipeline(Protocol[RequestT]):
    """Python steps around one or more batched ONNX models.

    ``preprocess`` and ``postprocess`` may be plain or ``async def`` methods; the runtime
    decides once at load how to call each (see ``ortserve.pipeline.runtime``). Steps raise
    ``ortserve.errors.InvalidInput`` for a request they cannot serve.
    """

    route: str | None
    """A REST path served with POST (``/v1/predict``), or None for the OIP route only."""

    def parse(self, document: object) -> RequestT:
        """Validate a decoded JSON document strictly; InvalidInput names the offending field."""
        ...

    def preprocess(self, request: RequestT) -> MaybeAwaitable[Sequence[ModelCall]]:
        """The model calls this request needs (run concurrently)."""
        ...

    def postprocess(self, outputs: Sequence[ModelOutputs], request: RequestT) -> MaybeAwaitable[JsonObject]:
        """The JSON answer, from each model call's outputs in the order they were asked for."""
        ...

    def example(self) -> JsonObject:
        """A valid request document, run at load to warm up and to time the steps."""
        ...
