"""The BM25 build's memory stays bounded at wiki-18 scale (norms computed run by run, a term longer
than the merge budget merged run by run), a kill during the merge resumes to the same bytes, and a
budget below one chunk's need is refused before any work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from searchr1.retrieval.bm25 import BM25Params, BM25Retriever
from searchr1.retrieval.bm25 import build as bm25_build
from searchr1.retrieval.bm25.files import POSTINGS_FILE
from searchr1.retrieval.checkpoint import read_state
from searchr1.retrieval.corpus import Document, write_corpus
from searchr1.retrieval.index import IndexLoadError, build_index, load_index

REPO = Path(__file__).resolve().parents[2]


class _Lengths:
    """A stand-in run holding only passage lengths, made when asked (so the test holds none of them)."""

    def __init__(self, n: int, seed: int):
        self.n_docs, self.seed = n, seed

    def lengths(self) -> np.ndarray:
        return np.random.default_rng(self.seed).integers(0, 400, self.n_docs).astype(np.uint32)


def _stats_peak(passages: int, per_run: int = 50_000) -> tuple[int, bm25_build.CorpusStats]:
    runs = [_Lengths(per_run, k) for k in range(passages // per_run)]
    tracemalloc.start()
    try:
        stats = bm25_build.corpus_stats(runs, BM25Params())
        return tracemalloc.get_traced_memory()[1], stats
    finally:
        tracemalloc.stop()


def test_norms_are_computed_run_by_run_so_the_peak_grows_by_one_byte_a_passage():
    few, _ = _stats_peak(100_000)
    many, large = _stats_peak(2_000_000)
    assert large.norms.dtype == np.uint8 and len(large.norms) == 2_000_000 and large.lens is None
    # 1.9M more passages may add their 1-byte norms (1.9 MB) and nothing else of their size: computing
    # the norms over the whole corpus at once took ~60 bytes a passage of temporaries (114 MB here)
    assert many - few < 1.25 * 1_900_000
    whole = np.concatenate([r.lengths() for r in [_Lengths(50_000, k) for k in range(40)]])
    assert np.array_equal(large.norms, bm25_build.lucene_norm(whole))
    assert large.avg_len == pytest.approx(whole[whole > 0].mean()) and large.doc_count == np.count_nonzero(whole)


def _common_term_docs(n: int) -> list[Document]:
    """Every passage holds "common"; a few other words vary."""
    rng = np.random.default_rng(0)
    return [Document(str(i), f"t{i % 7}x", f"common w{rng.integers(50)}x common w{rng.integers(9)}x")
            for i in range(n)]  # fmt: skip


def test_a_term_longer_than_the_merge_budget_is_merged_run_by_run(tmp_path, monkeypatch):
    docs = _common_term_docs(400)
    corpus = write_corpus(docs, tmp_path / "c.jsonl")
    pieces, reads = [], []
    real_plan, real_slice = bm25_build.plan_pieces, bm25_build.RunFile.slice
    monkeypatch.setattr(bm25_build, "plan_pieces", lambda runs, budget: pieces.append((real_plan(runs, budget), budget)) or pieces[-1][0])  # fmt: skip
    monkeypatch.setattr(bm25_build.RunFile, "slice", lambda self, t0, t1: reads.append(real_slice(self, t0, t1)) or reads[-1])  # fmt: skip
    # 40-passage chunks, ~60 postings merged at a time: "common" (400 postings) is over budget
    build_index(corpus, tmp_path / "idx", chunk_passages=40, memory_mb=60 * 64 / 2**20, show_progress=False)
    ((plan, budget),) = pieces
    assert budget == 60
    singles = [p for p in plan if p.single]
    assert 400 in [p.postings for p in singles] and all(p.postings > budget for p in singles)
    assert all(p.postings <= budget for p in plan if not p.single)
    assert max(len(r[4]) for r in reads) <= max(budget, 40)  # never more than a budget or a run's part
    streamed, in_memory = load_index(tmp_path / "idx"), BM25Retriever.from_documents(docs)
    assert all(np.array_equal(a, b) for a, b in zip(streamed.csc(), in_memory.csc(), strict=True))
    assert np.array_equal(streamed.matrix.column_max(), in_memory.matrix.column_max())
    queries = ["common", "common w3x", "t2x w7x", "w1x common common"]
    assert streamed.search(queries, 5) == in_memory.search(queries, 5)


def test_a_merge_budget_below_one_chunk_is_refused_before_any_work(tmp_path, capsys):
    from searchr1.cli import main

    corpus = write_corpus(_common_term_docs(20), tmp_path / "c.jsonl")
    need = bm25_build.min_memory_mb(20_000)  # the default chunk
    assert 1 < need < 2
    with pytest.raises(ValueError, match=r"--memory-mb 1 is below what one chunk of 20,000 passages needs in the merge \(1\.22 MB\)"):
        build_index(corpus, tmp_path / "idx", memory_mb=1, show_progress=False)
    assert not (tmp_path / "idx").exists()
    assert main(["index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "idx"), "--memory-mb", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1.22 MB" in err[0] and not (tmp_path / "idx").exists()
    build_index(corpus, tmp_path / "idx", memory_mb=1, chunk_passages=10_000, show_progress=False)  # 0.61 MB needed


_KILL_DURING_MERGE = """
import os, signal, sys
from searchr1.retrieval.bm25 import build as bm25_build
from searchr1.retrieval.index import build_index
real, seen = bm25_build.FileSink.add, {"n": 0}
def add(self, *args):
    seen["n"] += 1
    if seen["n"] > 3:  # three pieces of the index written, then the process dies
        os.kill(os.getpid(), signal.SIGKILL)
    real(self, *args)
