"""What the retrieval benchmarks share: generated corpora and queries, the real sample corpus, and
``searchr1 serve`` started in a process of its own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from searchr1.retrieval.corpus import Document

SAMPLE = Path("shared") / "data" / "flashrag-sample" / "wiki18_sample_corpus.jsonl"
"""The wiki-18 sample, relative to the repository or a folder above it."""


def make_corpus(n: int, seed: int, vocab: int = 30_000, words: int = 60):
    """``n`` passages of ``words`` Zipf(1.1)-distributed pseudo-words, each titled by two rare words."""
    rng = np.random.default_rng(seed)
    syll = np.array(
        ["ka", "lo", "mi", "ve", "ta", "do", "qu", "be", "za", "rh", "fe", "gu", "pr", "st", "wo", "ni"]
    )
    lexicon = [
        "".join(syll[rng.integers(0, len(syll), rng.integers(2, 5))]) + str(i % 7) for i in range(vocab)
    ]
    ranks = np.minimum(rng.zipf(1.1, size=(n, words)), vocab) - 1
    docs = []
    for i in range(n):
        title = f"{lexicon[rng.integers(vocab // 2, vocab)]} {lexicon[rng.integers(vocab // 2, vocab)]}"
        docs.append(Document(str(i), title, " ".join(lexicon[r] for r in ranks[i])))
    return docs


def make_queries(docs, n: int, seed: int) -> list[str]:
    """Queries of 3-6 words taken from random passages (title words included half the time)."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for _ in range(n):
        d = docs[int(rng.integers(0, len(docs)))]
        words = d.text.split()
        picked = [words[int(j)] for j in rng.integers(0, len(words), int(rng.integers(3, 7)))]
        if rng.random() < 0.5:
            picked.append(d.title.split()[0])
        out.append(" ".join(picked))
    return out


def free_port() -> int:
    """A TCP port nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(index: Path, port: int, extra: list[str] | None = None) -> subprocess.Popen:
    """``searchr1 serve`` on 127.0.0.1:``port`` in a separate process, once it answers /health."""
    import httpx

    env = {**os.environ, "SEARCHR1_API_KEY": ""}
    log = index.parent / "server.log"  # a file, not a pipe: a full pipe would stall the server
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "searchr1.cli", "serve", "--index", str(index), "--port", str(port),
             "--host", "127.0.0.1", "--max-queries", "1024", *(extra or [])],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"server did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.2)


def sample_corpus(start: Path | None = None) -> Path | None:
    """The wiki-18 sample (``shared/data/flashrag-sample``) in the repository or a folder above it."""
    here = (start or Path(__file__)).resolve()
    for folder in here.parents:
        if (folder / SAMPLE).is_file():
            return folder / SAMPLE
    return None
