"""The dashboards' content: which panels each board has and the PromQL behind every panel."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Dashboard", "Panel", "dashboards", "expressions"]

_RATE = "[$__rate_interval]"
_MODEL = 'model=~"$model"'
_SERVER_ERRORS = 'outcome=~"internal|unavailable|deadline"'


@dataclass(frozen=True)
class Panel:
    """One chart: a title, its queries (PromQL, legend), a unit and a kind."""

    title: str
    queries: tuple[tuple[str, str], ...]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 12
    description: str = ""


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    model_variable: bool = True
    tags: tuple[str, ...] = field(default=("ortserve",))


def _quantiles(metric: str, selector: str, by: str = "") -> tuple[tuple[str, str], ...]:
    group = f"{by}, le" if by else "le"
    legend = f"{{{{{by}}}}} " if by else ""
    braces = f"{{{selector}}}" if selector else ""
    return tuple(
        (
            f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{braces}{_RATE})))",
            f"{legend}p{round(q * 100)}",
        )
        for q in (0.5, 0.99)
    )


def _mean(metric: str, selector: str, by: str, legend: str) -> tuple[str, str]:
    return (
        f"sum by ({by}) (rate({metric}_sum{{{selector}}}{_RATE}))"
        f" / sum by ({by}) (rate({metric}_count{{{selector}}}{_RATE}))",
        legend,
    )


def _overview() -> Dashboard:
    return Dashboard(
        "ortserve-overview",
        "ortserve / overview",
        "Traffic, errors and saturation of every model on every server.",
        (
            Panel(
                "Requests/s by outcome",
                (("sum by (outcome) (rate(ortserve_requests_total" + _RATE + "))", "{{outcome}}"),),
                "reqps",
            ),
            Panel(
                "Server error ratio by model",
                (
                    (
                        f"sum by (model) (rate(ortserve_requests_total{{{_SERVER_ERRORS}}}{_RATE}))"
                        f" / sum by (model) (rate(ortserve_requests_total{_RATE}))",
                        "{{model}}",
                    ),
                ),
                "percentunit",
            ),
            Panel(
                "p99 latency by model",
                _quantiles("ortserve_request_duration_seconds", "", "model")[1:],
                "s",
            ),
            Panel(
                "Refused (429) and deadline (504) requests/s",
                (
                    (
                        "sum by (model, outcome) (rate(ortserve_requests_total"
                        '{outcome=~"overloaded|deadline"}' + _RATE + "))",
                        "{{model}} {{outcome}}",
                    ),
                ),
                "reqps",
            ),
            Panel(
                "Requests/s by tenant (admitted, refused by its quota)",
                (
                    (
                        "sum by (tenant, outcome) (rate(ortserve_tenant_requests_total" + _RATE + "))",
                        "{{tenant}} {{outcome}}",
                    ),
                ),
                "reqps",
                description="Empty unless --api-key or --tenant-quota is set.",
            ),
            Panel(
                "Queue depth and busy instances",
                (
                    ("sum by (model) (ortserve_queue_depth)", "{{model}} queued"),
                    ("sum by (model) (ortserve_busy_instances)", "{{model}} running"),
                ),
            ),
            Panel(
                "Requests in flight by transport",
                (("sum by (transport) (ortserve_inflight_requests)", "{{transport}}"),),
            ),
            Panel(
                "Event-loop lag",
                (("max by (instance) (ortserve_event_loop_lag_seconds)", "{{instance}}"),),
                "s",
                description="Above a few ms the loop is the bottleneck; --intake-lag-ms parks sockets past it.",
            ),
            Panel(
                "Connections",
                (
                    ("sum(ortserve_connections_open)", "open"),
                    ("sum(rate(ortserve_connections_refused_total" + _RATE + "))", "refused/s"),
                    ("sum(rate(ortserve_connections_evicted_total" + _RATE + "))", "evicted/s"),
                ),
            ),
            Panel(
                "CPU (cores)",
                (("sum by (instance) (rate(process_cpu_seconds_total" + _RATE + "))", "{{instance}} CPU"),),
                "short",
            ),
            Panel(
                "GC pauses p99 by generation",
                _quantiles("ortserve_gc_pause_seconds", "", "generation")[1:],
                "s",
                description="A collection holds the GIL: every request waits it out.",
            ),
            Panel(
                "Resident memory",
                (("sum by (instance) (process_resident_memory_bytes)", "{{instance}}"),),
                "bytes",
            ),
        ),
        model_variable=False,
    )


def _per_model() -> Dashboard:
    selector = _MODEL
    return Dashboard(
        "ortserve-model",
        "ortserve / per model",
        "One model: latency distribution and trend, where the time goes, batching and refusals.",
        (
            Panel(
                "Latency heatmap",
                (
                    (
                        "sum by (le) (increase(ortserve_request_duration_seconds_bucket{"
                        + selector
                        + "}"
                        + _RATE
                        + "))",
                        "{{le}}",
                    ),
                ),
                "s",
                kind="heatmap",
                width=24,
            ),
            Panel(
                "p50 / p99 latency by version",
                _quantiles("ortserve_request_duration_seconds", selector, "version"),
                "s",
            ),
            Panel(
                "Requests/s by version and outcome",
                (
                    (
                        f"sum by (version, outcome) (rate(ortserve_requests_total{{{selector}}}{_RATE}))",
                        "v{{version}} {{outcome}}",
                    ),
                ),
                "reqps",
            ),
            Panel(
                "Queue wait vs compute (mean per request)",
                (
                    _mean("ortserve_queue_wait_seconds", selector, "version", "v{{version}} queue"),
                    _mean("ortserve_compute_seconds", selector, "version, phase", "v{{version}} {{phase}}"),
                ),
                "s",
                description="Queue wait grows under load; compute is input assembly, the ORT run and output split.",
            ),
            Panel(
                "Queue wait p99",
                _quantiles("ortserve_queue_wait_seconds", selector, "version")[1:],
                "s",
            ),
            Panel(
                "Batch size (rows and requests per execution)",
                (
                    _mean("ortserve_batch_rows", selector, "version", "v{{version}} rows"),
                    _mean("ortserve_batch_requests", selector, "version", "v{{version}} requests"),
                ),
            ),
            Panel(
                "Refusals by reason",
                (
                    (
                        "sum by (reason) (rate(ortserve_scheduler_rejections_total{"
                        + selector
                        + "}"
                        + _RATE
                        + "))",
                        "{{reason}}",
                    ),
                ),
                "reqps",
            ),
            Panel(
                "Queue depth and busy instances",
                (
                    (f"sum by (version) (ortserve_queue_depth{{{selector}}})", "v{{version}} queued"),
                    (f"sum by (version) (ortserve_busy_instances{{{selector}}})", "v{{version}} running"),
                ),
            ),
            Panel(
                "ONNX Runtime kernel time by operator (on-demand profiles)",
                (
                    (
                        f"topk(10, sum by (op_type) (increase(ortserve_ort_op_seconds_total{{{selector}}}[1h])))",
                        "{{op_type}}",
                    ),
                ),
                "s",
                description="Filled by POST /v2/models/{model}/profile; empty until a profile ran.",
            ),
            Panel(
                "Failed executions/s",
                (
                    (
                        f"sum by (version) (rate(ortserve_batch_failures_total{{{selector}}}{_RATE}))",
                        "v{{version}}",
                    ),
                ),
                "ops",
            ),
        ),
    )


def _llm() -> Dashboard:
    selector = _MODEL
    return Dashboard(
        "ortserve-llm",
        "ortserve / LLM",
        "Generation: throughput, time to first token, inter-token latency, the batch and the KV cache.",
        (
            Panel(
                "Tokens/s",
                (
                    (
                        f"sum by (model) (rate(ortserve_llm_generation_tokens_total{{{selector}}}{_RATE}))",
                        "{{model}} generated",
                    ),
                    (
                        f"sum by (model) (rate(ortserve_llm_prompt_tokens_total{{{selector}}}{_RATE}))",
                        "{{model}} prompt",
                    ),
                    (
                        f"sum by (model) (rate(ortserve_llm_cached_prompt_tokens_total{{{selector}}}{_RATE}))",
                        "{{model}} prompt (cached)",
                    ),
                ),
                "short",
            ),
            Panel(
                "Time to first token",
                _quantiles("ortserve_llm_time_to_first_token_seconds", selector, "model"),
                "s",
            ),
            Panel(
                "Inter-token latency",
                _quantiles("ortserve_llm_inter_token_latency_seconds", selector, "model"),
                "s",
            ),
            Panel(
                "End-to-end request latency",
                _quantiles("ortserve_llm_e2e_request_seconds", selector, "model"),
                "s",
            ),
            Panel(
                "Running and waiting sequences",
                (
                    (f"sum by (model) (ortserve_llm_running_sequences{{{selector}}})", "{{model}} running"),
                    (f"sum by (model) (ortserve_llm_waiting_sequences{{{selector}}})", "{{model}} waiting"),
                ),
            ),
            Panel(
                "KV cache",
                ((f"sum by (model) (ortserve_llm_kv_cache_bytes{{{selector}}})", "{{model}}"),),
                "bytes",
            ),
            Panel(
                "Prefix cache hit ratio",
                ((f"max by (model) (ortserve_llm_prefix_cache_hit_ratio{{{selector}}})", "{{model}}"),),
                "percentunit",
            ),
            Panel(
                "Engine step time share of wall time",
                (
                    (
                        f"sum by (model) (rate(ortserve_llm_engine_step_seconds_total{{{selector}}}{_RATE}))",
                        "{{model}} step",
                    ),
                    (
                        f"sum by (model) (rate(ortserve_llm_model_run_seconds_total{{{selector}}}{_RATE}))",
                        "{{model}} model run",
                    ),
                ),
                "percentunit",
            ),
        ),
    )


def _lifecycle() -> Dashboard:
    return Dashboard(
        "ortserve-lifecycle",
        "ortserve / lifecycle and routing",
        "Loads, reloads and failures; fallback levels and breakers; routing splits and rollouts.",
        (
            Panel(
                "Version states",
                (
                    (
                        "max by (model, version, state) (ortserve_model_state) > 0",
                        "{{model}} v{{version}} {{state}}",
                    ),
                ),
                kind="table",
                width=24,
            ),
            Panel(
                "Loads, unloads and load failures (per hour)",
                (
                    ("sum by (model) (increase(ortserve_model_loads_total[1h]))", "{{model}} loads"),
                    ("sum by (model) (increase(ortserve_model_unloads_total[1h]))", "{{model}} unloads"),
                    (
                        "sum by (model) (increase(ortserve_model_load_failures_total[1h]))",
                        "{{model}} failures",
                    ),
                ),
            ),
            Panel(
                "Load and warm-up time",
                (
                    (
                        "max by (model, version) (ortserve_model_load_duration_seconds)",
                        "{{model}} v{{version}}",
                    ),
                ),
                "s",
            ),
            Panel(
                "Fallback level (0: primary)",
                (("max by (model, version) (ortserve_fallback_level)", "{{model}} v{{version}}"),),
            ),
            Panel(
                "Open breakers",
                (
                    (
                        "max by (model, version, level) (ortserve_breaker_open)",
                        "{{model}} v{{version}} level {{level}}",
                    ),
                ),
            ),
            Panel(
                "Routed requests/s by version and reason",
                (
                    (
                        "sum by (model, version, reason) (rate(ortserve_routing_requests_total"
                        + _RATE
                        + "))",
                        "{{model}} v{{version}} {{reason}}",
                    ),
                ),
                "reqps",
            ),
            Panel(
                "Rollout share in force",
                (("max by (model, candidate) (ortserve_rollout_share_percent)", "{{model}} v{{candidate}}"),),
                "percent",
            ),
            Panel(
                "Rollout events",
                (
                    (
                        "sum by (model, candidate, event) (increase(ortserve_rollout_events_total[1h]))",
                        "{{model}} v{{candidate}} {{event}}",
                    ),
                ),
            ),
            Panel(
                "Version roles",
                (
                    (
                        "max by (model, version, role) (ortserve_version_role) > 0",
                        "{{model}} v{{version}} {{role}}",
                    ),
                ),
                kind="table",
            ),
        ),
        model_variable=False,
    )


def dashboards() -> list[Dashboard]:
    """Every dashboard, in file order."""
    return [_overview(), _per_model(), _llm(), _lifecycle()]


def expressions(dashboard: Dashboard) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) for every query of ``dashboard``."""
    for panel in dashboard.panels:
        for expr, _ in panel.queries:
            yield panel.title, expr
