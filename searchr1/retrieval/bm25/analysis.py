"""Text analysis for BM25: the words of a text, which of them are stop words, and their stems.

Two analyzers (``BM25Params.analyzer``):

- ``lucene-english`` (the default): what Lucene's ``EnglishAnalyzer`` does -- and so pyserini's
  ``LuceneSearcher`` at its defaults, the BM25 retriever of Search-R1 (Jin et al., 2025) --

      StandardTokenizer -> EnglishPossessiveFilter -> LowerCaseFilter -> StopFilter -> PorterStemFilter

  * words as Unicode's default word boundaries cut them (UAX #29, "Unicode Text Segmentation"):
    runs of letters and digits, joined across ``'`` ``’`` ``.`` ``:`` ``·`` between two letters
    ("can't", "U.S.A") and across ``.`` ``,`` ``;`` ``'`` between two digits ("3.14", "1,000"), and by
    ``_``; CJK ideographs and hiragana one character a token; tokens of more than 255 characters
    cut into pieces of 255 (Lucene's default maximum token length);
  * a trailing ``'s`` (or ``’s``) removed; lower case as Java's ``Character.toLowerCase`` (so
    ``Σ`` -> ``σ`` whatever its place, ``İ`` -> ``i``);
  * Lucene's 33 English stop words (``LUCENE_STOPWORDS``) dropped (or another list);
  * Porter's stemmer (Porter, 1980, "An algorithm for suffix stripping", Program 14(3)), the
    algorithm of Lucene's ``PorterStemFilter``, from PyStemmer's ``porter``.

- ``regex`` (the analyzer of earlier versions, with bm25s's conventions): lower-cased runs of two or
  more word characters (``\\b\\w\\w+\\b``), a bm25s stop-word list, a Snowball stemmer
  (``english`` by default).

An analyzer splits its work in the three steps a streaming build memoises: ``words(text)`` (the
surface words, lower-cased), ``stopwords`` (a set) and ``stem(word)``.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

ANALYZERS = ("lucene-english", "regex")

LUCENE_STOPWORDS = frozenset(
    ("a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no",
     "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this",
     "to", "was", "will", "with")
)  # fmt: skip
"""Lucene's ``EnglishAnalyzer.ENGLISH_STOP_WORDS_SET`` (33 words)."""

MAX_TOKEN_CHARS = 255
"""Lucene's ``StandardAnalyzer.DEFAULT_MAX_TOKEN_LENGTH``: longer tokens are cut into pieces."""

_LETTER = r"[^\W\d_]"
_CJK = "\u3040-\u309f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_FORMAT = "\u00ad\u200c\u200d\u2060\ufeff"
_MID_LETTER = ":\u00b7\u0387\u05f4\u2027\ufe13\ufe55\uff1a"
_MID_NUM = ",;\u037e\u0589\u060c\u060d\u066c\u07f8\u2044\ufe10\ufe14\ufe50\ufe54\uff0c\uff1b"
_MID_NUM_LET = ".'\u2018\u2019\u2024\ufe52\uff07\uff0e"


def _ranges(category: str) -> str:
    """A character class body of every code point whose Unicode category starts with ``category``."""
    out, start = [], None
    for c in range(sys.maxunicode + 2):
        hit = c <= sys.maxunicode and unicodedata.category(chr(c)).startswith(category)
        if hit and start is None:
            start = c
        elif not hit and start is not None:
            out.append(f"{re.escape(chr(start))}-{re.escape(chr(c - 1))}")
            start = None
    return "".join(out)


