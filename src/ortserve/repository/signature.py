"""Signed model versions: an Ed25519 signature over the SHA-256 of every file in a version folder,
and over where the folder belongs (model, version, the model's config file, the key's purpose:
:mod:`ortserve.repository.signed_scope`).

``ortserve sign`` writes :data:`SIGNATURE_FILE` into the version folder: a JSON document with
the manifest (relative path -> SHA-256, every file but the signature and the completion
marker) and an Ed25519 signature over the manifest's canonical bytes. At every load the
manifest is read once, its signature checked against the trusted public keys, and every file
of the folder hashed and compared in constant time: a changed byte, a missing file or an extra
file refuses the version, naming the file. With ``--require-signed`` an unsigned version is
refused too. Nothing checked is read twice: the model file and every external-data file its graph
names are hashed from the bytes read into memory, and the session is built from exactly those
bytes (:class:`VerifiedVersion.files`, see :mod:`ortserve.core.model_files`), so a file swapped
by ``rename()`` or rewritten in place after the check is never what serves. Small files a
loader reads itself (an LLM's tokenizer and config) can be kept the same way (``keep_below``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from ortserve.core.model_files import ModelFiles, external_locations, relative_location
from ortserve.errors import OrtServeError, RepositoryError
from ortserve.repository.signed_scope import (
    Scope,
    canonical,
    read_scope,
    scope_document,
    scope_mismatch,
    scope_of,
)
from ortserve.repository.snapshot import COMPLETE_MARKER, MAX_FILES

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "SIGNATURE_FILE",
    "SignatureError",
    "TrustedKeys",
    "VerifiedVersion",
    "generate_key",
    "load_trusted_keys",
    "sign_version",
    "verify_and_read",
    "verify_version",
]

logger = logging.getLogger(__name__)

SIGNATURE_FILE = "ortserve.sig"
_SKIPPED = frozenset({SIGNATURE_FILE, COMPLETE_MARKER})
_CHUNK = 1 << 20
_MAX_SIGNATURE_BYTES = 4 << 20


class SignatureError(RepositoryError):
    """A version is unsigned (when signatures are required), or does not match its signature."""


@dataclass(frozen=True, slots=True)
class TrustedKeys:
    """The public keys a signature may be made with, and whether one is required."""

    keys: tuple[Ed25519PublicKey, ...]
    required: bool
    min_version: int = 0
    """``--min-signed-version``: a signed version numbered lower is refused (rollback), and so is
    an old manifest that does not sign its version."""


@dataclass(frozen=True, slots=True)
class VerifiedVersion:
    """What :func:`verify_and_read` found: whether the folder was signed, and what was read to
    hash it (nothing when unsigned: the loader reads the files itself)."""

    signed: bool
    files: ModelFiles | None = None
    """The model file and its external data, as hashed."""
    kept: dict[str, bytes] = field(default_factory=dict)
    """Other files (folder-relative path -> bytes as hashed) at most ``keep_below`` long."""

    @property
    def model_bytes(self) -> bytes | None:
        return None if self.files is None else self.files.graph


def generate_key(path: Path) -> Path:
    """Write a new Ed25519 private key (PEM, mode 0600) to ``path`` and its public key to
    ``path.pub``; returns the public key's path."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(pem)
    public_path = path.with_name(path.name + ".pub")
    public_path.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return public_path


