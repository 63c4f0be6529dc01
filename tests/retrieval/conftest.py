"""Fixtures of the retrieval tests: a small generated corpus whose right answers are known."""

from __future__ import annotations

import random

import pytest

from searchr1.retrieval.corpus import Document, write_corpus

SYLLABLES = [
    "ka",
    "lo",
    "mir",
    "ven",
    "tas",
    "dor",
    "qui",
    "bel",
    "zan",
    "rho",
    "fen",
    "gul",
    "pra",
    "sto",
    "wex",
]
TOPICS = ["river", "castle", "violin", "comet", "orchard", "harbor", "glacier", "library", "forge", "meadow"]


def make_name(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(3))


def make_documents(n: int = 200, seed: int = 0) -> list[Document]:
    """``n`` documents, each about a unique invented name (title) and one topic word."""
    rng = random.Random(seed)
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < n:
        name = make_name(rng)
        if name not in seen:
            seen.add(name)
            names.append(name)
    docs = []
    for i, name in enumerate(names):
        topic = TOPICS[i % len(TOPICS)]
        text = f"{name.capitalize()} is a {topic} in the land of {rng.choice(names).capitalize()}. It was founded in {1800 + i}."
        docs.append(Document(str(i), name.capitalize(), text))
    return docs


@pytest.fixture(scope="session")
def docs() -> list[Document]:
    return make_documents()


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory, docs):
    return write_corpus(docs, tmp_path_factory.mktemp("corpus") / "corpus.jsonl")


@pytest.fixture(scope="session")
def bm25(docs):
    from searchr1.retrieval.bm25 import BM25Retriever

    return BM25Retriever.from_documents(docs)


@pytest.fixture(scope="session")
def encoder():
    """The real bundled all-MiniLM-L6-v2 encoder (loaded once)."""
    from searchr1.retrieval.dense import Encoder

    return Encoder(device="cpu", batch_size=64)


@pytest.fixture(scope="session")
def dense(docs, encoder):
    from searchr1.retrieval.dense import DenseRetriever

    return DenseRetriever.from_documents(docs[:60], encoder=encoder)
