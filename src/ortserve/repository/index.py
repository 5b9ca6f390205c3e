"""The repository index: every model of the repository and the server, each version's state."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ortserve.core.model import ModelState, Servable, ServedVersion
from ortserve.repository.layout import model_folders
from ortserve.repository.registry import IndexState, ModelRegistry

__all__ = ["IndexRow", "repository_index"]


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One line of Triton's repository index."""

    name: str
    version: str
    state: str
    reason: str


def repository_index(
    registry: ModelRegistry,
    root: Path,
    ready_only: bool,
    roles: Callable[[str], Mapping[str, str]] | None = None,
) -> list[IndexRow]:
    """Served versions, versions loading, draining or failed, and models not loaded, by name.

    ``roles`` gives a model's traffic roles (routing); a ready version's reason names its role.

    Raises:
        RepositoryError: ``root`` is not a readable folder.
    """
    rows: list[IndexRow] = []
    known = set()
    for entry in registry.entries():
        known.add(entry.name)
        named = roles(entry.name) if roles is not None else {}
        for number, record in sorted(entry.records.items()):
            if number in entry.versions:
                served = entry.versions[number]
                notes = [named.get(str(number), ""), _fallback_note(served)]
                state, reason = IndexState.READY, "; ".join(note for note in notes if note)
                if not served.ready and served.state is ModelState.READY:
                    state = IndexState.UNAVAILABLE  # no usable level, or degraded and told not to be ready
                    reason = reason or "no usable execution level"
                elif not served.ready:
                    state, reason = IndexState.UNLOADING, served.state.value
            else:
                state, reason = record.state, record.reason
            rows.append(IndexRow(entry.name, str(number), state.value, reason))
        if not entry.records:
            loading = entry.state is ModelState.LOADING
            state = IndexState.LOADING if loading else IndexState.UNAVAILABLE
            rows.append(IndexRow(entry.name, "", state.value, entry.error or entry.state.value))
    for folder in model_folders(root):
        if folder.name not in known:
            rows.append(IndexRow(folder.name, "", IndexState.UNAVAILABLE.value, "not loaded"))
    rows.sort(key=lambda row: (row.name, row.version))
    if ready_only:
        rows = [row for row in rows if row.state == IndexState.READY.value]
    return rows


def _fallback_note(served: Servable) -> str:
    """``fallback level N: reason`` while a version answers from a fallback level."""
    if not isinstance(served, ServedVersion):
        return ""
    found = served.fallback_parameters()
    level = found.get("fallback_level", 0)
    if not level:
        return ""
    return f"fallback level {level}: {found.get('fallback_reason', '')}"
