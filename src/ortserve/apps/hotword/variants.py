"""Queries typed in another script: traditional characters and toneless pinyin, read as the
simplified words the corpus is written in.

Traditional text (國慶) is converted character by character to simplified (国庆) with OpenCC's
tables. A query of Latin letters only (guoqing, guoqinglvyou) is read as pinyin: it is cut into
the pinyin of words the corpus knows (longest words first, fewest pieces), and each piece is
replaced by its word. A Latin query that is a corpus word itself (iphone) is left alone, and
one that cannot be cut entirely into known pinyin (qwertyzx) is left alone too, so it still
matches nothing rather than something invented.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

__all__ = ["MAX_PINYIN_CHARS", "QueryVariants"]

MAX_PINYIN_CHARS = 64
"""Latin queries longer than this are not read as pinyin (the query limit is 64 anyway)."""
_LATIN = re.compile(r"[a-z]+")
_HAN = re.compile(r"[\u3400-\u9fff]")


class _Converter(Protocol):
    def convert(self, text: str) -> str: ...


class QueryVariants:
    """Reads a normalised query (lower case, no spaces) as the corpus's simplified words.

    Args:
        terms: the corpus's search terms, each as often as entries hold it: the pinyin of
            several terms can agree (国庆/国情), and the most frequent term wins.
    """

    def __init__(self, terms: Iterable[str]) -> None:
        import opencc  # loaded with the hotword pipeline only
        from pypinyin import lazy_pinyin

        self._to_simplified: _Converter = opencc.OpenCC("t2s")
        table = Path(opencc.__file__).parent / "dictionary" / "TSCharacters.txt"
        self._traditional = frozenset(
            line.split("\t", 1)[0] for line in table.read_text("utf-8").splitlines()
        )
        counts = Counter(term for term in terms if _HAN.search(term))
        by_pinyin: dict[str, tuple[int, str]] = {}
        for term, count in counts.items():
            key = "".join(lazy_pinyin(term)).lower()
            if not _LATIN.fullmatch(key):
                continue  # a term mixing Latin or digits is typed as it is
            # ü is typed v (lvyou) or u (gonglue): both spell the term.
            for spelling in {key, key.replace("v", "u")}:
                best = by_pinyin.get(spelling)
                if best is None or (count, term) > best:
                    by_pinyin[spelling] = (count, term)
        self._words = {key: term for key, (_, term) in by_pinyin.items()}
        self._longest = max((len(key) for key in self._words), default=0)

    def simplified(self, text: str) -> str:
        """``text`` in simplified characters (ASCII text is returned as it is)."""
        # Most queries are simplified already: a set lookup per character (about 1 us) spares
        # them OpenCC's phrase-then-character pass (25-100 us in pure Python).
        if text.isascii() or self._traditional.isdisjoint(text):
            return text
        return self._to_simplified.convert(text)

    def from_pinyin(self, text: str) -> str | None:
        """The corpus words whose pinyin spells ``text`` exactly, in the fewest pieces, or None
        when ``text`` is not Latin letters or cannot be cut entirely into known pinyin."""
        if not _LATIN.fullmatch(text) or len(text) > MAX_PINYIN_CHARS:
            return None
        # best[i]: (fewest pieces spelling text[:i], where the last piece starts, its word).
        best: list[tuple[int, int, str] | None] = [None] * (len(text) + 1)
        best[0] = (0, 0, "")
        for end in range(1, len(text) + 1):
            for start in range(max(0, end - self._longest), end):
                before, word = best[start], self._words.get(text[start:end])
                if before is None or word is None:
                    continue
                current = best[end]
                if current is None or before[0] + 1 < current[0]:
                    best[end] = (before[0] + 1, start, word)
        pieces: list[str] = []
        end = len(text)
        while end:
            step = best[end]
            if step is None:
                return None
            pieces.append(step[2])
            end = step[1]
        return "".join(reversed(pieces))
