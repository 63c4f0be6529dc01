"""BM25 lexical search on ``bm25s`` (eager sparse scores), in memory or saved / memory-mapped.

BM25 (Robertson & Zaragoza, 2009, "The Probabilistic Relevance Framework: BM25 and Beyond"):

    score(q, d) = sum_{t in q} IDF(t) * tf(t,d) / (tf(t,d) + k1 * (1 - b + b * |d| / avgdl))

in the Lucene variant (the default; Lucene drops the constant (k1 + 1) factor of Robertson's form) with
``IDF(t) = log(1 + (N - df + 0.5) / (df + 0.5))``. ``method``: lucene | robertson | atire | bm25l | bm25+,
as in bm25s (Lù 2024, arXiv:2407.03618). bm25s precomputes every (term, doc)
score into a sparse column matrix, so a query is a sum of a few columns and a top-k.

    bm25 = BM25Retriever.from_documents(docs)              # in process, nothing written
    bm25.search(["who founded Acme"], topk=3)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from searchr1.retrieval.base import Hit, Retriever
from searchr1.retrieval.corpus import Document, read_corpus
from searchr1.retrieval.docstore import DocStore

BM25_DIR = "bm25"
TOKENIZER_FILE = "tokenizer.json"
_TOKEN_RE = re.compile(r"(?u)\b\w\w+\b")


@dataclass
class BM25Params:
    """Scoring and tokenisation options (saved with the index)."""

    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"
    stemmer: str | None = "english"
    """PyStemmer language (None: no stemming)."""
    stopwords: str | None = "en"
    """bm25s stop-word list name (en, de, fr, ...; None: keep every word)."""


class Tokenizer:
    """Lower-case word tokens (two or more word characters), minus stop words, stemmed (memoised)."""

    def __init__(self, stemmer: str | None = "english", stopwords: str | None = "en"):
        from bm25s.tokenization import _infer_stopwords

        self.stopwords = frozenset(_infer_stopwords(stopwords)) if stopwords else frozenset()
        if stemmer:
            import Stemmer

            try:
                self._stemmer = Stemmer.Stemmer(stemmer)
            except KeyError:
                raise ValueError(
                    f"unknown stemmer language {stemmer!r}; known: {', '.join(Stemmer.algorithms())}"
                ) from None
        else:
            self._stemmer = None
        self._cache: dict[str, str] = {}

    def __call__(self, text: str) -> list[str]:
        words = [w for w in _TOKEN_RE.findall(text.lower()) if w not in self.stopwords]
        if self._stemmer is None:
            return words
        cache = self._cache
        out = []
        for w in words:
            s = cache.get(w)
            if s is None:
                s = self._stemmer.stemWord(w)
                if len(cache) < 1_000_000:
                    cache[w] = s
            out.append(s)
        return out


def build_bm25_model(docs: Iterable[Document], params: BM25Params):
    """A ``bm25s.BM25`` index of streamed documents (title + text); only token ids are kept in memory."""
    import bm25s

    tok = Tokenizer(params.stemmer, params.stopwords)
    vocab: dict[str, int] = {}
    corpus_ids = [[vocab.setdefault(t, len(vocab)) for t in tok(f"{d.title} {d.text}")] for d in docs]
    if not corpus_ids:
        raise ValueError("cannot build a BM25 index from an empty corpus")
    if not vocab:
        vocab["\x00"] = 0  # a corpus of stop words only: keep bm25s happy, nothing will match
    model = bm25s.BM25(k1=params.k1, b=params.b, method=params.method)
    model.index((corpus_ids, vocab), show_progress=False)
    return model


class BM25Retriever(Retriever):
    """BM25 over a ``bm25s`` index and a document store."""

    name = "bm25"

    def __init__(self, model, docs: DocStore, params: BM25Params):
        self.model = model
        self.docs = docs
        self.params = params
        self.tokenizer = Tokenizer(params.stemmer, params.stopwords)
        self._vocab: dict[str, int] = model.vocab_dict
        s = model.scores
        self._data, self._indices, self._indptr = s["data"], s["indices"], s["indptr"]
        self._num_docs = int(s["num_docs"])
        self._nonoccurrence = getattr(model, "nonoccurrence_array", None)

    # -- construction -----------------------------------------------------------------------------

    @classmethod
    def from_documents(
        cls, docs: Iterable[Document], params: BM25Params | None = None, **overrides
    ) -> BM25Retriever:
        """Index documents in memory (nothing is written to disk)."""
        params = params or BM25Params(**overrides)
        store = DocStore(list(docs))
        return cls(build_bm25_model(store._docs, params), store, params)

    @classmethod
    def from_corpus(cls, path: str | Path, chunk_size: int | None = None, overlap: int = 0, **overrides):
        """Index a jsonl corpus file in memory."""
        return cls.from_documents(read_corpus(path, chunk_size, overlap), **overrides)

    def save(self, folder: str | Path) -> None:
        """Save the sparse score matrix and tokeniser settings under ``folder/bm25`` (docs go elsewhere)."""
        out = Path(folder) / BM25_DIR
        out.mkdir(parents=True, exist_ok=True)
        self.model.save(str(out), show_progress=False)
        (out / TOKENIZER_FILE).write_text(json.dumps(asdict(self.params), indent=2))

    @classmethod
    def load(cls, folder: str | Path, docs: DocStore, mmap: bool = True) -> BM25Retriever:
        import bm25s

        src = Path(folder) / BM25_DIR
        params = BM25Params(**json.loads((src / TOKENIZER_FILE).read_text()))
        model = bm25s.BM25.load(str(src), mmap=mmap, load_corpus=False, show_progress=False, verbosity=0)
        return cls(model, docs, params)

    # -- search -----------------------------------------------------------------------------------

    def scores(self, query: str) -> np.ndarray | None:
        """BM25 score of every document for ``query`` (None when no query term is in the vocabulary)."""
        ids = [self._vocab[t] for t in self.tokenizer(query) if t in self._vocab]
        if not ids:
            return None
        starts, ends = self._indptr[ids], self._indptr[np.asarray(ids) + 1]
        idx = np.concatenate([self._indices[s:e] for s, e in zip(starts, ends, strict=True)])
        val = np.concatenate([self._data[s:e] for s, e in zip(starts, ends, strict=True)])
        scores = np.bincount(idx, weights=val, minlength=self._num_docs).astype(np.float32)
        if self._nonoccurrence is not None:
            scores += self._nonoccurrence[ids].sum()
        return scores

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        return [self._search_one(q, topk) for q in queries]

    def _search_one(self, query: str, topk: int) -> list[Hit]:
        scores = self.scores(query)
        if scores is None or topk <= 0:
            return []
        k = min(topk, self._num_docs)
        top = np.argpartition(-scores, k - 1)[:k] if k < self._num_docs else np.arange(self._num_docs)
        top = top[np.lexsort((top, -scores[top]))]  # by score, ties by row
        hits = []
        for row in top:
            score = float(scores[row])
            if score <= 0.0:
                break
            doc = self.docs[int(row)]
            hits.append(Hit(doc.id, doc.title, doc.text, score))
        return hits

    def close(self) -> None:
        self.docs.close()
