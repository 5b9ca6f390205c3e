"""Routing, rollout, shadow and role metrics, read from the routing table at scrape time.

Nothing here runs per request: the routers keep plain counters and the divergence book keeps
:class:`~ortserve.metrics.Histogram` objects; this collector turns them into families.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ortserve.routing.router import ModelRouter
from ortserve.routing.table import RoutingTable

__all__ = ["RoutingMetrics"]

_PAIR = ["model", "primary", "shadow", "output"]


class RoutingMetrics(Collector):
    """Exports every router of ``table``."""

    def __init__(self, table: RoutingTable) -> None:
        self._table = table

    def collect(self) -> Iterator[Metric]:
        routers = sorted(self._table.routers.items())
        requests = CounterMetricFamily(
            "ortserve_routing_requests",
            "Requests routed, by version and why",
            labels=["model", "version", "reason"],
        )
        errors = CounterMetricFamily(
            "ortserve_routing_errors",
            "Routed requests that failed (5xx), by version",
            labels=["model", "version"],
        )
        roles = GaugeMetricFamily(
            "ortserve_version_role", "1 for each version's traffic role", labels=["model", "version", "role"]
        )
        share = GaugeMetricFamily(
            "ortserve_rollout_share_percent",
            "Rollout candidate's share in force",
            labels=["model", "candidate"],
        )
        events = CounterMetricFamily(
            "ortserve_rollout_events",
            "Rollout steps, completions, rejections",
            labels=["model", "candidate", "event"],
        )
        for name, router in routers:
            for (version, reason), count in sorted(router.reasons.items()):
                requests.add_metric([name, version, reason], count)
            for version, seen in sorted(router.outcomes.items()) if router.tracks_outcomes else ():
                errors.add_metric([name, version], seen.errors)
            for version, role in sorted(router.roles().items()):
                roles.add_metric([name, version, role.value], 1)
            plan = router.policy.config.rollout
            if plan is not None and router.rollout is not None:
                share.add_metric([name, plan.candidate], router.rollout.share)
                for event in ("advanced", "completed", "rejected"):
                    events.add_metric([name, plan.candidate, event], router.events[event])
        yield from (requests, errors, roles, share, events)
        yield from self._shadow(routers)

    @staticmethod
    def _shadow(routers: list[tuple[str, ModelRouter]]) -> Iterator[Metric]:
        sent = CounterMetricFamily(
            "ortserve_shadow_requests", "Shadow copies submitted", labels=["model", "shadow"]
        )
        compared = CounterMetricFamily(
            "ortserve_shadow_compared",
            "Shadow answers compared with the primary's",
            labels=["model", "shadow"],
        )
        dropped = CounterMetricFamily(
            "ortserve_shadow_dropped",
            "Shadow copies dropped: full, refused, failed",
            labels=["model", "reason"],
        )
        max_abs = HistogramMetricFamily(
            "ortserve_shadow_max_abs_diff", "Largest absolute difference per compared pair", labels=_PAIR
        )
        max_rel = HistogramMetricFamily(
            "ortserve_shadow_max_rel_diff", "Largest relative difference per compared pair", labels=_PAIR
        )
        rows = CounterMetricFamily("ortserve_shadow_rows", "Rows of 2-D score outputs compared", labels=_PAIR)
        top1 = CounterMetricFamily(
            "ortserve_shadow_top1_agreeing_rows", "Rows whose top-1 class agrees", labels=_PAIR
        )
        topk = CounterMetricFamily(
            "ortserve_shadow_topk_agreeing_rows", "Rows' top-k overlap (fraction of k, summed)", labels=_PAIR
        )
        for name, router in routers:
            lane = router.shadow
            for version, count in sorted(lane.sent.items()):
                sent.add_metric([name, version], count)
            for version, count in sorted(lane.compared.items()):
                compared.add_metric([name, version], count)
            for reason, count in sorted(lane.dropped.items()):
                dropped.add_metric([name, reason], count)
            for (primary, shadow, output), stats in sorted(router.book.outputs.items()):
                labels = [name, primary, shadow, output]
                max_abs.add_metric(labels, stats.max_abs.cumulative(), stats.max_abs.sum)
                max_rel.add_metric(labels, stats.max_rel.cumulative(), stats.max_rel.sum)
                if stats.rows:
                    rows.add_metric(labels, stats.rows)
                    top1.add_metric(labels, stats.top1_agreeing)
                    topk.add_metric(labels, stats.topk_agreeing)
        yield from (sent, compared, dropped, max_abs, max_rel, rows, top1, topk)
