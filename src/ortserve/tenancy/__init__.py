"""Tenants on the data plane: API keys (bearer tokens) and per-tenant token-bucket quotas."""

from __future__ import annotations

from ortserve.tenancy.buckets import TenantQuotas, TokenBucket
from ortserve.tenancy.gate import TenantGate
from ortserve.tenancy.keys import ApiKeys

__all__ = ["ApiKeys", "TenantGate", "TenantQuotas", "TokenBucket"]
