"""API keys and per-tenant token buckets, driven by a fake clock: who is let in, who waits how
long, and that nothing a client sends grows the server's memory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ortserve.errors import Overloaded, Unauthenticated
from ortserve.tenancy.buckets import OVERFLOW_TENANT, QuotaPolicy, TenantQuotas, TokenBucket
from ortserve.tenancy.gate import TenantGate, build_gate, parse_quota
from ortserve.tenancy.keys import ApiKeys, read_key_file
from ortserve.testing import FakeClock


def headers(**values: str) -> Callable[[str], str | None]:
    found = {k.replace("_", "-"): v for k, v in values.items()}
    return found.get


def test_a_bucket_lets_a_burst_through_then_one_unit_per_refill_interval() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10.0, burst=3.0, clock=clock.now)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == pytest.approx(0.1)
    clock.advance(0.1)
    assert bucket.take() == 0.0
    clock.advance(10.0)  # refills to the burst, not beyond
    assert [bucket.take() for _ in range(4)][-1] == pytest.approx(0.1)


def test_a_request_larger_than_the_burst_waits_for_a_full_bucket_and_leaves_a_debt() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=100.0, burst=50.0, clock=clock.now)
    assert bucket.take(500) == 0.0  # admitted on a full bucket
    assert bucket.take(1) == pytest.approx(451 / 100)  # the debt is paid back first
    bucket.charge(100)
    assert bucket.take(1) == pytest.approx(551 / 100)


def test_keys_name_their_tenant_and_anything_else_is_unauthenticated(tmp_path: Path) -> None:
    file = tmp_path / "keys"
    file.write_text(
        "# tenant token\nacme s3cret-a\nglobex s3cret-g  # trailing comment\n\n", encoding="utf-8"
    )
    keys = ApiKeys({**read_key_file(file), "solo": "default"})
    assert keys.tenant_of("Bearer s3cret-a") == "acme"
    assert keys.tenant_of("bearer s3cret-g") == "globex"
    assert keys.tenant_of("Bearer solo") == "default"
    for bad in (None, "", "Bearer", "Bearer s3cret", "Basic s3cret-a", "Bearer " + "x" * 5000):
        with pytest.raises(Unauthenticated):
            keys.tenant_of(bad)
    single = ApiKeys({"only": "default"})
    assert single.tenant_of("Bearer only") == "default"
    with pytest.raises(Unauthenticated):
        single.tenant_of("Bearer onlx")


def test_an_accepted_key_is_remembered_and_a_refused_one_never_is() -> None:
    keys = ApiKeys({"k-acme": "acme", "k-globex": "globex"})
    for _ in range(3):
        assert keys.tenant_of("Bearer k-acme") == "acme"
        with pytest.raises(Unauthenticated):
            keys.tenant_of("Bearer k-acmf")
    assert keys.tenant_of("bearer  k-globex ") == "globex"  # another spelling of the same key
    assert keys.remembered == {"Bearer k-acme": "acme", "bearer  k-globex ": "globex"}
    for n in range(2000):  # bounded: forgotten all at once when full
        keys.tenant_of("Bearer k-acme" + " " * n)
    assert len(keys.remembered) <= 1024


def test_a_key_file_with_a_bad_line_or_a_repeated_token_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "keys"
    file.write_text("acme\n", encoding="utf-8")
    with pytest.raises(ValueError, match="expected"):
        read_key_file(file)
    file.write_text("a t\nb t\n", encoding="utf-8")
    with pytest.raises(ValueError, match="twice"):
        read_key_file(file)


def test_one_tenant_spending_its_quota_leaves_the_others_theirs() -> None:
    clock = FakeClock()
    quotas = TenantQuotas(QuotaPolicy(requests_per_s=5.0, request_burst=5.0), clock.now)
    gate = TenantGate(None, quotas)
    for _ in range(5):
        assert gate.admit(headers(x_tenant_id="flood")) == "flood"
    with pytest.raises(Overloaded) as refused:
        gate.admit(headers(x_tenant_id="flood"))
    assert refused.value.retry_after_s == pytest.approx(0.2)
    assert gate.admit(headers(x_tenant_id="quiet")) == "quiet"
    assert gate.admit(headers()) == "default"
    counts = {
        tuple(s.labels.values()): s.value for f in quotas.collect() for s in f.samples if "requests" in s.name
    }
    assert counts[("flood", "admitted")] == 5 and counts[("flood", "refused")] == 1


def test_generation_tokens_are_charged_and_refuse_the_next_prompt_until_refilled() -> None:
    clock = FakeClock()
    quotas = TenantQuotas(QuotaPolicy(tokens_per_s=100.0, token_burst=100.0), clock.now)
    assert quotas.admit("t", prompt_tokens=40) == 0.0
    quotas.charge_tokens("t", 60)
    assert quotas.admit("t", prompt_tokens=10) == pytest.approx(0.1)
    clock.advance(0.1)
    assert quotas.admit("t", prompt_tokens=10) == 0.0


def test_a_tenant_in_token_debt_is_refused_generations_until_it_refills_but_not_other_requests() -> None:
    clock = FakeClock()
    quotas = TenantQuotas(QuotaPolicy(requests_per_s=100.0, tokens_per_s=100.0, token_burst=100.0), clock.now)
    gate = TenantGate(None, quotas)
    chatty = headers(x_tenant_id="chatty")
    assert gate.admit(chatty, generation=True) == "chatty"
    quotas.charge_tokens("chatty", 150)  # its prompt and output, charged when it ended: 50 owed
    with pytest.raises(Overloaded) as refused:
        gate.admit(chatty, generation=True)
    assert refused.value.retry_after_s == pytest.approx(0.5)
    assert gate.admit(chatty) == "chatty"  # a request that generates nothing is not held back
    assert gate.admit(headers(x_tenant_id="quiet"), generation=True) == "quiet"
    clock.advance(0.51)
    assert gate.admit(chatty, generation=True) == "chatty"
    counts = {
        tuple(s.labels.values()): s.value for f in quotas.collect() for s in f.samples if "requests" in s.name
    }
    assert counts[("chatty", "admitted")] == 3 and counts[("chatty", "refused")] == 1
    used = {s.labels["tenant"]: s.value for f in quotas.collect() for s in f.samples if "tokens" in s.name}
    assert used["chatty"] == 150


def test_tenant_names_beyond_the_cap_share_one_bucket() -> None:
    quotas = TenantQuotas(QuotaPolicy(requests_per_s=1.0, max_tenants=3), FakeClock().now)
    for n in range(100):
        quotas.admit(f"t{n}")
    names = {s.labels["tenant"] for f in quotas.collect() for s in f.samples}
    assert names == {"t0", "t1", "t2", OVERFLOW_TENANT}


def test_with_keys_the_tenant_header_is_ignored() -> None:
    gate = TenantGate(ApiKeys({"k": "acme"}), None)
    assert gate.admit(headers(authorization="Bearer k", x_tenant_id="someone-else")) == "acme"
    with pytest.raises(Unauthenticated):
        gate.admit(headers(x_tenant_id="acme"))


def test_quota_specs_parse_and_bad_ones_say_why() -> None:
    assert parse_quota("requests=100,burst=200,tenants=50") == QuotaPolicy(100.0, 200.0, max_tenants=50)
    assert parse_quota("tokens=5000,token_burst=20000") == QuotaPolicy(
        tokens_per_s=5000.0, token_burst=20000.0
    )
    bad_specs = (
        ("requests", "key=value"),
        ("speed=3", "expected"),
        ("requests=-1", "positive"),
        ("burst=3", "needs"),
        ("tokens=0", "positive"),
    )
    for bad, message in bad_specs:
        with pytest.raises(ValueError, match=message):
            parse_quota(bad)
    assert build_gate((), None, None, FakeClock().now) is None