@functools.cache
def _standard_re() -> re.Pattern:
    """Lucene's StandardTokenizer as a regular expression (the UAX #29 rules met in practice): a word
    character, then word characters, combining marks and format characters (rule WB4), and joins
    across MidLetter / MidNumLet between letters (WB6, WB7) or MidNum / MidNumLet between digits
    (WB11, WB12); letters and digits join directly (WB9, WB10), ``_`` is a word character (WB13a/b)."""
    marks, numbers = _ranges("M"), _ranges("No")  # combining marks; ², ⅓, ①: not word characters
    char = rf"(?:(?![{_CJK}{numbers}])\w)"
    inner = f"[{_FORMAT}{marks}]*"
    word = rf"{char}{inner}(?:{char}{inner})*"
    join = rf"(?:(?<={_LETTER})[{_MID_LETTER}{_MID_NUM_LET}](?={_LETTER})|(?<=\d)[{_MID_NUM}{_MID_NUM_LET}](?=\d))"
    return re.compile(rf"[{_CJK}]|{word}(?:{join}{word})*")


_ASCII_RE = re.compile(r"[a-z0-9_]+(?:(?:(?<=[a-z])[:.'](?=[a-z])|(?<=[0-9])[.,;'](?=[0-9]))[a-z0-9_]+)*")
"""``_standard_re`` for lower-case ASCII text (most of it: one simple class instead of Unicode's)."""
_POSSESSIVE = ("'s", "’s", "＇s")
_JAVA_LOWER = str.maketrans({"Σ": "σ", "İ": "i"})
"""Where Python's ``str.lower`` differs from Java's per-character ``toLowerCase``."""
_REGEX_TOKEN_RE = re.compile(r"(?u)\b\w\w+\b")


def stopword_set(name: str | None) -> frozenset[str]:
    """``lucene``: Lucene's English list; a bm25s list name (en, de, fr, ...); None: no stop words."""
    if not name:
        return frozenset()
    if name == "lucene":
        return LUCENE_STOPWORDS
    from bm25s.tokenization import _infer_stopwords

    try:
        return frozenset(_infer_stopwords(name))
    except ValueError:
        raise ValueError(
            f"unknown stop-word list {name!r}; use lucene, a bm25s list (en, de, fr, ...) or none"
        ) from None


class Analyzer:
    """``words`` -> drop ``stopwords`` -> ``stem``; ``analyzer(text)`` does all three (stems memoised)."""

    name = "analyzer"
    stopwords: frozenset[str] = frozenset()
    CACHE_LIMIT = 200_000
    """Surface words whose stem is remembered (the memo, ~25 MB at most, is emptied when it reaches
    this size: a bound on the memory of a build, whatever the vocabulary of its corpus)."""

    def __init__(self) -> None:
        self._cache: dict[str, str] = {}

    def words(self, text: str) -> list[str]:
        raise NotImplementedError

    def stem(self, word: str) -> str:
        return word

    def cached_stem(self, word: str) -> str:
        s = self._cache.get(word)
        if s is None:
            if len(self._cache) >= self.CACHE_LIMIT:
                self._cache.clear()
            s = self._cache[word] = self.stem(word)
        return s

    def __call__(self, text: str) -> list[str]:
        stop, cache = self.stopwords, self._cache
        out = []
        for w in self.words(text):
            if w in stop:
                continue
            s = cache.get(w)
            out.append(s if s is not None else self.cached_stem(w))
        return out


def _snowball(language: str):
    import Stemmer

    try:
        return Stemmer.Stemmer(language)
    except KeyError:
        raise ValueError(
            f"unknown stemmer language {language!r}; known: {', '.join(Stemmer.algorithms())}"
        ) from None


def porter_measure(stem: str) -> int:
    """Porter's m: the number of vowel-consonant sequences in ``[C](VC)^m[V]`` (a ``y`` after a
    consonant is a vowel)."""
    m, prev_vowel = 0, False
    for i, ch in enumerate(stem):
        vowel = ch in "aeiou" or (ch == "y" and i > 0 and not prev_vowel)
        if prev_vowel and not vowel:
            m += 1
        prev_vowel = vowel
    return m


