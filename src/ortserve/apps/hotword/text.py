"""Chinese word segmentation: jieba over a pruned dictionary written at training."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from pathlib import Path

with warnings.catch_warnings():
    # jieba 0.42 may import pkg_resources, which warns on recent setuptools.
    warnings.simplefilter("ignore")
    import jieba

__all__ = ["DICTIONARY", "Segmenter", "write_dictionary"]

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

    def search(self, text: str) -> list[str]:
        """Search-mode tokens of ``text`` (words and the dictionary words inside them), without
        whitespace and punctuation-only tokens."""
        return [t for t in self._tokenizer.lcut_for_search(text, HMM=False) if any(c.isalnum() for c in t)]
