"""BM25's settings: the options saved with an index and the named presets (``pyserini``, ``bm25s``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from searchr1.retrieval.bm25.analysis import Analyzer, make_analyzer

METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
NONOCCURRENCE_METHODS = ("bm25l", "bm25+")


PRESETS: dict[str, dict[str, Any]] = {
    "pyserini": {"k1": 0.9, "b": 0.4, "analyzer": "lucene-english", "stemmer": "porter",
                 "stopwords": "lucene", "doc_length": "lucene", "tie_break": "pyserini", "doc_count": "indexed"},
    "bm25s": {"k1": 1.5, "b": 0.75, "analyzer": "regex", "stemmer": "english", "stopwords": "en",
              "doc_length": "exact", "tie_break": "row", "doc_count": "all"},
}  # fmt: skip
"""Named settings. ``pyserini`` (the default): Search-R1's retriever, pyserini's ``LuceneSearcher`` at
its defaults (k1 0.9, b 0.4, Lucene's English analyzer, Lucene's one-byte document lengths);
``bm25s``: the settings of earlier versions (bm25s's defaults with a Snowball stemmer)."""
DOC_LENGTHS = ("lucene", "exact")
DOC_COUNTS = ("indexed", "all")


@dataclass
class BM25Params:
    """Scoring and tokenisation options (saved with the index); the defaults are the ``pyserini`` preset."""

    k1: float = 0.9
    b: float = 0.4
    method: str = "lucene"
    analyzer: str = "lucene-english"
    """lucene-english (Lucene's EnglishAnalyzer) | regex (earlier versions): see ``bm25.analysis``."""
    stemmer: str | None = "porter"
    """lucene-english: porter (Lucene's PorterStemFilter) or another PyStemmer algorithm; regex: a
    PyStemmer language (english, ...); None: no stemming."""
    stopwords: str | None = "lucene"
    """lucene: Lucene's 33 English stop words; a bm25s list name (en, de, fr, ...); None: keep every word."""
    doc_length: str = "lucene"
    """lucene: a document's length as Lucene stores it, in one byte (``lucene_length``: exact below 24
    tokens, then 4 significant bits); exact: the token count."""
    tie_break: str = "pyserini"
    """Order of hits with equal scores. pyserini: as Anserini (pyserini's engine) orders them, by
    passage id as text (scores reported rounded to 4 decimals, as pyserini reports them); row: in
    corpus order (scores reported whole)."""
    doc_count: str = "indexed"
    """Which passages N (in the IDF) and avgdl count. indexed: those holding at least one indexed term,
    as Lucene's ``docCount`` (a passage of stop words only counts in neither); all: every passage, as
    bm25s counts them."""
    delta: float = 0.5
    """The lower bound delta of bm25l and bm25+ (ignored by the other methods)."""
    preset: str | None = "pyserini"
    """The preset these settings started from (for people: manifests and ``/health`` show it)."""

    @classmethod
    def from_preset(cls, preset: str = "pyserini", **overrides: Any) -> BM25Params:
        """The settings of ``preset`` (``PRESETS``) with ``overrides`` on top (None: the preset's value;
        the string "none" for ``stemmer`` / ``stopwords``: none)."""
        if preset not in PRESETS:
            raise ValueError(f"unknown BM25 preset {preset!r}; choose one of {', '.join(PRESETS)}")
        given = {k: None if v in ("none", "None", "") else v for k, v in overrides.items() if v is not None}
        unknown = sorted(set(given) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown BM25 setting(s) {', '.join(unknown)}")
        return cls(**{**PRESETS[preset], "preset": preset, **given})

    @classmethod
    def from_saved(cls, saved: dict[str, Any]) -> BM25Params:
        """The settings saved with an index; a folder of an earlier version (no ``analyzer`` key) was
        built with the ``bm25s`` preset's analyzer and exact lengths."""
        known = {k: v for k, v in saved.items() if k in cls.__dataclass_fields__}
        known.setdefault("doc_count", "all")  # what every index before the setting was built with
        if "analyzer" not in known:
            known = {"analyzer": "regex", "doc_length": "exact", "tie_break": "row", "preset": None, **known}
        return cls(**known)

    def validate(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown BM25 method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.tie_break not in ("pyserini", "row"):
            raise ValueError(f"unknown BM25 tie_break {self.tie_break!r}; choose pyserini or row")
        if self.doc_length not in DOC_LENGTHS:
            raise ValueError(f"unknown BM25 doc_length {self.doc_length!r}; choose one of {', '.join(DOC_LENGTHS)}")
        if self.doc_count not in DOC_COUNTS:
            raise ValueError(f"unknown BM25 doc_count {self.doc_count!r}; choose one of {', '.join(DOC_COUNTS)}")
        self.make_analyzer()

    def make_analyzer(self) -> Analyzer:
        return make_analyzer(self.analyzer, self.stemmer, self.stopwords)
