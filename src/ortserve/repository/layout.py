"""Reading a Triton-layout model repository: model folders and numbered version folders."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ortserve.config.model import LatestPolicy, SpecificPolicy, VersionPolicy
from ortserve.config.names import is_model_name
from ortserve.errors import RepositoryError

__all__ = [
    "MODEL_FILE",
    "ModelDir",
    "is_model_name",
    "model_folders",
    "scan_repository",
    "select_versions",
    "version_folders",
]

MODEL_FILE = "model.onnx"


@dataclass(frozen=True, slots=True)
class ModelDir:
    """A model folder and the version folders in it that hold a model file."""

    name: str
    path: Path
    versions: dict[int, Path]


def model_folders(root: Path) -> list[Path]:
    """Every folder under ``root`` with a valid model name, sorted.

    Raises:
        RepositoryError: ``root`` is not a readable folder.
    """
    if not root.is_dir():
        raise RepositoryError(f"model repository {root} is not a folder")
    return [
        entry
        for entry in sorted(root.iterdir())
        if entry.is_dir() and not entry.name.startswith(".") and is_model_name(entry.name)
    ]


def version_folders(model: Path) -> dict[int, Path]:
    """The numbered (> 0) version folders of a model folder."""
    try:
        children = list(model.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return {}
    return {
        int(child.name): child
        for child in children
        if child.name.isdigit() and int(child.name) > 0 and child.is_dir()
    }


def scan_repository(root: Path) -> list[ModelDir]:
    """Every model folder under ``root`` (folders with invalid names are skipped, not fatal).

    Raises:
        RepositoryError: ``root`` is not a readable folder.
    """
    return [
        ModelDir(
            folder.name,
            folder,
            {n: p / MODEL_FILE for n, p in version_folders(folder).items() if (p / MODEL_FILE).is_file()},
        )
        for folder in model_folders(root)
    ]


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