bm25_build.FileSink.add = add
build_index(sys.argv[1], sys.argv[2], chunk_passages=40, memory_mb=0.005, show_progress=False)
"""


def test_a_build_killed_during_the_merge_resumes_to_the_same_bytes(tmp_path):
    from tests.retrieval.test_streaming_build import _files, _zipf_docs

    corpus = write_corpus(_zipf_docs(250), tmp_path / "c.jsonl")
    build_index(corpus, tmp_path / "whole", chunk_passages=40, memory_mb=0.005, show_progress=False)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _KILL_DURING_MERGE, str(corpus), str(tmp_path / "cut")],
                          env=env, capture_output=True, timeout=300)  # fmt: skip
    assert done.returncode == -9, done.stderr.decode()[-2000:]
    state = read_state(tmp_path / "cut")
    assert state.phase == "index" and state.passages == 250  # killed while merging, not reading
    assert (tmp_path / "cut" / "bm25" / POSTINGS_FILE).is_file()  # a part of the index written
    with pytest.raises(IndexLoadError, match="unfinished build"):
        load_index(tmp_path / "cut")
    m = build_index(corpus, tmp_path / "cut", chunk_passages=40, memory_mb=0.005, show_progress=False, resume=True)
    assert m.build["resumed"] and m.num_documents == 250
    assert _files(tmp_path / "cut") == _files(tmp_path / "whole")
    assert json.loads((tmp_path / "cut" / "manifest.json").read_text())["num_documents"] == 250


def test_passages_without_an_indexed_term_count_in_neither_n_nor_avgdl_as_in_lucene():
    docs = [Document(str(i), "", f"w{i % 5}x and w{i % 3}x apple") for i in range(30)]
    stop_only = [Document("s1", "", "the and of"), Document("s2", "", "")]
    for preset, equal in (("pyserini", True), ("bm25s", False)):
        plain = BM25Retriever.from_documents(docs, preset=preset)
        padded = BM25Retriever.from_documents(docs[:10] + stop_only + docs[10:], preset=preset)
        a, b = plain.search(["w1x apple"], 5)[0], padded.search(["w1x apple"], 5)[0]
        assert [h.id for h in a] == [h.id for h in b]
        assert ([h.score for h in a] == [h.score for h in b]) is equal, preset
    padded = BM25Retriever.from_documents(docs + stop_only)
    assert padded.matrix.doc_count == 30 and padded.matrix.num_docs == 32
