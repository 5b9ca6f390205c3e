"""Reading a Triton-layout model repository: model folders and numbered version folders."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ortserve.errors import RepositoryError
from ortserve.repository.config import LatestPolicy, SpecificPolicy, VersionPolicy

__all__ = ["ModelDir", "scan_repository", "select_versions"]

MODEL_FILE = "model.onnx"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True, slots=True)
class ModelDir:
    """A model folder and the version folders in it that hold a model file."""

    name: str
    path: Path
    versions: dict[int, Path]


def scan_repository(root: Path) -> list[ModelDir]:
    """Every model folder under ``root`` (folders with invalid names are skipped, not fatal).

    Raises:
        RepositoryError: ``root`` is not a readable folder.
    """
    if not root.is_dir():
        raise RepositoryError(f"model repository {root} is not a folder")
    models = []
    for entry in sorted(root.iterdir()):
        if not entry.is_dir() or entry.name.startswith("."):
            continue
        if not _NAME.match(entry.name):
            continue
        versions = {
            int(child.name): child / MODEL_FILE
            for child in entry.iterdir()
            if child.is_dir()
            and child.name.isdigit()
            and int(child.name) > 0
            and (child / MODEL_FILE).is_file()
        }
        models.append(ModelDir(entry.name, entry, versions))
    return models


def select_versions(available: dict[int, Path], policy: VersionPolicy) -> list[int]:
    """The versions a policy serves, highest first."""
    ordered = sorted(available, reverse=True)
    if policy == "all":
        return ordered
    if policy == "latest":
        return ordered[:1]
    if isinstance(policy, LatestPolicy):
        return ordered[: policy.latest]
    if isinstance(policy, SpecificPolicy):
        return [v for v in ordered if v in set(policy.specific)]
    raise AssertionError(f"unknown version policy {policy!r}")
