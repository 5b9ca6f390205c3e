"""Privacy-safe capture: listed JSON fields and headers are replaced by a keyed hash, or dropped,
before a captured request is queued for the disk.

``--capture-redact FILE`` names a YAML file::

    secret_file: /run/secrets/capture-key   # the HMAC key (at least 16 bytes)
    hash: [parameters.user_id, inputs[*].data, messages[*].content]
    drop: [parameters.address]
    hash_headers: [x-user-id]
    drop_headers: [authorization]

A hashed value becomes ``"h:<24 hex>"``, HMAC-SHA256 of its JSON text under the secret: the
same user maps to the same token in every record (sticky-key replay still routes a user to
one version) and nobody without the secret can go back from token to value, nor test a guess.
A list of scalars is hashed element by element, so an OIP ``BYTES`` tensor keeps its shape and
a replay of it stays a valid request. Paths: dotted keys, ``[*]`` for every element of a list.
A body that cannot be read as JSON (or a binary-extension body whose JSON header cannot) is
not captured at all: nothing listed may reach the disk unredacted.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import yaml

from ortserve.capture_records import CapturedRequest

__all__ = ["Redactor", "load_redactor", "parse_path"]

_PREFIX = "h:"
_MIN_SECRET_BYTES = 16
_HEADER_LENGTH = "inference-header-content-length"
Step = str | None
"""A key, or None for every element of a list."""


def parse_path(text: str) -> tuple[Step, ...]:
    """``inputs[*].data`` -> ("inputs", None, "data").

    Raises:
        ValueError: an empty path or segment, or brackets other than ``[*]``.
    """
    steps: list[Step] = []
    for segment in text.split("."):
        if not segment:
            raise ValueError(f"{text!r}: an empty segment")
        name, bracket, rest = segment.partition("[")
        if not name and not steps:
            raise ValueError(f"{text!r}: a path starts with a key")
        if name:
            steps.append(name)
        while bracket:
            if not rest.startswith("*]"):
                raise ValueError(f"{text!r}: only [*] is supported inside brackets")
            steps.append(None)
            _, bracket, rest = rest[2:].partition("[")
    if not steps:
        raise ValueError("an empty path")
    return tuple(steps)


@dataclass(frozen=True)
class Redactor:
    """Applies one policy to captured requests (``__call__``: the capture's ``redact`` hook)."""

    secret: bytes
    hashed: tuple[tuple[Step, ...], ...] = ()
    dropped: tuple[tuple[Step, ...], ...] = ()
    hash_headers: frozenset[str] = frozenset()
    drop_headers: frozenset[str] = frozenset()

    def token(self, value: object) -> str:
        text = orjson.dumps(value)
        return _PREFIX + hmac.new(self.secret, text, hashlib.sha256).hexdigest()[:24]

    def __call__(self, record: CapturedRequest) -> CapturedRequest | None:
        """The record with its listed fields replaced or removed; None: not safe to keep."""
        headers = dict(record.headers)
        body = record.body
        if self.hashed or self.dropped:
            length = headers.get(_HEADER_LENGTH)
            try:
                split = len(body) if length is None else int(length)
                document = orjson.loads(body[:split])
            except (ValueError, TypeError):
                return None
            for path in self.dropped:
                _visit(document, path, None)
            for path in self.hashed:
                _visit(document, path, self.token)
            head = orjson.dumps(document)
            body = head + body[split:]
            if length is not None:
                headers[_HEADER_LENGTH] = str(len(head))
        kept = []
        for name, value in headers.items():
            lowered = name.lower()
            if lowered in self.drop_headers:
                continue
            kept.append((name, self.token(value) if lowered in self.hash_headers else value))
        return replace(record, headers=tuple(kept), body=body)


def _visit(node: Any, path: Sequence[Step], hashing: Any) -> None:
    """Hash (``hashing`` is the token function) or drop (None) what ``path`` names under ``node``."""
    step, rest = path[0], path[1:]
    if step is None:
        if isinstance(node, list):
            for index, item in enumerate(node):
                if rest:
                    _visit(item, rest, hashing)
                elif hashing is not None:
                    node[index] = _hashed(item, hashing)
        return
    if not isinstance(node, dict) or step not in node:
        return
    if rest:
        _visit(node[step], rest, hashing)
    elif hashing is None:
        del node[step]
    else:
        node[step] = _hashed(node[step], hashing)


def _hashed(value: Any, hashing: Any) -> Any:
    if isinstance(value, list) and all(not isinstance(v, dict | list) for v in value):
        return [hashing(v) for v in value]
    return hashing(value)


def load_redactor(path: Path) -> Redactor:
    """The policy of a ``--capture-redact`` file.

    Raises:
        ValueError: not a mapping, unknown keys, a bad path, or a secret shorter than 16 bytes.
    """
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    known = {"secret_file", "hash", "drop", "hash_headers", "drop_headers"}
    if not isinstance(document, dict) or not set(document) <= known or "secret_file" not in document:
        raise ValueError(f"{path}: a mapping of secret_file and {sorted(known - {'secret_file'})}")
    secret = Path(str(document["secret_file"])).read_bytes().strip()
    if len(secret) < _MIN_SECRET_BYTES:
        raise ValueError(f"{path}: the secret must be at least {_MIN_SECRET_BYTES} bytes")

    def names(key: str) -> list[str]:
        values = document.get(key) or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"{path}: {key} must be a list of strings")
        return values

    return Redactor(
        secret,
        tuple(parse_path(p) for p in names("hash")),
        tuple(parse_path(p) for p in names("drop")),
        frozenset(h.lower() for h in names("hash_headers")),
        frozenset(h.lower() for h in names("drop_headers")),
    )
