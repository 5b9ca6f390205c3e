"""The data plane's door: who is calling (API key or tenant header) and whether their quota
lets this request in. Called once per request at the request edge, before any decoding work.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ortserve.errors import Overloaded
from ortserve.tenancy.buckets import QuotaPolicy, TenantQuotas
from ortserve.tenancy.keys import DEFAULT_TENANT, ApiKeys

__all__ = ["TenantGate", "build_gate", "parse_quota"]

Headers = Callable[[str], str | None]

_MAX_TENANT_NAME = 64


class TenantGate:
    """Identifies the tenant and applies its quota.

    Args:
        keys: the API keys (None: no authentication; the tenant comes from ``tenant_header``).
        quotas: per-tenant buckets (None: no quota).
        tenant_header: without keys, the header naming the tenant (absent: ``default``).
    """

    def __init__(
        self, keys: ApiKeys | None, quotas: TenantQuotas | None, tenant_header: str = "x-tenant-id"
    ) -> None:
        self.keys = keys
        self.quotas = quotas
        self._header = tenant_header.lower()

    def tenant(self, headers: Headers) -> str:
        """Raises: Unauthenticated when keys are on and the request has no valid one."""
        if self.keys is not None:
            return self.keys.tenant_of(headers("authorization"))
        named = headers(self._header)
        return named[:_MAX_TENANT_NAME] if named else DEFAULT_TENANT

    def named(self, headers: Headers) -> str | None:
        """The tenant the request names, without raising: None for a missing or unknown key
        (what an edge refusal asks, to refuse by the tenant's share of a queue)."""
        if self.keys is not None:
            return self.keys.find(headers("authorization"))
        named = headers(self._header)
        return named[:_MAX_TENANT_NAME] if named else DEFAULT_TENANT

    def admit(self, headers: Headers, generation: bool = False) -> str:
        """The tenant of an admitted request (a ``generation`` is also refused while its
        tenant owes tokens).

        Raises:
            Unauthenticated: keys are on and the request has no valid one.
            Overloaded: the tenant's quota is spent (``retry_after_s``: until it refills).
        """
        keys = self.keys  # self.tenant, inlined: once per request
        if keys is not None:
            authorization = headers("authorization")
            tenant = keys.remembered.get(authorization) or keys.tenant_of(authorization)
        else:
            named = headers(self._header)
            tenant = named[:_MAX_TENANT_NAME] if named else DEFAULT_TENANT
        quotas = self.quotas
        if quotas is not None:
            wait = quotas.admit(tenant, 0, generation)
            if wait > 0.0:
                raise Overloaded(f"tenant {tenant!r} is over its quota", retry_after_s=wait)
        return tenant


_QUOTA_FIELDS = {
    "requests": "requests_per_s",
    "burst": "request_burst",
    "tokens": "tokens_per_s",
    "token_burst": "token_burst",
    "tenants": "max_tenants",
}


def parse_quota(text: str) -> QuotaPolicy:
    """``requests=100,burst=200,tokens=5000,token_burst=20000,tenants=10000`` (rates per
    second; ``tokens`` counts an LLM request's prompt and generated tokens).

    Raises:
        ValueError: an unknown field, a value that is not a positive number, or no rate at all.
    """
    values: dict[str, float] = {}
    for part in text.split(","):
        key, equals, value = part.strip().partition("=")
        if key not in _QUOTA_FIELDS or not equals:
            raise ValueError(f"{part!r}: expected one of {', '.join(_QUOTA_FIELDS)} as key=value")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{part!r}: {value!r} is not a number") from None
        if not 0 < number < 1e12:
            raise ValueError(f"{part!r}: must be positive")
        values[_QUOTA_FIELDS[key]] = number
    tenants = int(values.pop("max_tenants", 10_000))
    policy = QuotaPolicy(**values, max_tenants=tenants)
    if not policy.active:
        raise ValueError("a quota needs requests=... or tokens=...")
    return policy


def build_gate(
    api_keys: tuple[str, ...], api_key_file: Path | None, quota: str | None, clock: Callable[[], float]
) -> TenantGate | None:
    """The gate the settings ask for; None when keys and quotas are both off (the default).

    Raises:
        ValueError: a malformed key file or quota.
    """
    keys = ApiKeys.from_sources(api_keys, api_key_file)
    quotas = None if quota is None else TenantQuotas(parse_quota(quota), clock)
    if keys is None and quotas is None:
        return None
    return TenantGate(keys, quotas)
