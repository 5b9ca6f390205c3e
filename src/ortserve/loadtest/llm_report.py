"""``ortserve bench --transport openai``: run the LLM levels, print them, judge the objectives
(latency objectives bound the time to first token), write the JSON result."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click
import orjson

from ortserve.loadtest.llm_load import LlmLevel, LlmRequestSpec, run_llm_level
from ortserve.loadtest.report import environment_stamp
from ortserve.loadtest.slo import Objective

__all__ = ["SLO_EXIT", "bench_llm", "llm_objective_value", "render_llm_table"]

SLO_EXIT = 3


def render_llm_table(levels: list[LlmLevel]) -> str:
    """One line per level: throughput and the latency percentiles in milliseconds."""
    lines = [
        f"{'conc':>5} {'req/s':>8} {'tok/s':>9} {'fail':>5} {'ttft p50':>9} {'ttft p99':>9} "
        f"{'itl p50':>8} {'itl p99':>8} {'e2e p50':>9}"
    ]
    for level in levels:

        def ms(values: dict[str, float], key: str) -> str:
            return f"{values[key] * 1e3:.1f}" if key in values else "-"

        lines.append(
            f"{level.concurrency:>5} {level.requests_per_s:>8.2f} {level.tokens_per_s:>9.1f} {level.failures:>5} "
            f"{ms(level.ttft_s, 'p50'):>9} {ms(level.ttft_s, 'p99'):>9} {ms(level.itl_s, 'p50'):>8} "
            f"{ms(level.itl_s, 'p99'):>8} {ms(level.e2e_s, 'p50'):>9}"
        )
    return "\n".join(lines)


def llm_objective_value(objective: Objective, level: LlmLevel) -> float:
    """The level's value in the objective's unit: TTFT in µs, error rate, requests/s."""
    if objective.metric == "error_rate":
        total = level.requests + level.failures
        return level.failures / total if total else 0.0
    if objective.metric == "rate":
        return level.requests_per_s
    key = "mean" if objective.metric == "mean" else ("p99" if objective.metric == "max" else objective.metric)
    return level.ttft_s.get(key, float("inf")) * 1e6


def bench_llm(
    url: str,
    fields: dict[str, object],
    concurrencies: list[int],
    duration_s: float,
    warmup_s: float,
    objectives: list[Objective],
    output: Path | None,
) -> list[LlmLevel]:
    """Run every level, print the table and verdicts, write JSON; exit 3 if an objective is missed."""
    spec = LlmRequestSpec(**fields)  # type: ignore[arg-type]
    levels = [asyncio.run(run_llm_level(url, spec, c, duration_s, warmup_s)) for c in concurrencies]
    click.echo(render_llm_table(levels))
    verdicts = []
    for level in levels:
        for objective in objectives:
            value = llm_objective_value(objective, level)
            verdicts.append(
                {
                    "level": level.concurrency,
                    "objective": objective.text,
                    "value": value,
                    "ok": objective.met_by(value),
                }
            )
            click.echo(
                f"c={level.concurrency} {objective.text} (ttft): {value:.4g} {'ok' if verdicts[-1]['ok'] else 'MISSED'}"
            )
    if output is not None:
        document = {"command": "bench", "transport": "openai", "url": url, "request": fields,
                    "environment": environment_stamp(), "levels": [level.as_dict() for level in levels],
                    "verdicts": verdicts}  # fmt: skip
        output.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
        click.echo(f"wrote {output}")
    if not all(v["ok"] for v in verdicts):
        raise SystemExit(SLO_EXIT)
    return levels
