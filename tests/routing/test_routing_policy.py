"""The routing decision as a table: buckets, split accuracy, stickiness, monotone raises,
override and ab_tag, explicit versions, configuration errors."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from pydantic import ValidationError

from ortserve.config.routing import RoutingConfig, parse_duration
from ortserve.routing.buckets import BUCKETS, BucketRange, bucket_of, bucket_ranges, bucketer, pick
from ortserve.routing.policy import Choice, Policy, RequestView, choose, split_weights, static_ranges


def policy(**section: object) -> Policy:
    return Policy.of(RoutingConfig.model_validate(section))


def ranges_of(split: dict[str, float]) -> tuple[BucketRange, ...]:
    return bucket_ranges(split_weights(split))


def decide(p: Policy, view: RequestView, draw: float = 0.5, default: str = "9") -> Choice:
    return choose(p, static_ranges(p), view, "m", lambda: draw, lambda: default)


def test_bucket_ranges_cover_every_bucket_in_version_order() -> None:
    assert ranges_of({"2": 30, "1": 70}) == (BucketRange("1", 0, 7000), BucketRange("2", 7000, BUCKETS))
    assert ranges_of({"1": 1, "2": 0, "3": 1}) == (BucketRange("1", 0, 5000), BucketRange("3", 5000, BUCKETS))
    assert ranges_of({"1": 0}) == ()


def test_the_bucket_of_a_key_is_stable_and_depends_on_the_model() -> None:
    assert bucket_of("m", "user-42") == bucket_of("m", "user-42")
    moved = sum(bucket_of("m", f"u{i}") != bucket_of("other", f"u{i}") for i in range(200))
    assert moved > 190


def test_the_request_paths_bucketer_agrees_with_bucket_of_on_every_key() -> None:
    bucket = bucketer("m")
    keys = [f"user-{i}" for i in range(500)] + ["", "é", "用户", "\udcff-surrogate", "x" * 300]
    assert [bucket(k) for k in keys] == [bucket_of("m", k) for k in keys]
    assert bucketer("other")("user-1") == bucket_of("other", "user-1") != bucket("user-1")


def test_a_70_30_split_holds_within_two_points_over_5000_keys() -> None:
    ranges = ranges_of({"1": 70, "2": 30})
    counts = Counter(pick(ranges, bucket_of("m", f"user-{i}")) for i in range(5000))
    assert abs(counts["1"] / 5000 - 0.70) <= 0.02
    assert abs(counts["2"] / 5000 - 0.30) <= 0.02


def test_requests_without_a_key_are_split_at_random_with_the_weights() -> None:
    p = policy(split={"1": 70, "2": 30})
    rng = random.Random(7)
    counts = Counter(decide(p, RequestView(), draw=rng.random()).version for _ in range(5000))
    assert abs(counts["2"] / 5000 - 0.30) <= 0.02


def test_a_key_always_lands_on_the_same_version() -> None:
    p = policy(split={"1": 50, "2": 50})
    for key in ("alice", "bob", "carol", "dave"):
        seen = {decide(p, RequestView(key=key), draw=random.random()).version for _ in range(1000)}
        assert len(seen) == 1


def test_raising_a_candidate_from_10_to_20_percent_moves_only_the_added_buckets() -> None:
    before, after = ranges_of({"1": 90, "2": 10}), ranges_of({"1": 80, "2": 20})
    moved = 0
    for i in range(5000):
        bucket = bucket_of("m", f"user-{i}")
        old, new = pick(before, bucket), pick(after, bucket)
        if old != new:
            assert (old, new) == ("1", "2") and 8000 <= bucket < 9000
            moved += 1
        else:
            assert not 8000 <= bucket < 9000
    assert abs(moved / 5000 - 0.10) <= 0.02


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        (RequestView(explicit="1", override="fast", key="k"), Choice("1", "explicit")),
        (RequestView(override="fast", key="k"), Choice("2", "override")),
        (RequestView(override="3"), Choice("3", "override")),
        (RequestView(key="k"), Choice(pick(ranges_of({"1": 70, "2": 30}), bucket_of("m", "k")), "sticky")),
        (RequestView(), Choice("1", "random")),
    ],
)
def test_explicit_then_override_then_split(view: RequestView, expected: Choice) -> None:
    p = policy(split={"1": 70, "2": 30}, override={"variants": {"fast": "2"}})
    assert decide(p, view, draw=0.1) == expected


def test_without_a_split_the_default_version_serves() -> None:
    assert decide(policy(), RequestView(key="k"), default="4") == Choice("4", "default")


def test_header_names_are_matched_in_lower_case() -> None:
    p = policy(override={"header": "X-Variant"}, sticky={"header": "X-Session"})
    assert (p.override_header, p.sticky_header) == ("x-variant", "x-session")


@pytest.mark.parametrize(
    ("given", "seconds"), [(5, 5.0), ("500ms", 0.5), ("10s", 10.0), ("10m", 600.0), ("3d", 259200.0)]
)
def test_durations(given: object, seconds: float) -> None:
    assert parse_duration(given) == seconds


@pytest.mark.parametrize(
    "section",
    [
        {"split": {"1": 0, "2": 0}},
        {"split": {"one": 50}},
        {"split": {"1": -5}},
        {"split": {"1": 50}, "rollout": {"candidate": "2", "baseline": "1"}},
        {"rollout": {"candidate": "2", "baseline": "2"}},
        {"rollout": {"candidate": "2", "baseline": "1", "steps": [50, 20]}},
        {"rollout": {"candidate": "2", "baseline": "1", "interval": "soon"}},
        {"shadow": {"version": "3", "fraction": 1.5}},
        {"sticky": {"header": "bad header"}},
        {"unknown": 1},
    ],
)
def test_invalid_sections_are_refused(section: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RoutingConfig.model_validate(section)
