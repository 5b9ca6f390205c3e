"""Query text to numbers: jieba segmentation and TF-IDF over the vocabulary learned in training."""

from __future__ import annotations

import logging
import math
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

with warnings.catch_warnings():
    # jieba 0.42 may import pkg_resources, which warns on recent setuptools.
    warnings.simplefilter("ignore")
    import jieba

__all__ = ["DICTIONARY", "Segmenter", "TfIdf", "write_dictionary"]

jieba.setLogLevel(logging.WARNING)


DICTIONARY = "dictionary.txt"
_DOMAIN_FREQ = 100000


def write_dictionary(version_dir: Path, words: Iterable[str], size: int = 20000) -> Path:
    """A jieba dictionary: the ``size`` most frequent words of jieba's bundled dictionary plus
    the domain words; a tenth of the full one, so a tokenizer loads in tens of milliseconds."""
    bundled = Path(jieba.__file__).parent / "dict.txt"
    entries = []
    for line in bundled.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) >= 2:
            entries.append((int(parts[1]), parts[0], parts[2] if len(parts) > 2 else "n"))
    entries.sort(key=lambda e: (-e[0], e[1]))
    lines = [f"{word} {freq} {tag}" for freq, word, tag in entries[:size]]
    lines += [f"{word} {_DOMAIN_FREQ} n" for word in sorted(set(words))]
    path = version_dir / DICTIONARY
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class Segmenter:
    """Chinese word segmentation with jieba over the dictionary written at training.

    Args:
        version_dir: the model version folder holding ``dictionary.txt``; jieba's cache of it
            is kept there too, so nothing is written elsewhere.
    """

    def __init__(self, version_dir: Path) -> None:
        folder = version_dir.resolve()
        self._tokenizer = jieba.Tokenizer(str(folder / DICTIONARY))
        self._tokenizer.cache_file = str(folder / "jieba.cache")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._tokenizer.initialize()

    def cut(self, text: str) -> list[str]:
        """Tokens of ``text``, dropping whitespace and punctuation-only tokens."""
        return [t for t in self._tokenizer.lcut(text, HMM=False) if any(c.isalnum() for c in t)]


class TfIdf:
    """L2-normalised TF-IDF over a fixed vocabulary (smooth IDF, like scikit-learn's default).

    Args:
        vocabulary: the terms, in feature order.
        idf: one weight per term.
    """

    def __init__(self, vocabulary: Sequence[str], idf: Sequence[float]) -> None:
        self.vocabulary = list(vocabulary)
        self.idf = np.asarray(idf, dtype=np.float32)
        self._index = {term: i for i, term in enumerate(self.vocabulary)}

    @classmethod
    def fit(cls, documents: Sequence[Sequence[str]], min_df: int = 2) -> TfIdf:
        """Learn the vocabulary (terms in at least ``min_df`` documents) and their IDF."""
        df = Counter(term for doc in documents for term in set(doc))
        vocabulary = sorted(term for term, count in df.items() if count >= min_df)
        n = len(documents)
        idf = [math.log((1 + n) / (1 + df[term])) + 1 for term in vocabulary]
        return cls(vocabulary, idf)

    def transform(self, tokens: Sequence[str], out: npt.NDArray[np.float32]) -> None:
        """Write one document's vector into ``out`` (zeros for out-of-vocabulary queries)."""
        out[:] = 0
        for term, count in Counter(tokens).items():
            index = self._index.get(term)
            if index is not None:
                out[index] = count * self.idf[index]
        norm = float(np.sqrt(np.dot(out, out)))
        if norm > 0:
            out /= norm
