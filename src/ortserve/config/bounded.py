"""Limits on configuration text from outside, checked before any parser builds a document.

A load request's JSON and the YAML in its ``ortserve.*`` parameters come from whoever reaches
the control API. Unbounded, 0.8 MB of YAML held every client 16 s, and a 10 KB YAML nested
5,000 deep overflowed the recursive composer (a 500 and a 3,000-line traceback per request).
So the text is measured first: its bytes, then its nesting depth and node count from the
parser's event stream (libyaml's C parser where available, a flat loop with no recursion),
with anchors and aliases refused; only a document within every limit is built. Errors name
the problem and its line, never an excerpt of the text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from ortserve.errors import ConfigError, clip_text

__all__ = ["DEFAULT_LIMITS", "ConfigLimits", "bounded_text", "check_json", "check_yaml", "load_yaml"]

_Loader: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's C loader when PyYAML was built with it (a pure-Python one otherwise)."""


@dataclass(frozen=True, slots=True)
class ConfigLimits:
    """What one configuration document may hold."""

    max_bytes: int = 256 << 10
    max_depth: int = 32
    max_nodes: int = 5_000
    """Mappings, sequences and scalars together (keys count: a key is a scalar). Validating
    a document holds the GIL in one call (pydantic): 20,000 values stalled the event loop
    30 ms, 5,000 stay under 10 ms (benchmarks/RESULTS.md, "Control plane")."""
    max_scalar_chars: int = 16 << 10


DEFAULT_LIMITS = ConfigLimits()


def bounded_text(text: str, limit: int = 400) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out (for messages)."""
    return clip_text(text, limit)


def _too_big(where: str, what: str) -> ConfigError:
    return ConfigError(f"{where}: {what}")


def check_json(text: str, where: str, limits: ConfigLimits = DEFAULT_LIMITS) -> None:
    """Refuse a JSON document past the limits (it is parsed once here, in C, to measure it).

    Raises:
        ConfigError: too large, too deep, too many nodes, or not JSON.
    """
    if len(text) > limits.max_bytes or len(text.encode("utf-8", "surrogatepass")) > limits.max_bytes:
        raise _too_big(where, f"larger than {limits.max_bytes} bytes")
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError as exc:  # orjson refuses nesting past 1,024 itself
        raise _too_big(where, f"not valid JSON ({bounded_text(str(exc).splitlines()[0], 120)})") from None
    nodes = 0
    stack: list[tuple[object, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > limits.max_nodes:
            raise _too_big(where, f"more than {limits.max_nodes} values")
        if isinstance(value, dict | list) and depth > limits.max_depth:
            raise _too_big(where, f"nested deeper than {limits.max_depth}")
        if isinstance(value, dict):
            nodes += len(value)
            stack.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, list):
            stack.extend((child, depth + 1) for child in value)


def check_yaml(text: str, where: str, limits: ConfigLimits = DEFAULT_LIMITS) -> None:
    """Measure a YAML document from its event stream without building it.

    Raises:
        ConfigError: too large, too deep, too many nodes, a scalar too long, an anchor or
            alias, or not YAML (the problem and its line, no excerpt).
    """
    if len(text) > limits.max_bytes or len(text.encode("utf-8", "surrogatepass")) > limits.max_bytes:
        raise _too_big(where, f"larger than {limits.max_bytes} bytes")
    depth = nodes = 0
    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise _too_big(where, "anchors and aliases are not allowed")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                nodes += 1
                if depth > limits.max_depth:
                    raise _too_big(where, f"nested deeper than {limits.max_depth}")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            elif isinstance(event, yaml.ScalarEvent):
                nodes += 1
                if len(event.value) > limits.max_scalar_chars:
                    raise _too_big(where, f"a value longer than {limits.max_scalar_chars} characters")
            if nodes > limits.max_nodes:
                raise _too_big(where, f"more than {limits.max_nodes} values")
    except yaml.YAMLError as exc:
        raise _too_big(where, f"not YAML/JSON: {_problem(exc)}") from None


def load_yaml(text: str, where: str, limits: ConfigLimits = DEFAULT_LIMITS) -> Any:
    """Check ``text`` (:func:`check_yaml`), then build it with the safe (C) loader.

    Raises:
        ConfigError: as :func:`check_yaml`.
    """
    check_yaml(text, where, limits)
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader: plain data only
    except (yaml.YAMLError, RecursionError) as exc:
        raise _too_big(where, f"not YAML/JSON: {_problem(exc)}") from None


def _problem(exc: BaseException) -> str:
    """A YAML error as its problem and position, without the excerpt of the text it quotes."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"
        return bounded_text(f"{exc.problem}{where}", 200)
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return bounded_text(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, 200)


def read_bounded(path: Path, limits: ConfigLimits = DEFAULT_LIMITS) -> bytes:
    """A configuration file's bytes, refused past the size a configuration may have: a file
    in a model folder is read with the same bounds as a load request's text.

    Raises:
        ConfigError: unreadable or too large.
    """
    try:
        with path.open("rb") as handle:
            data = handle.read(limits.max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limits.max_bytes:
        raise ConfigError(f"{path}: larger than {limits.max_bytes} bytes")
    return data
