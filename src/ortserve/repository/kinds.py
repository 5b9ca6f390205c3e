"""What the lifecycle manager knows of model kinds beyond ONNX: a loader per kind (``kind:`` in
``config.yaml``) and how a pipeline follows the model it wraps.

The manager is handed a :class:`ModelKinds` (the server passes :func:`standard_kinds`) and
imports no kind itself: a new kind is a loader added here or by the server, not an ``if`` in
the manager. Without one, a manager gets the standard kinds (tests and tools build managers
directly).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ortserve.config.model import ModelConfig
from ortserve.core.model import Servable
from ortserve.pipeline.runtime import pipeline_model_name
from ortserve.repository.pipeline_versions import Drain, Retire, follow_model
from ortserve.repository.registry import ModelRegistry
from ortserve.repository.signature import VerifiedVersion
from ortserve.settings import ServerSettings

__all__ = ["KindLoader", "ModelKinds", "PipelineKind", "standard_kinds"]


class KindLoader(Protocol):
    """Builds one version of a model kind from its checked files."""

    @property
    def keep_bytes(self) -> int:
        """Files up to this size are kept as the signature check read them (tokenizer, config)."""

    async def load(
        self,
        name: str,
        number: int,
        model_file: Path,
        config: ModelConfig,
        settings: ServerSettings,
        verified: VerifiedVersion,
    ) -> Servable: ...


class PipelineKind(Protocol):
    """How a pipeline (``pipeline:`` in a model's config) follows the model it wraps."""

    def name_of(self, model: str) -> str:
        """The pipeline's own model name."""

    async def follow(
        self,
        registry: ModelRegistry,
        name: str,
        number: int,
        folder: Path,
        spec: str,
        drain: Drain,
        retire: Retire,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class ModelKinds:
    """The kinds a lifecycle manager loads: ``loaders`` by ``kind:`` (any other kind is an ONNX
    model) and the pipelines' follower (None: ``pipeline:`` sections are not served)."""

    loaders: Mapping[str, KindLoader] = field(default_factory=dict)
    pipelines: PipelineKind | None = None


class _LlmLoader:
    """``kind: llm``: a generation engine over the decoder graph (``llm/loader.py``)."""

    @property
    def keep_bytes(self) -> int:
        from ortserve.llm.loader import SMALL_FILE_BYTES

        return SMALL_FILE_BYTES

    async def load(
        self,
        name: str,
        number: int,
        model_file: Path,
        config: ModelConfig,
        settings: ServerSettings,
        verified: VerifiedVersion,
    ) -> Servable:
        from ortserve.llm.loader import VerifiedFiles, load_llm_version

        checked = None if verified.files is None else VerifiedFiles(verified.files, verified.kept)
        return await load_llm_version(name, number, model_file, config, settings, checked)


class _Pipelines:
    """Pipelines served as ``<model>.pipeline``, following the model's newest version."""

    name_of: Callable[[str], str] = staticmethod(pipeline_model_name)

    async def follow(
        self,
        registry: ModelRegistry,
        name: str,
        number: int,
        folder: Path,
        spec: str,
        drain: Drain,
        retire: Retire,
    ) -> None:
        await follow_model(registry, name, number, folder, spec, drain, retire)


def standard_kinds() -> ModelKinds:
    """ONNX models, ``kind: llm`` and pipelines: what ``ortserve serve`` loads."""
    return ModelKinds({"llm": _LlmLoader()}, _Pipelines())
