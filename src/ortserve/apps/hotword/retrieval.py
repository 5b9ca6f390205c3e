"""Candidates for a query: the corpus entries it relates to, by IDF-weighted word overlap
(jieba search-mode tokens) and character-bigram overlap (for short or unsegmented queries).

Relevance is coverage: the share of the query's weight found in the entry. A query whose best
coverage stays under ``MATCH_THRESHOLD`` relates to nothing in the corpus.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ortserve.apps.hotword.corpus import Entry
from ortserve.apps.hotword.regions import RegionTable
from ortserve.apps.hotword.variants import QueryVariants

__all__ = ["MATCH_THRESHOLD", "MAX_CANDIDATES", "STOPWORDS", "Index", "Matches", "normalise"]

MATCH_THRESHOLD = 0.5
"""An entry relates to the query when it covers at least half of the query's weight."""
MAX_CANDIDATES = 64
"""Entries scored by the model per query at most (the most relevant; home-region ones first)."""
STOPWORDS = frozenset(
    [
        "怎么",
        "怎么样",
        "什么",
        "最新",
        "哪里",
        "哪儿",
        "今天",
        "今年",
        "多少钱",
        "的",
        "了",
        "吗",
        "呢",
        "啊",
        "和",
        "与",
        "在",
        "有",
        "是",
        "一下",
        "2024",
        "2025",
        "2026",
    ]
)
"""Words users add that say nothing about what they look for."""

Floats = npt.NDArray[np.float64]
Tokenize = Callable[[str], list[str]]


def normalise(text: str) -> str:
    """Lower case without spaces: how queries and words are compared."""
    return "".join(text.lower().split())


def _bigrams(text: str) -> set[str]:
    return {text[i : i + 2] for i in range(len(text) - 1)}


@dataclass(frozen=True, slots=True)
class Matches:
    """Candidate entry indices and their text features, most relevant first."""

    index: npt.NDArray[np.int64]
    exact: Floats
    word_query: Floats
    word_entry: Floats
    bigram_query: Floats
    bigram_entry: Floats

    @property
    def relevance(self) -> Floats:
        return np.maximum(self.word_query, self.bigram_query)


class _Vocabulary:
    """Posting lists with IDF weights: coverage of a term set costs one pass per query term."""

    def __init__(self, documents: Sequence[set[str]], own: Sequence[set[str]]) -> None:
        terms = sorted(set().union(*documents))
        self.ids = {t: i for i, t in enumerate(terms)}
        self.size = len(documents)
        self.postings = self._postings(documents)
        self.own_postings = self._postings(own)
        df = np.array([len(p) for p in self.postings], dtype=np.float64)
        self.idf = np.log((1 + self.size) / (1 + df)) + 1
        self.unknown_idf = math.log(1 + self.size) + 1
        own_weight = np.zeros(self.size)
        own_count = np.zeros(self.size)
        for term, posting in enumerate(self.own_postings):
            own_weight[posting] += self.idf[term]
            own_count[posting] += 1
        self.own_weight = np.maximum(own_weight, 1e-9)
        self.own_count = np.maximum(own_count, 1.0)

    def _postings(self, documents: Sequence[set[str]]) -> list[npt.NDArray[np.int64]]:
        lists: list[list[int]] = [[] for _ in self.ids]
        for row, document in enumerate(documents):
            for term in document:
                if term in self.ids:
                    lists[self.ids[term]].append(row)
        return [np.array(p, dtype=np.int64) for p in lists]

    def coverage(self, terms: set[str], weighted: bool) -> tuple[Floats, Floats]:
        """(share of the query's weight each entry has, share of each entry's own weight hit)."""
        known = sorted(self.ids[t] for t in terms if t in self.ids)
        unknown = (self.unknown_idf if weighted else 1.0) * (len(terms) - len(known))
        weights = self.idf[known] if weighted else np.ones(len(known))
        query, own = np.zeros(self.size), np.zeros(self.size)
        total = float(weights.sum()) + unknown
        if total == 0:
            return query, own
        for term, weight in zip(known, weights.tolist(), strict=True):
            query[self.postings[term]] += weight
            own[self.own_postings[term]] += weight
        return query / total, own / (self.own_weight if weighted else self.own_count)


class Index:
    """Word and bigram indexes over a corpus.

    Args:
        entries: the corpus.
        tokenize: jieba search-mode segmentation (the same for entries and queries).
    """

    def __init__(self, entries: Sequence[Entry], tokenize: Tokenize) -> None:
        self._tokenize = tokenize
        words = [normalise(e.word) for e in entries]
        own = [self.terms(w) for w in words]
        extra = [{normalise(t) for t in e.terms} - STOPWORDS for e in entries]
        self._words = _Vocabulary([o | x for o, x in zip(own, extra, strict=True)], own)
        self._bigrams = _Vocabulary([_bigrams(w) for w in words], [_bigrams(w) for w in words])
        self._exact = {w: i for i, w in enumerate(words)}
        self.regions = np.array([e.region for e in entries], dtype=np.int64)
        self._localities = RegionTable(self.regions)
        self._variants = QueryVariants(term for terms in own for term in terms)

    def read(self, query: str) -> str:
        """The query as the corpus writes it: normalised, simplified, pinyin read as words
        (a Latin query that is a corpus term itself stays as typed)."""
        text = normalise(self._variants.simplified(query))
        latin = text.replace("ü", "v")
        if latin.isascii() and latin != text:
            text = latin
        if text.isascii() and text not in self._words.ids:
            return self._variants.from_pinyin(text) or text
        return text

    def terms(self, text: str) -> set[str]:
        """The searchable tokens of a normalised text (stopwords dropped)."""
        return {t for t in self._tokenize(text) if t.strip() and t not in STOPWORDS}

    def exact(self, query: str) -> int | None:
        """The entry whose word is the query, if any."""
        return self._exact.get(self.read(query))

    def match(self, query: str, region_id: int) -> Matches:
        """Entries covering at least ``MATCH_THRESHOLD`` of the query (by words or bigrams),
        at most ``MAX_CANDIDATES``: by relevance, then home region, then corpus order; an
        exact match always among them."""
        text = self.read(query)
        word_q, word_e = self._words.coverage(self.terms(text), weighted=True)
        bigram_q, bigram_e = self._bigrams.coverage(_bigrams(text), weighted=False)
        priority = np.maximum(word_q, bigram_q)
        exact = self._exact.get(text)
        if exact is not None:
            priority[exact] = 2.0
        home = self._localities.locality(region_id) > 0
        related = np.flatnonzero(priority >= MATCH_THRESHOLD)
        order = np.lexsort((related, ~home[related], -np.round(priority[related], 6)))
        chosen = related[order][:MAX_CANDIDATES]
        exact_flags = np.zeros(len(chosen))
        if exact is not None:
            exact_flags[chosen == exact] = 1.0
        return Matches(
            chosen, exact_flags, word_q[chosen], word_e[chosen], bigram_q[chosen], bigram_e[chosen]
        )
