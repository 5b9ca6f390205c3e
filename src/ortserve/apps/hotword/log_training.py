"""Training a hotword model version from a real search log: the corpus learns new words and
their heat, the ranker learns from the clicks.

The log is JSON Lines, one search per line: ``query``, ``clicked`` (the hotword the user
chose), ``timestamp`` (Unix ms) and ``region_id`` (0 national). A clicked word the corpus does
not hold becomes a hotword of its own (category 新词, its terms the query's words, national, or
the province most of its clicks came from), so a product launched this week (iphone 17) is
suggested this week. Every hotword's popularity (``base``) grows with its clicks in the log's
last ``RECENT_DAYS`` days. The ranker is trained on the log's searches, mixed with the
generated log (which keeps every corpus entry and season represented when the real log is
small), and the version folder is written whole: corpus, dictionary, model, feature list;
``ortserve.complete`` last, so a polled repository loads it only once it is all there.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from ortserve.apps.hotword.corpus import CORPUS, Entry, SeasonCalendar, copy_seed_corpus, load_corpus
from ortserve.apps.hotword.features import FEATURE_NAMES, Featurizer
from ortserve.apps.hotword.request import MAX_QUERY_CHARS
from ortserve.apps.hotword.retrieval import STOPWORDS, Index, normalise
from ortserve.apps.hotword.text import Segmenter, write_dictionary
from ortserve.apps.hotword.training import ARTEFACTS, INPUT, OUTPUT, domain_words, examples
from ortserve.apps.hotword.world import LogRecord, generate_log, province_of
from ortserve.apps.mlp import export_mlp, train_mlp
from ortserve.errors import ConfigError
from ortserve.repository.snapshot import COMPLETE_MARKER

__all__ = ["MAX_LOG_LINES", "RECENT_DAYS", "LogSearch", "example_log", "read_log", "train_from_log"]

MAX_LOG_LINES = 2_000_000
RECENT_DAYS = 7
"""Clicks this close to the log's last search make a hotword hot now."""
NEW_CATEGORY = "新词"
_DAY_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class LogSearch:
    """One line of the log."""

    query: str
    clicked: str
    timestamp_ms: int
    region_id: int


def read_log(path: Path) -> list[LogSearch]:
    """Every search of a JSONL log.

    Raises:
        ConfigError: naming the file and line of a malformed search, or an empty log.
    """
    searches = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if number > MAX_LOG_LINES:
                raise ConfigError(f"{path}: more than {MAX_LOG_LINES:,} searches")
            if line.strip():
                searches.append(_search(line, f"{path}:{number}"))
    if not searches:
        raise ConfigError(f"{path}: the log holds no search")
    return searches


def _search(line: str, where: str) -> LogSearch:
    try:
        document = json.loads(line)
    except ValueError:
        raise ConfigError(f"{where}: not JSON") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{where}: a search is a JSON object")
    query, clicked = document.get("query"), document.get("clicked")
    stamp, region = document.get("timestamp"), document.get("region_id", 0)
    if not isinstance(query, str) or not 0 < len(query.strip()) <= MAX_QUERY_CHARS:
        raise ConfigError(f"{where}: 'query' must be a string of 1 to {MAX_QUERY_CHARS} characters")
    if not isinstance(clicked, str) or not 0 < len(clicked.strip()) <= MAX_QUERY_CHARS or "\t" in clicked:
        raise ConfigError(f"{where}: 'clicked' must be a hotword of 1 to {MAX_QUERY_CHARS} characters")
    if isinstance(stamp, bool) or not isinstance(stamp, int) or stamp <= 0:
        raise ConfigError(f"{where}: 'timestamp' must be Unix milliseconds")
    if isinstance(region, bool) or not isinstance(region, int) or (region and province_of(region) is None):
        raise ConfigError(f"{where}: 'region_id' must be 0 or a Chinese administrative code")
    return LogSearch(query.strip(), clicked.strip(), stamp, region)


