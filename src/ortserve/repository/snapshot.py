"""One observation of the repository's files: what each model and version folder holds now.

A fingerprint is the sorted (relative path, size, mtime) of every file in a folder. A version
folder is complete when the copier says so: it writes the marker file :data:`COMPLETE_MARKER`
into the folder last (a marker older than some other file there does not count). Two equal
fingerprints one observation apart (nobody is writing now) are only a weaker sign, used when
``--no-require-complete-marker`` is given: a writer that preallocates the final size and
stalls mid-copy looks settled (see :mod:`ortserve.repository.watcher`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ortserve.errors import RepositoryError
from ortserve.repository.layout import MODEL_FILE, model_folders, version_folders

__all__ = [
    "COMPLETE_MARKER",
    "CONFIG_FILES",
    "Fingerprint",
    "ModelSnapshot",
    "VersionSnapshot",
    "fingerprint",
    "snapshot_model",
    "snapshot_repository",
]

COMPLETE_MARKER = "ortserve.complete"
"""Written last into a version folder by a copier: the folder is complete, load it now."""
CONFIG_FILES = ("config.yaml", "config.pbtxt")
MAX_FILES = 10_000
"""Files looked at per folder: a folder with more is refused rather than walked forever."""

Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(folder: Path, skip: frozenset[str] = frozenset({COMPLETE_MARKER})) -> Fingerprint:
    """(relative path, size, mtime_ns) of every file under ``folder``, sorted.

    Raises:
        RepositoryError: more than :data:`MAX_FILES` files.
    """
    found: list[tuple[str, int, int]] = []
    for current, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(current) / name
            relative = path.relative_to(folder).as_posix()
            if relative in skip:
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:  # removed while we looked: the next observation differs
                continue
            found.append((relative, stat.st_size, stat.st_mtime_ns))
            if len(found) > MAX_FILES:
                raise RepositoryError(f"{folder}: more than {MAX_FILES} files")
    return tuple(sorted(found))


@dataclass(frozen=True, slots=True)
class VersionSnapshot:
    """One version folder as observed."""

    folder: Path
    files: Fingerprint
    marked: bool
    """The copier wrote :data:`COMPLETE_MARKER`, after every other file."""

    def holds(self, name: str) -> bool:
        return any(relative == name for relative, _, _ in self.files)


@dataclass(frozen=True, slots=True)
class ModelSnapshot:
    """A model folder as observed: its config files and its numbered version folders."""

    name: str
    folder: Path
    config: Fingerprint
    versions: dict[int, VersionSnapshot] = field(default_factory=dict)

    def model_file(self, number: int, filename: str = MODEL_FILE) -> Path:
        return self.versions[number].folder / filename


def snapshot_model(folder: Path) -> ModelSnapshot:
    """Observe one model folder (a version folder without files is still listed)."""
    config = tuple(
        (name, stat.st_size, stat.st_mtime_ns)
        for name in CONFIG_FILES
        if (stat := _stat(folder / name)) is not None
    )
    versions = {}
    for number, path in version_folders(folder).items():
        files = fingerprint(path)
        versions[number] = VersionSnapshot(path, files, _marked(path, files))
    return ModelSnapshot(folder.name, folder, config, versions)


def _marked(folder: Path, files: Fingerprint) -> bool:
    """The marker is there and no other file changed after it was written: a marker left from
    an earlier copy does not vouch for files rewritten since (an in-place update re-touches it)."""
    marker = _stat(folder / COMPLETE_MARKER)
    return marker is not None and all(mtime <= marker.st_mtime_ns for _, _, mtime in files)


def snapshot_repository(root: Path) -> list[ModelSnapshot]:
    """Observe every model folder under ``root``.

    Raises:
        RepositoryError: ``root`` is not a readable folder.
    """
    return [snapshot_model(folder) for folder in model_folders(root)]


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
