"""One view over N workers: Prometheus expositions, Triton statistics and repository indexes merged.

Each worker keeps its own totals (nothing is shared between processes on the request path);
the supervisor asks every worker at read time and merges here. The rules:

- counters, histograms and summaries add up, series by series; a histogram's buckets add up
  bound by bound, which is exact because every worker runs with the same bucket bounds (one
  set of settings), and a series a worker does not have counts as zero there;
- ``*_created`` samples take the earliest;
- gauges add up (queue depth, requests in flight, resident memory), except those that describe
  rather than count: build and provider information and load time take the largest value,
  process start time and descriptor limits the smallest, and a version's ``ready`` state is 1
  only when it is 1 on every worker;
- statistics add up per model version and batch size, ``last_inference`` takes the latest;
- a version in the index is READY only when every worker has it ready.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["merge_expositions", "merge_index", "merge_statistics", "worker_requests"]

_Key = tuple[str, tuple[tuple[str, str], ...]]
_Combine = Callable[[list[float], int], float]

_LARGEST = {
    "ortserve_build_info",
    "python_info",
    "ortserve_model_execution_provider",
    "ortserve_model_load_duration_seconds",
}
_SMALLEST = {"process_start_time_seconds", "process_max_fds"}
_SUFFIX_ORDER = {"_bucket": 0, "_count": 1, "_sum": 2, "_total": 0, "_created": 3}


def _sum(values: list[float], workers: int) -> float:
    return math.fsum(values)


def _largest(values: list[float], workers: int) -> float:
    return max(values)


def _smallest(values: list[float], workers: int) -> float:
    return min(values)


def _on_every_worker(values: list[float], workers: int) -> float:
    return min(values) if len(values) == workers else 0.0


def _combine(family: Metric, sample: str, labels: Mapping[str, str]) -> _Combine:
    if sample.endswith("_created"):
        return _smallest
    if family.type not in ("gauge", "info", "stateset"):
        return _sum
    if family.type != "gauge" or family.name in _LARGEST:
        return _largest
    if family.name in _SMALLEST:
        return _smallest
    if family.name == "ortserve_model_state":
        return _on_every_worker if labels.get("state") == "ready" else _largest
    return _sum


def merge_expositions(texts: Sequence[str]) -> list[Metric]:
    """Every family of the workers' Prometheus text expositions, merged by the rules above.

    Raises:
        ValueError: an exposition does not parse.
    """
    families: dict[str, Metric] = {}
    values: dict[str, dict[_Key, list[float]]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            series = values.setdefault(family.name, {})
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                series.setdefault(key, []).append(sample.value)
    for name, merged in families.items():
        for sample_name, labels in sorted(values[name], key=lambda key: _order(name, key)):
            found = values[name][(sample_name, labels)]
            label_map = dict(labels)
            merged.add_sample(
                sample_name, label_map, _combine(merged, sample_name, label_map)(found, len(texts))
            )
    return list(families.values())


def _order(family: str, key: _Key) -> tuple[tuple[tuple[str, str], ...], int, float]:
    """Series by series; within one, buckets by bound, then count, sum, created."""
    sample, labels = key
    suffix = sample[len(family) :]
    le = dict(labels).get("le")
    bound = math.inf if le in (None, "+Inf") else float(le)
    return tuple(item for item in labels if item[0] != "le"), _SUFFIX_ORDER.get(suffix, 0), bound


def worker_requests(text: str) -> float:
    """All inference requests one worker answered (its ``ortserve_requests_total`` samples)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == "ortserve_requests":
            total += math.fsum(s.value for s in family.samples if s.name == "ortserve_requests_total")
    return total


def merge_statistics(answers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Triton's ``{"model_stats": [...]}`` of every worker as one answer."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for answer in answers:
        for stats in answer.get("model_stats", []):
            key = (str(stats["name"]), str(stats["version"]))
            if key not in merged:
                merged[key] = _copy(stats)
            else:
                _add_into(merged[key], stats)
    ordered = sorted(merged.items(), key=lambda item: (item[0][0], _version_order(item[0][1])))
    return {"model_stats": [stats for _, stats in ordered]}


def _version_order(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isascii() and version.isdigit() else (-1, version)


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _add_into(target: dict[str, Any], other: Mapping[str, Any]) -> None:
    for name, value in other.items():
        if name in ("name", "version"):
            continue
        if name not in target:
            target[name] = _copy(value)
        elif name == "last_inference":
            target[name] = max(target[name], value)
        elif name == "batch_stats":
            target[name] = _merge_batches(target[name], value)
        elif isinstance(value, dict):
            _add_into(target[name], value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            target[name] += value


def _merge_batches(mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_size = {int(entry["batch_size"]): entry for entry in mine}
    for entry in theirs:
        size = int(entry["batch_size"])
        if size in by_size:
            _add_into(by_size[size], {k: v for k, v in entry.items() if k != "batch_size"})
        else:
            by_size[size] = _copy(entry)
    return [by_size[size] for size in sorted(by_size)]


_STATE_ORDER = ("LOADING", "UNLOADING", "UNAVAILABLE")


def merge_index(answers: Sequence[Sequence[Mapping[str, str]]], ready_only: bool) -> list[dict[str, str]]:
    """One row per model version: READY only when READY on every worker.

    Otherwise the state is the furthest from serving that a worker reports (LOADING, then
    UNLOADING, then UNAVAILABLE), and the reason says on how many workers it is ready.
    """
    rows: dict[tuple[str, str], list[Mapping[str, str]]] = {}
    for answer in answers:
        for row in answer:
            rows.setdefault((row["name"], row.get("version", "")), []).append(row)
    merged = [_merge_row(name, version, found, len(answers)) for (name, version), found in rows.items()]
    merged.sort(key=lambda row: (row["name"], _version_order(row["version"])))
    return [row for row in merged if row["state"] == "READY"] if ready_only else merged


def _merge_row(name: str, version: str, found: list[Mapping[str, str]], workers: int) -> dict[str, str]:
    ready = sum(1 for row in found if row.get("state") == "READY")
    if ready == workers:
        return {"name": name, "version": version, "state": "READY", "reason": ""}
    states = {row.get("state", "UNAVAILABLE") for row in found}
    state = next((s for s in _STATE_ORDER if s in states), "UNAVAILABLE")
    reasons = list(dict.fromkeys(r for row in found if (r := row.get("reason", ""))))
    reason = "; ".join([*reasons, f"ready on {ready} of {workers} workers"])
    return {"name": name, "version": version, "state": state, "reason": reason}
