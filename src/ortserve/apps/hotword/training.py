"""Training the hotword model on the generated log and writing model.onnx plus its artefacts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ortserve.apps.hotword.features import Featurizer
from ortserve.apps.hotword.text import Segmenter, TfIdf, write_dictionary
from ortserve.apps.hotword.world import HOTWORDS, NOISE_TERMS, LogRecord, generate_log
from ortserve.apps.mlp import MlpWeights, export_mlp, train_mlp

__all__ = ["ARTEFACTS", "HotwordArtefacts", "domain_words", "featurize", "train_hotword"]

ARTEFACTS = "hotword.json"
INPUT = "features"
OUTPUT = "scores"


def domain_words() -> list[str]:
    """Every term the world's queries are made of (added to jieba's dictionary)."""
    return sorted({t for h in HOTWORDS for t in h.terms} | set(NOISE_TERMS))


@dataclass(frozen=True, slots=True)
class HotwordArtefacts:
    """What the pipeline needs beside the ONNX model: vocabulary, IDF, labels, base rates."""

    vocabulary: list[str]
    idf: list[float]
    hotwords: list[str]
    prior: list[float]
    words: list[str]

    def save(self, version_dir: Path) -> None:
        (version_dir / ARTEFACTS).write_text(json.dumps(_as_dict(self), ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, version_dir: Path) -> HotwordArtefacts:
        return cls(**json.loads((version_dir / ARTEFACTS).read_text(encoding="utf-8")))


def _as_dict(a: HotwordArtefacts) -> dict[str, list[str] | list[float]]:
    return {
        "vocabulary": a.vocabulary,
        "idf": a.idf,
        "hotwords": a.hotwords,
        "prior": a.prior,
        "words": a.words,
    }


def featurize(records: list[LogRecord], segmenter: Segmenter, featurizer: Featurizer) -> np.ndarray:
    """Feature rows for a log."""
    x = np.zeros((len(records), featurizer.width), dtype=np.float32)
    for row, record in zip(x, records, strict=True):
        featurizer.write(row, segmenter.cut(record.query), record.region_id, record.timestamp_ms)
    return x


def train_hotword(version_dir: Path, seed: int = 7, samples: int = 12000, epochs: int = 20) -> MlpWeights:
    """Generate the log, learn TF-IDF and the MLP, write ``model.onnx`` and the artefacts."""
    version_dir.mkdir(parents=True, exist_ok=True)
    words = domain_words()
    write_dictionary(version_dir, words)
    segmenter = Segmenter(version_dir)
    log = generate_log(samples, seed)
    tfidf = TfIdf.fit([segmenter.cut(r.query) for r in log])
    featurizer = Featurizer(tfidf)
    x = featurize(log, segmenter, featurizer)
    y = np.zeros((len(log), len(HOTWORDS)), dtype=np.float32)
    y[np.arange(len(log)), [r.clicked for r in log]] = 1.0
    weights = train_mlp(x, y, hidden=48, epochs=epochs, seed=seed)
    onnx.save(export_mlp(weights, "hotword", INPUT, OUTPUT), str(version_dir / "model.onnx"))
    HotwordArtefacts(
        tfidf.vocabulary,
        [float(v) for v in tfidf.idf],
        [h.word for h in HOTWORDS],
        [float(v) for v in y.mean(0)],
        words,
    ).save(version_dir)
    return weights
