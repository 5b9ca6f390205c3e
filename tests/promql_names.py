"""The metric names, label names and label values a PromQL expression reads, checked against
what a live server exposes: a renamed metric or label breaks the test that reads the deploy files.

Not a PromQL parser (promtool checks syntax): a tokenizer that knows which identifiers are
functions, aggregations and keywords, so that the rest are metric names, whose ``{...}`` holds
label matchers, and the identifiers in ``by (...)``/``without``/``on``/``ignoring`` are labels.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

__all__ = ["Catalogue", "Selector", "problems", "selectors"]

_TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    |(?P<range>\[[^\]]*\])
    |(?P<brace>\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})
    |(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    |(?P<number>[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
    |(?P<punct>[()\[\],=~!<>+\-*/^%])
    |(?P<space>\s+)""",
    re.VERBOSE,
)
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
_AGGREGATIONS = frozenset(
    [
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
    ]
)
_GROUPING = frozenset(["by", "without", "on", "ignoring", "group_left", "group_right"])
_KEYWORDS = frozenset(["and", "or", "unless", "bool", "offset", "inf", "nan"])
_TARGET_LABELS = frozenset(["instance", "job"])
"""Labels Prometheus adds to every series it scrapes."""
_PLAIN_ALTERNATIVES = re.compile(r"^[A-Za-z0-9_.+-]+(\|[A-Za-z0-9_.+-]+)*$")


@dataclass
class Catalogue:
    """Sample name -> label name -> values seen."""

    labels: dict[str, dict[str, set[str]]] = field(default_factory=dict)

    def add(self, name: str, labels: dict[str, str]) -> None:
        known = self.labels.setdefault(name, defaultdict(set))
        for label, value in labels.items():
            known[label].add(value)


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...]


def _tokens(expr: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    position = 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None:
            raise ValueError(f"cannot read {expr[position : position + 20]!r} in {expr!r}")
        kind = match.lastgroup or ""
        if kind != "space":
            found.append((kind, match.group()))
        position = match.end()
    return found


def _matchers(brace: str) -> tuple[tuple[str, str, str], ...]:
    body, found, position = brace[1:-1], [], 0
    while body[position:].strip():
        match = _MATCHER.match(body, position)
        if match is None:
            raise ValueError(f"cannot read the matchers {brace!r}")
        found.append((match.group(1), match.group(2), match.group(3)))
        position = match.end()
    return tuple(found)


def selectors(expr: str) -> tuple[list[Selector], set[str]]:
    """The metric selectors of ``expr`` and the label names its grouping clauses name."""
    tokens = _tokens(expr)
    found: list[Selector] = []
    grouping: set[str] = set()
    index = 0
    while index < len(tokens):
        kind, text = tokens[index]
        following = tokens[index + 1] if index + 1 < len(tokens) else ("", "")
        index += 1
        if kind != "ident":
            continue
        if text in _GROUPING:
            if following == ("punct", "("):
                index += 1
                while index < len(tokens) and tokens[index] != ("punct", ")"):
                    if tokens[index][0] == "ident":
                        grouping.add(tokens[index][1])
                    index += 1
            continue
        if text in _AGGREGATIONS or text in _KEYWORDS or following == ("punct", "("):
            continue
        matchers: tuple[tuple[str, str, str], ...] = ()
        if following[0] == "brace":
            matchers = _matchers(following[1])
            index += 1
        found.append(Selector(text, matchers))
    return found, grouping


def problems(expr: str, catalogue: Catalogue) -> list[str]:
    """What ``expr`` reads that the catalogue does not have; empty when everything exists.

    Label values are checked for ``=`` and plain ``a|b`` regexes; values naming a Grafana
    variable (``$model``) are not.
    """
    found: list[str] = []
    chosen, grouping = selectors(expr)
    seen_labels: set[str] = set()
    for selector in chosen:
        labels = catalogue.labels.get(selector.metric)
        if labels is None:
            found.append(f"unknown metric {selector.metric}")
            continue
        seen_labels.update(labels)
        for label, op, value in selector.matchers:
            if label not in labels:
                found.append(f"{selector.metric} has no label {label}")
            elif "$" in value or op in ("!=", "!~"):
                continue
            elif op == "=" and value not in labels[label]:
                found.append(f"{selector.metric}{{{label}}} never takes {value!r}")
            elif op == "=~" and _PLAIN_ALTERNATIVES.match(value):
                missing = [v for v in value.split("|") if v not in labels[label]]
                if missing:
                    found.append(f"{selector.metric}{{{label}}} never takes {missing}")
    unseen = grouping - seen_labels - _TARGET_LABELS
    found.extend(f"grouping label {label} on none of {expr!r}" for label in sorted(unseen))
    return found
