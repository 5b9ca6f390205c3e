"""What a signature is about: the model, the version, the model's config file and a purpose.

A manifest of file digests alone says nothing about where the files belong: one model's signed
files copied into another model's folder, or an older signed version copied back into place,
verified as "signature verified". A version-2 signature also signs its scope: the model name,
the version number, the SHA-256 of the model folder's ``config.yaml``/``config.pbtxt`` (which
decides batching, providers, fallback...), and the key purpose ``ortserve-model-version`` (a
signature made for something else with the same key does not verify here). At load, the scope
is taken from where the folder is and what configuration was parsed, and must match.

Manifests from before (no scope) still verify, with a deprecation warning, unless
``--min-signed-version`` is set: such a manifest cannot show its version.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CONFIG_NAMES",
    "FORMAT",
    "PURPOSE",
    "Scope",
    "canonical",
    "config_digests",
    "read_scope",
    "scope_document",
    "scope_mismatch",
    "scope_of",
]

FORMAT = 2
PURPOSE = "ortserve-model-version"
CONFIG_NAMES = ("config.yaml", "config.pbtxt")
_MAX_CONFIG_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class Scope:
    """Where a signed version belongs."""

    model: str
    version: int
    config: Mapping[str, str] = field(default_factory=dict)
    """The model folder's config file name -> SHA-256 (empty: the folder has none)."""
    purpose: str = PURPOSE


def config_digests(model_folder: Path) -> dict[str, str]:
    """SHA-256 of the model folder's config files as they are now."""
    found = {}
    for name in CONFIG_NAMES:
        path = model_folder / name
        if path.is_file():
            with path.open("rb") as handle:
                found[name] = hashlib.sha256(handle.read(_MAX_CONFIG_BYTES + 1)).hexdigest()
    return found


def scope_of(folder: Path, config: Mapping[str, str] | None = None) -> Scope:
    """The scope of the version folder ``folder`` (``<model>/<version>``).

    Args:
        config: the digests of the configuration as it was parsed (None: hash the files now).

    Raises:
        ValueError: the folder's name is not a version number.
    """
    absolute = Path(os.path.abspath(folder))
    if not absolute.name.isdigit() or int(absolute.name) < 1:
        raise ValueError(f"{absolute.name!r} is not a numbered version folder (<model>/<version>)")
    digests = config_digests(absolute.parent) if config is None else dict(config)
    return Scope(absolute.parent.name, int(absolute.name), digests)


def scope_document(scope: Scope) -> dict[str, object]:
    """The fields a version-2 signature file adds next to its manifest."""
    return {
        "format": FORMAT,
        "purpose": scope.purpose,
        "model": scope.model,
        "version": scope.version,
        "config": dict(scope.config),
    }


def read_scope(document: Mapping[str, object]) -> Scope | None:
    """The scope a signature file names (None: an old manifest without one).

    Raises:
        ValueError: a scope of another format, or with fields of the wrong type.
    """
    if "format" not in document:
        return None
    model, version, config, purpose = (document.get(k) for k in ("model", "version", "config", "purpose"))
    if document["format"] != FORMAT:
        raise ValueError(f"signature format {document['format']!r} is not {FORMAT}")
    if not isinstance(model, str) or not isinstance(purpose, str):
        raise ValueError("model and purpose must be strings")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError("version must be an integer")
    if not isinstance(config, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in config.items()
    ):
        raise ValueError("config must map config file names to SHA-256 hex digests")
    return Scope(model, version, config, purpose)


def canonical(manifest: Mapping[str, str], scope: Scope | None) -> bytes:
    """The signed bytes: the scope's lines (version 2), then one ``<sha256>  <path>`` line per
    file, sorted by path. Names cannot hold a newline (model names and file names are checked)."""
    files = "".join(f"{manifest[name]}  {name}\n" for name in sorted(manifest))
    if scope is None:
        return files.encode()
    header = [
        f"ortserve-signature {FORMAT}",
        f"purpose {scope.purpose}",
        f"model {scope.model}",
        f"version {scope.version}",
        *(f"config {digest}  {name}" for name, digest in sorted(scope.config.items())),
    ]
    return ("\n".join(header) + "\n" + files).encode()


def scope_mismatch(signed: Scope, actual: Scope, min_version: int) -> str | None:
    """Why a signed scope does not cover the folder it is in (None: it does)."""
    if signed.purpose != PURPOSE:
        return f"signed for purpose {signed.purpose!r}, not {PURPOSE!r}"
    if (signed.model, signed.version) != (actual.model, actual.version):
        return (
            f"signed as model {signed.model!r} version {signed.version}, found as model "
            f"{actual.model!r} version {actual.version} (copied from elsewhere?)"
        )
    if signed.version < min_version:
        return f"signed version {signed.version} is below --min-signed-version {min_version}"
    if dict(signed.config) != dict(actual.config):
        signed_names = ", ".join(sorted(signed.config)) or "no config file"
        return (
            f"the model's configuration is not the one signed (signed: {signed_names}); "
            "re-sign the versions after changing it"
        )
    return None
