"""What the status page needs, read from a Prometheus exposition: per-model totals at one instant.

The page reads the same numbers Prometheus scrapes, from the same text: with ``--workers N``
a worker's ``/metrics`` is the supervisor's merge of every worker, so the status page shows
the whole server without a merge of its own. Totals are cumulative; the board turns two of
them into rates.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["ModelTotals", "ServerTotals", "VersionView", "read_totals"]

_FAILED = frozenset(("internal", "unavailable", "deadline"))
_READ = frozenset(
    (
        "ortserve_workers",
        "ortserve_workers_up",
        "ortserve_model_state",
        "ortserve_requests_total",
        "ortserve_request_duration_seconds_bucket",
        "ortserve_scheduler_rejections_total",
        "ortserve_queue_depth",
        "ortserve_busy_instances",
        "ortserve_model_execution_provider",
        "ortserve_fallback_level",
        "ortserve_breaker_open",
        "ortserve_version_role",
        "ortserve_routing_requests_total",
        "ortserve_rollout_share_percent",
        "ortserve_llm_running_sequences",
        "ortserve_llm_waiting_sequences",
        "ortserve_llm_kv_cache_bytes",
        "ortserve_llm_prefix_cache_hit_ratio",
        "ortserve_llm_generation_tokens_total",
        "ortserve_llm_time_to_first_token_seconds_bucket",
        "ortserve_llm_inter_token_latency_seconds_bucket",
    )
)
"""Sample names the page reads; every other line is skipped before its labels are parsed."""
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class VersionView:
    """One version as the page shows it."""

    state: str = ""
    provider: str = ""
    fallback_level: int | None = None
    breakers_open: list[int] = field(default_factory=list)
    role: str = ""


@dataclass
class LlmTotals:
    running: float = 0.0
    waiting: float = 0.0
    kv_bytes: float = 0.0
    prefix_hit_ratio: float = 0.0
    generated_tokens: float = 0.0
    ttft: dict[float, float] = field(default_factory=dict)
    itl: dict[float, float] = field(default_factory=dict)


@dataclass
class ModelTotals:
    """Cumulative counts (summed over versions and transports) and gauges of one model."""

    versions: dict[str, VersionView] = field(default_factory=dict)
    outcomes: dict[str, float] = field(default_factory=dict)
    latency: dict[float, float] = field(default_factory=dict)
    """Cumulative bucket counts by upper bound (``inf`` last)."""
    refusals: dict[str, float] = field(default_factory=dict)
    routed: dict[str, float] = field(default_factory=dict)
    rollout: tuple[str, float] | None = None
    queue_depth: float = 0.0
    busy: float = 0.0
    llm: LlmTotals | None = None

    @property
    def requests(self) -> float:
        return sum(self.outcomes.values())

    @property
    def failures(self) -> float:
        return sum(n for outcome, n in self.outcomes.items() if outcome in _FAILED)

    def shown(self) -> bool:
        """A model with no version left but unloaded ones is gone from the page."""
        return any(v.state not in ("", "unloaded") for v in self.versions.values())


@dataclass
class ServerTotals:
    models: dict[str, ModelTotals] = field(default_factory=dict)
    workers: int = 1

    def model(self, name: str) -> ModelTotals:
        found = self.models.get(name)
        if found is None:
            found = self.models[name] = ModelTotals()
        return found


def _llm(totals: ModelTotals) -> LlmTotals:
    if totals.llm is None:
        totals.llm = LlmTotals()
    return totals.llm


def _add(table: dict[float, float], le: str, value: float) -> None:
    bound = float("inf") if le == "+Inf" else float(le)
    table[bound] = table.get(bound, 0.0) + value


def _sample(found: ServerTotals, name: str, labels: dict[str, str], value: float) -> None:
    model = labels.get("model")
    if model is None:
        if name in ("ortserve_workers", "ortserve_workers_up"):
            found.workers = max(found.workers, int(value))
        return
    m = found.model(model)
    version = labels.get("version", "")
    if name == "ortserve_model_state":
        if value >= 1 and version:
            m.versions.setdefault(version, VersionView()).state = labels["state"]
    elif name == "ortserve_requests_total" and labels.get("version"):
        outcome = labels["outcome"]
        m.outcomes[outcome] = m.outcomes.get(outcome, 0.0) + value
    elif name == "ortserve_request_duration_seconds_bucket":
        _add(m.latency, labels["le"], value)
    elif name == "ortserve_scheduler_rejections_total":
        m.refusals[labels["reason"]] = m.refusals.get(labels["reason"], 0.0) + value
    elif name == "ortserve_queue_depth":
        m.queue_depth += value
    elif name == "ortserve_busy_instances":
        m.busy += value
    else:
        _version_sample(m, name, labels, value)


def _version_sample(m: ModelTotals, name: str, labels: dict[str, str], value: float) -> None:
    version = labels.get("version", "")
    if name == "ortserve_model_execution_provider" and value >= 1:
        m.versions.setdefault(version, VersionView()).provider = labels["provider"]
    elif name == "ortserve_fallback_level":
        m.versions.setdefault(version, VersionView()).fallback_level = int(value)
    elif name == "ortserve_breaker_open" and value >= 1:
        m.versions.setdefault(version, VersionView()).breakers_open.append(int(labels["level"]))
    elif name == "ortserve_version_role" and value >= 1:
        m.versions.setdefault(version, VersionView()).role = labels["role"]
    elif name == "ortserve_routing_requests_total":
        m.routed[version] = m.routed.get(version, 0.0) + value
    elif name == "ortserve_rollout_share_percent":
        m.rollout = (labels["candidate"], value)
    elif name.startswith("ortserve_llm_"):
        _llm_sample(_llm(m), name.removeprefix("ortserve_llm_"), labels, value)


def _llm_sample(llm: LlmTotals, name: str, labels: dict[str, str], value: float) -> None:
    if name == "running_sequences":
        llm.running += value
    elif name == "waiting_sequences":
        llm.waiting += value
    elif name == "kv_cache_bytes":
        llm.kv_bytes += value
    elif name == "prefix_cache_hit_ratio":
        llm.prefix_hit_ratio = max(llm.prefix_hit_ratio, value)
    elif name == "generation_tokens_total":
        llm.generated_tokens += value
    elif name == "time_to_first_token_seconds_bucket":
        _add(llm.ttft, labels["le"], value)
    elif name == "inter_token_latency_seconds_bucket":
        _add(llm.itl, labels["le"], value)


def _samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of the samples the page reads, from the text format (0.0.4).

    A reader of its own rather than prometheus_client's parser: this one skips a line by its
    name before anything else, and is ten times faster on a server's exposition (the page
    must cost little while it is open).
    """
    for line in text.splitlines():
        if not line.startswith("ortserve_"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        end = brace if 0 <= brace < space else space
        name = line[:end]
        if name not in _READ:
            continue
        labels: dict[str, str] = {}
        if end == brace:
            close = line.rfind("}")
            labels = {
                k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(line, brace, close)
            }
            space = close + 1
        try:
            value = float(line[space:].split()[0])
        except (ValueError, IndexError):
            continue
        yield name, labels, value


def read_totals(text: str) -> ServerTotals:
    """Totals from the text of an exposition."""
    found = ServerTotals()
    for name, labels, value in _samples(text):
        _sample(found, name, labels, value)
    for name in [n for n, m in found.models.items() if not m.versions]:
        del found.models[name]  # a pipeline's route or a model never loaded: nothing to show
    return found
