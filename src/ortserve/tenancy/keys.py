"""API keys for the data plane: ``Authorization: Bearer <token>``, vLLM's ``--api-key`` style.

Tokens come from ``--api-key`` (tenant ``default``) and a key file of ``<tenant> <token>``
lines. Up to eight keys, the presented token is compared with every one by
``hmac.compare_digest`` (no early exit): the time does not depend on how many leading
characters of a secret it guessed. With more keys it is looked up in a dict: Python hashes
bytes with a per-process secret key (SipHash), so the lookup's time depends on a hash the
client can neither compute nor steer. (A SHA-256 of each token would cost about 1 µs more.)
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from pathlib import Path

from ortserve.errors import Unauthenticated

__all__ = ["DEFAULT_TENANT", "ApiKeys", "read_key_file"]

DEFAULT_TENANT = "default"
_MAX_TOKEN_BYTES = 4096
_COMPARED = 8
"""Up to this many keys, each is compared in constant time."""
_SEEN = 1024
"""Accepted ``Authorization`` values remembered (then forgotten all at once)."""


def read_key_file(path: Path) -> dict[str, str]:
    """``{token: tenant}`` from lines ``<tenant> <token>`` (``#`` comments, blank lines skipped).

    Raises:
        ValueError: a line without both fields, or a token given twice.
    """
    found: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        fields = text.split()
        if len(fields) != 2:
            raise ValueError(f"{path}:{number}: expected '<tenant> <token>'")
        tenant, token = fields
        if token in found:
            raise ValueError(f"{path}:{number}: this token is given twice")
        found[token] = tenant
    return found


class ApiKeys:
    """The accepted tokens and the tenant each one names.

    Args:
        tokens: ``{token: tenant}``.
    """

    def __init__(self, tokens: Mapping[str, str]) -> None:
        if not tokens:
            raise ValueError("no API key given")
        self._tenants = {token.encode(): tenant for token, tenant in tokens.items()}
        self._few = list(self._tenants.items()) if len(self._tenants) <= _COMPARED else None
        self.remembered: dict[str | None, str] = {}
        """Header values already accepted -> tenant: a client sends the same one with every
        request, and finding it is one dict lookup (a hash with the per-process secret key, as
        for more than eight keys) instead of a parse and a compare with every key. Read only
        (the gate looks here first); :meth:`tenant_of` fills it."""

    @classmethod
    def from_sources(cls, keys: Iterable[str], key_file: Path | None) -> ApiKeys | None:
        """Keys from ``--api-key`` values and a key file; None when neither gives one (off)."""
        tokens = dict.fromkeys(keys, DEFAULT_TENANT)
        if key_file is not None:
            tokens.update(read_key_file(key_file))
        return cls(tokens) if tokens else None

    @property
    def tenants(self) -> frozenset[str]:
        return frozenset(self._tenants.values())

    def tenant_of(self, authorization: str | None) -> str:
        """The tenant of an ``Authorization`` header's bearer token.

        Raises:
            Unauthenticated: no header, not a bearer token, or an unknown token.
        """
        seen = self.remembered.get(authorization)
        if seen is not None:
            return seen
        tenant = self.find(authorization)
        if tenant is not None:
            if len(self.remembered) >= _SEEN:
                self.remembered.clear()
            self.remembered[authorization] = tenant
            return tenant
        if authorization is None or len(authorization) > _MAX_TOKEN_BYTES:
            raise Unauthenticated("this server requires an API key: Authorization: Bearer <key>")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("the Authorization header must be 'Bearer <key>'")
        raise Unauthenticated("unknown API key")

    def find(self, authorization: str | None) -> str | None:
        """The tenant of an ``Authorization`` header's bearer token; None when it names none."""
        if authorization is None or len(authorization) > _MAX_TOKEN_BYTES:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        presented = token.strip().encode()
        tenant: str | None = None
        if self._few is not None:
            for stored, owner in self._few:
                if hmac.compare_digest(presented, stored):
                    tenant = owner
        else:
            tenant = self._tenants.get(presented)
        return tenant