def _grown_corpus(entries: list[Entry], searches: Sequence[LogSearch], segment: Segmenter) -> list[Entry]:
    """The corpus with the log's new words added and every word's heat from its recent clicks."""
    known = {normalise(e.word) for e in entries}
    newest = max(s.timestamp_ms for s in searches)
    recent = Counter(
        normalise(s.clicked) for s in searches if newest - s.timestamp_ms <= RECENT_DAYS * _DAY_MS
    )
    fresh: dict[str, list[LogSearch]] = defaultdict(list)
    for search in searches:
        if normalise(search.clicked) not in known:
            fresh[search.clicked].append(search)
    grown = [replace(e, base=_heated(e.base, recent[normalise(e.word)])) for e in entries]
    for word, clicks in fresh.items():
        terms = {t for s in clicks for t in segment.search(normalise(s.query))} | set(
            segment.search(normalise(word))
        )
        terms -= STOPWORDS
        provinces = Counter(province_of(s.region_id) or 0 for s in clicks)
        region, count = provinces.most_common(1)[0]
        region = region if region and count >= 0.8 * len(clicks) else 0
        base = _heated(0.5, recent[normalise(word)])
        grown.append(Entry(word, tuple(sorted(terms)) or (word,), NEW_CATEGORY, region, None, base))
    return grown


def _heated(base: float, recent_clicks: int) -> float:
    """A hotword's popularity after ``recent_clicks`` clicks in the log's last week."""
    return round(base * (1.0 + math.log1p(recent_clicks)), 2)


def _write_corpus(path: Path, entries: Sequence[Entry]) -> None:
    lines = ["word\tterms\tcategory\tregion\tseason\tbase"]
    for e in entries:
        season = f"{e.season[0]}:{e.season[1]}" if e.season else ""
        lines.append(f"{e.word}\t{' '.join(e.terms)}\t{e.category}\t{e.region}\t{season}\t{e.base:.2f}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _records(searches: Sequence[LogSearch], entries: Sequence[Entry]) -> Iterator[LogRecord]:
    index = {normalise(e.word): i for i, e in enumerate(entries)}
    for search in searches:
        yield LogRecord(search.query, search.region_id, search.timestamp_ms, index[normalise(search.clicked)])


def train_from_log(
    log: Path, version_dir: Path, seed: int = 7, generated: int = 4000, epochs: int = 12
) -> tuple[int, int]:
    """Write a hotword model version trained on ``log`` into ``version_dir``.

    Returns:
        (searches read, hotwords added to the corpus).

    Raises:
        ConfigError: a malformed log, or a folder that already holds a model.
    """
    searches = read_log(log)
    if (version_dir / "model.onnx").exists():
        raise ConfigError(f"{version_dir} already holds a model: give a new version folder")
    version_dir.mkdir(parents=True, exist_ok=True)
    seed_entries = load_corpus(copy_seed_corpus(version_dir))
    write_dictionary(version_dir, domain_words(seed_entries) + [s.clicked for s in searches])
    entries = _grown_corpus(seed_entries, searches, Segmenter(version_dir))
    _write_corpus(version_dir / CORPUS, entries)
    write_dictionary(version_dir, domain_words(entries) + [e.word for e in entries])
    index = Index(entries, Segmenter(version_dir).search)
    calendar = SeasonCalendar(entries)
    featurizer = Featurizer(entries, calendar)
    x_real, y_real = examples(list(_records(searches, entries)), index, featurizer, seed)
    x_gen, y_gen = examples(
        generate_log(entries, generated, seed, calendar=calendar), index, featurizer, seed
    )
    weights = train_mlp(
        np.concatenate([x_real, x_gen]), np.concatenate([y_real, y_gen]), hidden=24, epochs=epochs, seed=seed
    )
    onnx.save(export_mlp(weights, "hotword", INPUT, OUTPUT), str(version_dir / "model.onnx"))
    (version_dir / ARTEFACTS).write_text(json.dumps({"features": list(FEATURE_NAMES)}), encoding="utf-8")
    (version_dir / COMPLETE_MARKER).write_text("", encoding="utf-8")
    return len(searches), len(entries) - len(seed_entries)


def example_log(size: int, seed: int = 7) -> Iterator[str]:
    """The demo's generated search log as JSONL lines (the format ``train_from_log`` reads)."""
    with_corpus = Path(__file__).parent / "data" / CORPUS
    entries = load_corpus(with_corpus)
    for record in generate_log(entries, size, seed):
        line = {
            "query": record.query,
            "clicked": entries[record.clicked].word,
            "timestamp": record.timestamp_ms,
            "region_id": record.region_id,
        }
        yield json.dumps(line, ensure_ascii=False)
