"""The selector reader behind the alert and dashboard checks finds what an expression reads."""

from __future__ import annotations

import pytest

from promql_names import Catalogue, Selector, problems, selectors


def test_metrics_matchers_and_grouping_labels_are_found_and_functions_are_not() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (model, le) (rate(x_bucket{model=~"$model", a="b"}[5m])))'
        " / on (model) group_left sum without (c) (y) > bool 0.5"
    )
    found, grouping = selectors(expr)
    assert found == [Selector("x_bucket", (("model", "=~", "$model"), ("a", "=", "b"))), Selector("y", ())]
    assert grouping == {"model", "le", "c"}


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('sum by (model) (rate(m_total{outcome="success"}[1m]))', []),
        ("rate(n_total[1m])", ["unknown metric n_total"]),
        ('m_total{kind="x"}', ["m_total has no label kind"]),
        ('m_total{outcome="lost"}', ["m_total{outcome} never takes 'lost'"]),
        ('m_total{outcome=~"success|gone"}', ["m_total{outcome} never takes ['gone']"]),
        ('m_total{outcome=~"$outcome"}', []),
        ("sum by (instance, job) (m_total)", []),  # added by Prometheus when it scrapes
        ("sum by (zone) (m_total)", ["grouping label zone on none of 'sum by (zone) (m_total)'"]),
    ],
)
def test_problems_name_what_the_server_does_not_expose(expr: str, expected: list[str]) -> None:
    catalogue = Catalogue()
    catalogue.add("m_total", {"model": "a", "outcome": "success"})
    assert problems(expr, catalogue) == expected