def sign_version(folder: Path, key_path: Path) -> Path:
    """Hash every file of ``folder``, sign the manifest with its scope (model, version, the
    model folder's config file, purpose: see ``signed_scope.py``), write :data:`SIGNATURE_FILE`.

    Raises:
        SignatureError: the key is not an Ed25519 private key, the folder is not a numbered
            version folder, holds a symlinked folder, or is not readable.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        private = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise SignatureError(f"{key_path}: not a readable private key: {exc}") from exc
    if not isinstance(private, Ed25519PrivateKey):
        raise SignatureError(f"{key_path}: not an Ed25519 private key")
    try:
        scope = scope_of(folder)
    except ValueError as exc:
        raise SignatureError(f"{folder}: {exc}") from None
    manifest = {name: _sha256(folder / name) for name in _files(folder)}
    signature = private.sign(canonical(manifest, scope))
    document = {
        **scope_document(scope),
        "manifest": manifest,
        "signature": base64.b64encode(signature).decode(),
    }
    target = folder / SIGNATURE_FILE
    target.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    return target


def load_trusted_keys(path: Path, required: bool, min_version: int = 0) -> TrustedKeys:
    """Every ``.pub`` file at ``path`` (a file, or a folder of them).

    Raises:
        SignatureError: no key found, or a file that is not an Ed25519 public key.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    files = sorted(path.glob("*.pub")) if path.is_dir() else [path]
    keys = []
    for file in files:
        try:
            key = serialization.load_pem_public_key(file.read_bytes())
        except (OSError, ValueError) as exc:
            raise SignatureError(f"{file}: not a readable public key: {exc}") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise SignatureError(f"{file}: not an Ed25519 public key")
        keys.append(key)
    if not keys:
        raise SignatureError(f"{path}: no .pub file with a trusted key")
    return TrustedKeys(tuple(keys), required, min_version)


def verify_version(folder: Path, trusted: TrustedKeys) -> bool:
    """Check ``folder`` against its signature; returns whether it was signed.

    Raises:
        SignatureError: as :func:`verify_and_read`.
    """
    return verify_and_read(folder, trusted, None).signed


def verify_and_read(
    folder: Path,
    trusted: TrustedKeys,
    model_file: str | None,
    keep_below: int = 0,
    config: Mapping[str, str] | None = None,
) -> VerifiedVersion:
    """Check ``folder`` against its signature, keeping the bytes of ``model_file`` (a name in
    the folder) and of every external-data file its graph names as they were hashed, for the
    session to be built from; also every other file of at most ``keep_below`` bytes.

    Args:
        config: the digests of the model's configuration as parsed (None: the files now).

    Raises:
        SignatureError: unsigned while required, a signature no trusted key made, signed for
            another model, version, configuration or purpose, below ``min_version``, or a file
            missing, extra or different from the manifest (named in the message), or a graph
            naming external data the manifest does not list.
    """
    signature_path = folder / SIGNATURE_FILE
    if not signature_path.is_file():
        if trusted.required:
            raise SignatureError(f"{folder}: unsigned ({SIGNATURE_FILE} missing) and --require-signed is set")
        return VerifiedVersion(False)
    manifest, signature, scope = _read_signature(signature_path)
    signed_bytes = canonical(manifest, scope)
    if not any(_verifies(key, signature, signed_bytes) for key in trusted.keys):
        raise SignatureError(f"{signature_path}: the signature was not made by a trusted key")
    _check_scope(folder, scope, trusted, config)
    present = set(_files(folder))
    missing, extra = sorted(set(manifest) - present), sorted(present - set(manifest))
    if missing:
        raise SignatureError(f"{folder / missing[0]}: listed in the signed manifest but missing")
    if extra:
        raise SignatureError(f"{folder / extra[0]}: not in the signed manifest")
    graph: bytes | None = None
    locations: dict[str, str] = {}
    if model_file is not None and model_file in manifest:
        graph = _read(folder / model_file)
        _check(folder, model_file, hashlib.sha256(graph).hexdigest(), manifest)
        locations = _locations(folder, model_file, graph, manifest)
    kept: dict[str, bytes] = {}
    for name in sorted(manifest):
        if name == model_file:
            continue
        path = folder / name
        if name in locations.values() or _size(path) <= keep_below:
            kept[name] = _read(path)
            digest = hashlib.sha256(kept[name]).hexdigest()
        else:
            digest = _sha256(path)
        _check(folder, name, digest, manifest)
    if graph is None:
        return VerifiedVersion(True, None, kept)
    external = {location: kept[name] for location, name in locations.items()}
    return VerifiedVersion(True, ModelFiles(graph, external), kept)


