"""The ``POST /v1/predict`` body, validated strictly: every error names its field."""

from __future__ import annotations

from dataclasses import dataclass

from ortserve.apps.hotword.world import province_of
from ortserve.errors import InvalidInput

__all__ = ["DEFAULT_TOP_K", "MAX_QUERY_CHARS", "MAX_TOP_K", "HotwordRequest", "parse_hotword_request"]

MAX_QUERY_CHARS = 64
DEFAULT_TOP_K = 5
MAX_TOP_K = 50
_FIELDS = frozenset({"query", "region_id", "timestamp", "top_k", "user_id", "ab_tag"})
_ROUTING = ("user_id", "ab_tag")
"""Routing's body fields (docs/traffic.md): a model with a routing policy strips them before
the pipeline parses; without one they are accepted here and change nothing in the answer."""
MAX_ROUTING_CHARS = 128
_EARLIEST_MS = 946_684_800_000  # 2000-01-01
_LATEST_MS = 4_102_444_800_000  # 2100-01-01


@dataclass(frozen=True, slots=True)
class HotwordRequest:
    """A search context: the query typed, the region (0 national), the time (Unix ms) and how
    many hotwords to answer."""

    query: str
    region_id: int
    timestamp_ms: int
    top_k: int = DEFAULT_TOP_K


def _integer(document: dict[str, object], name: str) -> int:
    value = document[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"field {name!r} must be an integer, not {type(value).__name__}")
    return value


def _query(document: dict[str, object]) -> str:
    if "query" not in document:
        raise InvalidInput("field 'query' is required")
    query = document["query"]
    if not isinstance(query, str):
        raise InvalidInput(f"field 'query' must be a string, not {type(query).__name__}")
    query = query.strip()
    if not query:
        raise InvalidInput("field 'query' must not be empty")
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidInput(f"field 'query' is longer than {MAX_QUERY_CHARS} characters")
    return query


def parse_hotword_request(document: object) -> HotwordRequest:
    """Raises: InvalidInput naming the field (unknown, missing, wrong type, out of range)."""
    if not isinstance(document, dict):
        raise InvalidInput("the request body must be a JSON object")
    unknown = sorted(set(document) - _FIELDS)
    if unknown:
        raise InvalidInput(f"unknown field {unknown[0]!r}; the fields are {sorted(_FIELDS)}")
    for name in _ROUTING:
        value = document.get(name)
        if value is not None and not (isinstance(value, (str, int)) and not isinstance(value, bool)):
            raise InvalidInput(f"field {name!r} must be a string or an integer")
        if isinstance(value, str) and len(value) > MAX_ROUTING_CHARS:
            raise InvalidInput(f"field {name!r} is longer than {MAX_ROUTING_CHARS} characters")
    query = _query(document)
    region = _integer(document, "region_id") if "region_id" in document else 0
    if region != 0 and (not 100000 <= region <= 999999 or province_of(region) is None):
        raise InvalidInput(f"field 'region_id': {region} is not 0 or a Chinese administrative code")
    if "timestamp" not in document:
        raise InvalidInput("field 'timestamp' is required")
    timestamp = _integer(document, "timestamp")
    if not _EARLIEST_MS <= timestamp < _LATEST_MS:
        raise InvalidInput("field 'timestamp' must be Unix milliseconds between 2000 and 2100")
    top_k = _integer(document, "top_k") if "top_k" in document else DEFAULT_TOP_K
    if not 1 <= top_k <= MAX_TOP_K:
        raise InvalidInput(f"field 'top_k' must be from 1 to {MAX_TOP_K}")
    return HotwordRequest(query, region, timestamp, top_k)
