"""Building one version from its files: the signature check, then its kind's loader.

This module exists so that :mod:`ortserve.repository.manager` keeps only the bookkeeping of what
serves (per-model locks, remembered failures, publish, drains). The steps that turn one version
folder into a warmed-up :class:`~ortserve.core.model.Servable` read none of that state and are
kept here: the signature check with ``--trusted-keys``, then the loader of the config's
``kind:`` (ONNX when it has none). The caller publishes the result.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path

from ortserve.core.model import Servable
from ortserve.core.observer import SchedulerObserver
from ortserve.repository.config_source import ModelSource
from ortserve.repository.kinds import ModelKinds
from ortserve.repository.loader import LoadInputs, load_version
from ortserve.repository.signature import TrustedKeys, VerifiedVersion, verify_and_read
from ortserve.repository.snapshot import ModelSnapshot
from ortserve.settings import ServerSettings

__all__ = ["build_version"]

logger = logging.getLogger(__name__)


async def build_version(
    snapshot: ModelSnapshot,
    number: int,
    source: ModelSource,
    kinds: ModelKinds,
    settings: ServerSettings,
    trusted: TrustedKeys | None,
    observer: SchedulerObserver | None,
) -> Servable:
    """Verify, build and warm up version ``number`` of ``snapshot`` (not published).

    Args:
        source: the model's configuration (the files' or a load request's).
        kinds: the loader of each model kind beyond ONNX.
        trusted: the keys the version must be signed with (None: signatures are not checked).
        observer: receives an ONNX version's batch records (metrics, statistics, tracing).

    Raises:
        OrtServeError: the files, the signature or the configuration refused the version; any
            other exception is ONNX Runtime's own load error.
    """
    name, config = snapshot.name, source.config
    model_file = snapshot.model_file(number, config.default_model_filename)
    loader = kinds.loaders.get(config.kind)  # None: an ONNX model
    keep = 0 if loader is None else loader.keep_bytes
    folder = snapshot.versions[number].folder
    verified = await _verify(trusted, name, number, folder, model_file, keep, source.digests)
    served: Servable
    if loader is not None:  # another kind (an LLM: its own engine), by its own loader
        served = await loader.load(name, number, model_file, config, settings, verified)
    else:
        served = await load_version(
            name,
            number,
            model_file,
            config,
            settings,
            observer,
            LoadInputs(
                source.reshapes(),
                source.where,
                verified.model_bytes,
                source.optional_inputs(),
                verified.files,
                {t.name: t.label_filename for t in source.outputs if t.label_filename},
            ),
        )
    return served


async def _verify(
    trusted: TrustedKeys | None,
    name: str,
    number: int,
    folder: Path,
    model_file: Path,
    keep_below: int = 0,
    config: Mapping[str, str] | None = None,
) -> VerifiedVersion:
    """Check the signature (with ``--trusted-keys``), keeping the model file's bytes as hashed.

    Raises:
        SignatureError: see :func:`verify_and_read`.
    """
    if trusted is None:
        return VerifiedVersion(False)
    relative = model_file.relative_to(folder).as_posix()
    verified = await asyncio.to_thread(verify_and_read, folder, trusted, relative, keep_below, config)
    logger.info(
        "model %s version %d: %s", name, number, "signature verified" if verified.signed else "unsigned"
    )
    return verified
