"""Training the hotword ranker on the generated log; writes model.onnx, the corpus, the
tokenizer's dictionary and the feature list into the version folder."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx

from ortserve.apps.hotword.corpus import Entry, SeasonCalendar, copy_seed_corpus, load_corpus
from ortserve.apps.hotword.features import FEATURE_NAMES, Featurizer
from ortserve.apps.hotword.holidays import china_time
from ortserve.apps.hotword.retrieval import Index
from ortserve.apps.hotword.text import Segmenter, write_dictionary
from ortserve.apps.hotword.world import FILLERS, LogRecord, generate_log
from ortserve.apps.mlp import MlpWeights, export_mlp, train_mlp

__all__ = ["ARTEFACTS", "INPUT", "OUTPUT", "domain_words", "examples", "train_hotword"]

ARTEFACTS = "hotword.json"
INPUT = "features"
OUTPUT = "scores"
_NEGATIVES = 12


def domain_words(entries: Sequence[Entry]) -> list[str]:
    """Every part and synonym of the corpus, and the fillers (added to jieba's dictionary)."""
    return sorted({t for e in entries for t in e.terms} | set(FILLERS))


def examples(
    log: Sequence[LogRecord], index: Index, featurizer: Featurizer, seed: int
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """Rows of each search's candidates (the clicked one, then up to ``_NEGATIVES`` others:
    the most relevant half and a random half), labelled 1 for the click."""
    rng = np.random.default_rng(seed)
    rows, labels = [], []
    for record in log:
        matches = index.match(record.query, record.region_id)
        hit = np.flatnonzero(matches.index == record.clicked)
        if not len(hit):
            continue
        matrix = featurizer.rows(matches, record.region_id, china_time(record.timestamp_ms).date()).matrix
        others = np.delete(np.arange(len(matches.index)), hit[0])
        half = _NEGATIVES // 2
        chosen = np.concatenate([others[:half], rng.permutation(others[half:])[:half]]).astype(np.int64)
        rows.append(matrix[np.concatenate([hit[:1], chosen])])
        labels.append(np.r_[1.0, np.zeros(len(chosen))])
    return np.concatenate(rows), np.concatenate(labels).astype(np.float32)[:, None]


def train_hotword(version_dir: Path, seed: int = 7, samples: int = 6000, epochs: int = 12) -> MlpWeights:
    """Copy the corpus, generate the log, fit the ranker, write ``model.onnx`` and artefacts."""
    version_dir.mkdir(parents=True, exist_ok=True)
    entries = load_corpus(copy_seed_corpus(version_dir))
    write_dictionary(version_dir, domain_words(entries))
    index = Index(entries, Segmenter(version_dir).search)
    calendar = SeasonCalendar(entries)
    log = generate_log(entries, samples, seed, calendar=calendar)
    x, y = examples(log, index, Featurizer(entries, calendar), seed)
    weights = train_mlp(x, y, hidden=24, epochs=epochs, seed=seed)
    onnx.save(export_mlp(weights, "hotword", INPUT, OUTPUT), str(version_dir / "model.onnx"))
    (version_dir / ARTEFACTS).write_text(json.dumps({"features": list(FEATURE_NAMES)}), encoding="utf-8")
    return weights