def _check_scope(
    folder: Path, signed: Scope | None, trusted: TrustedKeys, config: Mapping[str, str] | None
) -> None:
    """Raises: SignatureError: the signature does not name this model, version, config."""
    if signed is None:
        if trusted.min_version:
            raise SignatureError(
                f"{folder}: an old signature that names no version, refused with "
                "--min-signed-version; re-sign it with `ortserve sign`"
            )
        logger.warning(
            "%s: signed with an old manifest that names no model, version or config (deprecated: "
            "it would verify in any folder); re-sign it with `ortserve sign`",
            folder,
        )
        return
    try:
        actual = scope_of(folder, config)
    except ValueError as exc:
        raise SignatureError(f"{folder}: {exc}") from None
    problem = scope_mismatch(signed, actual, trusted.min_version)
    if problem is not None:
        raise SignatureError(f"{folder}: {problem}")


def _check(folder: Path, name: str, digest: str, manifest: dict[str, str]) -> None:
    if not hmac.compare_digest(digest, manifest[name]):
        raise SignatureError(f"{folder / name}: its SHA-256 does not match the signed manifest")


def _locations(folder: Path, model_file: str, graph: bytes, manifest: dict[str, str]) -> dict[str, str]:
    """The graph's external-data locations -> the manifest names they read.

    Raises:
        SignatureError: a location outside the folder or not in the manifest (it would be
            read from the folder, unchecked).
    """
    base = Path(model_file).parent
    found: dict[str, str] = {}
    try:
        for location in external_locations(graph, model_file):
            found[location] = (base / relative_location(location, model_file)).as_posix()
    except OrtServeError as exc:
        raise SignatureError(f"{folder}: {exc.message}") from None
    unlisted = sorted(name for name in found.values() if name not in manifest)
    if unlisted:
        raise SignatureError(
            f"{folder / unlisted[0]}: external data of {model_file} but not in the signed manifest"
        )
    return found


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as exc:
        raise SignatureError(f"{path}: cannot read: {exc}") from exc


def _verifies(key: Ed25519PublicKey, signature: bytes, data: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(signature, data)
    except InvalidSignature:
        return False
    return True


def _read_signature(path: Path) -> tuple[dict[str, str], bytes, Scope | None]:
    try:
        raw = path.read_bytes()
        if len(raw) > _MAX_SIGNATURE_BYTES:
            raise ValueError("larger than 4 MiB")
        document = orjson.loads(raw)
        manifest = document["manifest"]
        signature = base64.b64decode(document["signature"], validate=True)
        scope = read_scope(document)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SignatureError(f"{path}: not a signature file: {exc}") from exc
    if not isinstance(manifest, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in manifest.items()
    ):
        raise SignatureError(f"{path}: the manifest must map file names to SHA-256 hex digests")
    return manifest, signature, scope


def _files(folder: Path) -> list[str]:
    """Every file under ``folder`` by relative path.

    Raises:
        SignatureError: a symlinked folder (os.walk would skip it silently, leaving what it
            holds unsigned yet readable by the loader), or too many files.
    """
    names = []
    for current, dirs, files in os.walk(folder):
        linked = [name for name in dirs if os.path.islink(os.path.join(current, name))]
        if linked:
            relative = (Path(current) / linked[0]).relative_to(folder).as_posix()
            raise SignatureError(
                f"{folder}: {relative} is a symlinked folder; copy its files in (they are signed "
                "and verified only inside the version folder)"
            )
        for name in files:
            relative = (Path(current) / name).relative_to(folder).as_posix()
            if relative not in _SKIPPED:
                names.append(relative)
            if len(names) > MAX_FILES:
                raise SignatureError(f"{folder}: more than {MAX_FILES} files")
    return sorted(names)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SignatureError(f"{path}: cannot read: {exc}") from exc


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
