"""Per-tenant token buckets: requests per second and, for generation, tokens per second.

A bucket holds up to ``burst`` units and refills at ``rate`` per second of an injected clock;
a request takes one unit (a generation also its prompt's tokens on admission and the tokens it
generates as they come), or is refused with the time until enough has refilled: the 429's
Retry-After. Tenants are bounded: past ``max_tenants`` distinct names (a tenant header is
client-chosen) the newcomers share one bucket, so nothing a client sends grows memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

__all__ = ["OVERFLOW_TENANT", "QuotaPolicy", "TenantQuotas", "TokenBucket"]

OVERFLOW_TENANT = "_other"
"""The bucket every tenant past ``max_tenants`` shares."""


class TokenBucket:
    """``rate`` units a second, at most ``burst`` saved; starts full."""

    __slots__ = ("_burst", "_clock", "_level", "_rate", "_stamp")

    def __init__(self, rate: float, burst: float, clock: Callable[[], float]) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a bucket needs a positive rate and a burst of at least 1")
        self._rate = rate
        self._burst = burst
        self._clock = clock
        self._level = burst
        self._stamp = clock()

    def take(self, units: float = 1.0) -> float:
        """Take ``units``; 0.0 when taken, else the seconds until they would be there.

        A request larger than the burst is admitted when the bucket is full (it could never be
        otherwise) and leaves the bucket in debt, so the tenant's average still holds.
        """
        now = self._clock()
        level = self._level + (now - self._stamp) * self._rate
        if level > self._burst:
            level = self._burst
        self._stamp = now
        needed = units if units < self._burst else self._burst
        if level >= needed:
            self._level = level - units
            return 0.0
        self._level = level
        return (needed - level) / self._rate

    def owed(self) -> float:
        """0.0 when the bucket holds something, else the seconds until it will (nothing taken)."""
        now = self._clock()
        level = self._level + (now - self._stamp) * self._rate
        return 0.0 if level > 0.0 else (1e-9 - level) / self._rate

    def charge(self, units: float) -> None:
        """Take ``units`` that were already spent (generated tokens): the level may go negative."""
        now = self._clock()
        self._level = min(self._burst, self._level + (now - self._stamp) * self._rate) - units
        self._stamp = now


@dataclass(frozen=True, slots=True)
class QuotaPolicy:
    """Every tenant's limits (0: that limit is off)."""

    requests_per_s: float = 0.0
    request_burst: float = 0.0
    """0: one second's worth."""
    tokens_per_s: float = 0.0
    token_burst: float = 0.0
    max_tenants: int = 10_000

    @property
    def active(self) -> bool:
        return self.requests_per_s > 0 or self.tokens_per_s > 0


@dataclass(slots=True)
class _Tenant:
    requests: TokenBucket | None
    tokens: TokenBucket | None
    admitted: int = 0
    refused: int = 0
    tokens_used: float = 0.0


class TenantQuotas(Collector):
    """Each tenant's buckets and counts; also the metrics collector of them.

    Args:
        policy: the limits every tenant gets.
        clock: monotonic seconds (injected: tests drive it by hand).
    """

    def __init__(self, policy: QuotaPolicy, clock: Callable[[], float]) -> None:
        self._policy = policy
        self._clock = clock
        self._tenants: dict[str, _Tenant] = {}

    def _tenant(self, name: str) -> _Tenant:
        found = self._tenants.get(name)
        if found is None:
            if len(self._tenants) >= self._policy.max_tenants:
                name = OVERFLOW_TENANT
                found = self._tenants.get(name)
            if found is None:
                found = self._tenants[name] = self._new()
        return found

    def _new(self) -> _Tenant:
        p, clock = self._policy, self._clock
        requests = (
            TokenBucket(p.requests_per_s, p.request_burst or max(1.0, p.requests_per_s), clock)
            if p.requests_per_s > 0
            else None
        )
        tokens = (
            TokenBucket(p.tokens_per_s, p.token_burst or max(1.0, p.tokens_per_s), clock)
            if p.tokens_per_s > 0
            else None
        )
        return _Tenant(requests, tokens)

    def admit(self, name: str, prompt_tokens: int = 0, generation: bool = False) -> float:
        """Admit one request of ``name`` (with its prompt's tokens); 0.0, or seconds to wait.

        A ``generation`` is refused while the tenant's token bucket is in debt: its tokens are
        charged when it ends (:meth:`charge_tokens`), so a tenant pays for what it used.
        """
        tenant = self._tenants.get(name) or self._tenant(name)
        wait = 0.0
        if generation and tenant.tokens is not None:
            wait = tenant.tokens.owed()
        requests = tenant.requests
        if wait == 0.0 and requests is not None:
            wait = requests.take()
        if wait == 0.0 and prompt_tokens and tenant.tokens is not None:
            wait = tenant.tokens.take(float(prompt_tokens))
        if wait > 0.0:
            tenant.refused += 1
            return wait
        tenant.admitted += 1
        tenant.tokens_used += prompt_tokens
        return 0.0

    def charge_tokens(self, name: str, tokens: int) -> None:
        """Generated tokens, charged as they are produced (they cannot be refused any more)."""
        tenant = self._tenant(name)
        tenant.tokens_used += tokens
        if tenant.tokens is not None:
            tenant.tokens.charge(float(tokens))

    def collect(self) -> Iterator[CounterMetricFamily]:
        requests = CounterMetricFamily(
            "ortserve_tenant_requests",
            "Data-plane requests by tenant, admitted or refused by its quota",
            labels=["tenant", "outcome"],
        )
        tokens = CounterMetricFamily(
            "ortserve_tenant_tokens", "Prompt and generated tokens charged to each tenant", labels=["tenant"]
        )
        for name, tenant in sorted(self._tenants.items()):
            requests.add_metric([name, "admitted"], tenant.admitted)
            requests.add_metric([name, "refused"], tenant.refused)
            tokens.add_metric([name], tenant.tokens_used)
        yield requests
        yield tokens


def retry_after(seconds: float) -> float:
    """Whole seconds for a Retry-After header, at least 1."""
    return float(max(1, math.ceil(seconds)))