class PorterStemmer:
    """Porter's stemmer as its author's reference implementation -- and Lucene's ``PorterStemmer`` --
    apply it: the published algorithm (Snowball's ``porter``, from PyStemmer) with the reference's three
    departures from the paper: words of one or two letters are left alone, and step 2 rewrites
    ``bli`` -> ``ble`` (the paper: ``abli`` -> ``able``) and ``logi`` -> ``log`` (not in the paper),
    both when the stem before the suffix has m > 0.

    A word that Snowball leaves ending in ``bli`` reached step 2 with that ending (steps 3-5 remove no
    suffix ending there), so the reference's result is Snowball's stem of ``...ble`` (steps 1-2 leave a
    ``ble`` ending alone, steps 3-5 go on as after the rewrite); one ending in ``logi`` loses its ``i``
    (steps 3-5 change nothing ending in ``log``)."""

    def __init__(self) -> None:
        self._snowball = _snowball("porter")

    def __call__(self, word: str) -> str:
        if len(word) <= 2:
            return word
        s = self._snowball.stemWord(word)
        if s.endswith("bli") and porter_measure(s[:-3]) > 0:
            return self._snowball.stemWord(s[:-3] + "ble")
        if s.endswith("logi") and porter_measure(s[:-4]) > 0:
            return s[:-1]
        return s


class LuceneEnglishAnalyzer(Analyzer):
    """Lucene's ``EnglishAnalyzer`` (see the module docstring); ``stemmer=None`` keeps words whole,
    ``stopwords`` names the list (``stopword_set``)."""

    name = "lucene-english"

    def __init__(self, stemmer: str | None = "porter", stopwords: str | None = "lucene"):
        super().__init__()
        self.stopwords = stopword_set(stopwords)
        self._stem = (
            None if not stemmer else PorterStemmer() if stemmer == "porter" else _snowball(stemmer).stemWord
        )

    def words(self, text: str) -> list[str]:
        text = text.lower() if text.isascii() else text.translate(_JAVA_LOWER).lower()
        out = (_ASCII_RE if text.isascii() else _standard_re()).findall(text)
        if "'" in text or "’" in text or "＇" in text:
            out = [w[:-2] if len(w) > 2 and w.endswith(_POSSESSIVE) else w for w in out]
        if len(text) > MAX_TOKEN_CHARS and max(map(len, out), default=0) > MAX_TOKEN_CHARS:
            out = [p for t in out for p in _cut(t)]
        return out

    def stem(self, word: str) -> str:
        return word if self._stem is None else self._stem(word)


def _cut(token: str) -> list[str]:
    if len(token) <= MAX_TOKEN_CHARS:
        return [token]
    return [token[i : i + MAX_TOKEN_CHARS] for i in range(0, len(token), MAX_TOKEN_CHARS)]


class RegexAnalyzer(Analyzer):
    """The analyzer of earlier versions: ``\\b\\w\\w+\\b`` on lower-cased text, a bm25s stop-word list
    (``en``, ``de``, ...; None: none), a Snowball stemmer (``english``, ...; None: none)."""

    name = "regex"

    def __init__(self, stemmer: str | None = "english", stopwords: str | None = "en"):
        super().__init__()
        self.stopwords = stopword_set(stopwords)
        self._stemmer = _snowball(stemmer) if stemmer else None

    def words(self, text: str) -> list[str]:
        return _REGEX_TOKEN_RE.findall(text.lower())

    def stem(self, word: str) -> str:
        return word if self._stemmer is None else self._stemmer.stemWord(word)


def make_analyzer(name: str, stemmer: str | None, stopwords: str | None) -> Analyzer:
    """The analyzer ``name`` with its stemmer (porter, a PyStemmer algorithm, or None) and stop words
    (``stopword_set``)."""
    if name == "lucene-english":
        return LuceneEnglishAnalyzer(stemmer, stopwords)
    if name == "regex":
        return RegexAnalyzer(stemmer, stopwords)
    raise ValueError(f"unknown BM25 analyzer {name!r}; choose one of {', '.join(ANALYZERS)}")
