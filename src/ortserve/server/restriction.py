"""Restricted control-plane APIs: a header (HTTP) or metadata key (gRPC) with a shared value.

Triton's flags, ``--http-restricted-api`` and ``--grpc-restricted-protocol``, take
``<api>[,<api>...]:<key>=<value>``. The repository endpoints change what the server serves, so
an operator can require a secret on them; a call without it gets 403 / PERMISSION_DENIED. The
value is compared in constant time.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from ortserve.errors import PermissionDenied

__all__ = ["RESTRICTABLE_APIS", "Restriction", "parse_restriction"]

RESTRICTABLE_APIS = ("model-repository", "routing", "trace", "logging", "status")
"""API groups ortserve can restrict: model-repository (index, load, unload), routing (the
traffic policy control endpoint, ``/v2/routing``), trace and logging (their settings), status
(``/v2/status.json``, what the status page shows)."""


@dataclass(frozen=True, slots=True)
class Restriction:
    """The key (header or metadata name, lowercase) and the value it must carry."""

    key: str
    value: str

    def check(self, given: str | None) -> None:
        """Raises: PermissionDenied when ``given`` is missing or not the value."""
        if given is None or not hmac.compare_digest(given.encode(), self.value.encode()):
            raise PermissionDenied(
                f"this API is restricted: send the {self.key!r} header (gRPC metadata) with the "
                "value the server was started with"
            )


def parse_restriction(spec: str) -> dict[str, Restriction]:
    """``model-repository:KEY=VALUE`` -> {"model-repository": Restriction("key", "VALUE")}.

    Raises:
        ValueError: malformed, an empty key or value, or an API ortserve cannot restrict.
    """
    apis, colon, pair = spec.partition(":")
    key, equals, value = pair.partition("=")
    if not colon or not equals or not key.strip() or not value:
        raise ValueError(f"{spec!r} is not <api>[,<api>...]:<key>=<value>")
    restriction = Restriction(key.strip().lower(), value)
    restricted = {}
    for api in apis.split(","):
        if api.strip() not in RESTRICTABLE_APIS:
            raise ValueError(
                f"cannot restrict API {api.strip()!r}; restrictable: {', '.join(RESTRICTABLE_APIS)}"
            )
        restricted[api.strip()] = restriction
    return restricted
