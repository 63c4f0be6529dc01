"""Streaming index builds: equal to one-shot builds, resumable, refusing a changed corpus, and never
leaving a loadable half index (disk full, interruption)."""

from __future__ import annotations

import errno
import json
import zlib
from pathlib import Path

import numpy as np
import pytest

from searchr1.retrieval import build as build_mod
from searchr1.retrieval.bm25 import BM25Retriever, _best, hash_terms
from searchr1.retrieval.bm25_build import BM25StreamBuilder
from searchr1.retrieval.checkpoint import IndexBuildError, read_state
from searchr1.retrieval.corpus import Document, ReadPosition, read_corpus, write_corpus
from searchr1.retrieval.index import IndexLoadError, build_index, load_index


def _zipf_docs(n: int, seed: int = 0, vocab: int = 400) -> list[Document]:
    """Passages of Zipf-distributed words (many shared terms, repeats within a passage)."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}x" for i in range(vocab)]
    ranks = np.minimum(rng.zipf(1.3, size=(n, 30)), vocab) - 1
    return [Document(str(i), f"t{i % 37}x", " ".join(words[r] for r in ranks[i])) for i in range(n)]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "manifest.json"}  # fmt: skip


@pytest.mark.parametrize("method", ["lucene", "bm25+", "robertson"])
def test_streamed_bm25_equals_the_one_shot_bm25s_build(tmp_path, method):
    docs = _zipf_docs(300)
    corpus = write_corpus(docs, tmp_path / "c.jsonl")
    # chunks of 37 passages and column buffers of ~130 postings: many runs, many column ranges
    build_index(corpus, tmp_path / "idx", bm25={"method": method}, chunk_passages=37, memory_mb=0.001,
                show_progress=False)  # fmt: skip
    streamed = load_index(tmp_path / "idx")
    one_shot = BM25Retriever.from_documents(docs, method=method)
    a, b = streamed.matrix, one_shot.matrix
    assert np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
    assert np.array_equal(a.data, b.data)  # bit-identical float32 scores
    assert (a.nonoccurrence is None) == (b.nonoccurrence is None)
    if a.nonoccurrence is not None:
        assert np.array_equal(a.nonoccurrence, b.nonoccurrence)
    queries = [" ".join(d.text.split()[:4]) for d in docs[::9]] + ["w1x w1x w7x", "t3x", "nothing"]
    assert streamed.search(queries, 5) == one_shot.search(queries, 5)


def test_maxscore_top_k_equals_exhaustive_scoring(tmp_path):
    docs = _zipf_docs(3000, seed=1, vocab=2000)
    r = BM25Retriever.from_documents(docs)
    r.PROBE_BELOW = 0  # every query through MaxScore
    rng = np.random.default_rng(2)
    queries = []
    for _ in range(200):
        words = docs[int(rng.integers(len(docs)))].text.split()
        picked = [words[int(j)] for j in rng.integers(0, len(words), int(rng.integers(1, 7)))]
        queries.append(" ".join(picked + picked[:1]))  # a repeated term counts twice
    for q in queries:
        for k in (1, 3, 10):
            full = r.scores(q)
            matching = np.flatnonzero(full > 0)  # documents holding a query term
            rows, scores = _best(matching, full[matching], k)
            got_rows, got_scores = r.top(q, k)
            assert np.array_equal(got_rows, rows) and np.array_equal(got_scores, scores), q


def test_hashed_vocabulary_finds_every_term_and_resolves_collisions(monkeypatch):
    terms = [f"term{i}" for i in range(500)]
    _, ids, salt = hash_terms(terms)
    assert salt == 0 and sorted(ids.tolist()) == list(range(500))
    from searchr1.retrieval import bm25

    real = bm25.term_hash
    monkeypatch.setattr(bm25, "term_hash", lambda t, s=0: 7 if s == 0 else real(t, s))  # all collide
    _, _, salt = bm25.hash_terms(terms)
    assert salt == 1


def test_corpus_batches_end_on_lines_and_resume_from_a_position(tmp_path):
    path = tmp_path / "c.jsonl"
    lines = [
        json.dumps({"id": str(i), "title": "T", "text": " ".join(f"w{j}" for j in range(25))})
        for i in range(7)
    ]
    lines.insert(3, "{broken")
    path.write_text("\n".join(lines) + "\n")
    reader = read_corpus(path, chunk_size=10, overlap=0, skip_bad_lines=True)
    batches = list(reader.batches(4))
    assert [len(b) for b, _ in batches] == [6, 6, 6, 3]  # 3 passages a line: a batch ends with a line
    assert batches[-1][1] == ReadPosition(path.stat().st_size, 8, 1)
    whole = [d for b, _ in batches for d in b]
    assert whole == list(read_corpus(path, chunk_size=10, skip_bad_lines=True))
    after_first = [
        d for b, _ in read_corpus(path, 10, skip_bad_lines=True).batches(4, batches[0][1]) for d in b
    ]
    assert after_first == whole[6:]


class _Stop(Exception):
    pass


def _interrupt_after(monkeypatch, target, name: str, calls: int, exc: BaseException) -> None:
    """Make ``target.name`` raise ``exc`` on its call number ``calls + 1``."""
    real = getattr(target, name)
    seen = {"n": 0}

    def wrapped(*args, **kwargs):
        seen["n"] += 1
        if seen["n"] > calls:
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, wrapped)


def test_a_resumed_bm25_build_equals_an_uninterrupted_one(tmp_path, monkeypatch):
    docs = _zipf_docs(250)
    corpus = write_corpus(docs, tmp_path / "c.jsonl")
    build_index(corpus, tmp_path / "whole", chunk_passages=40, show_progress=False)
    with monkeypatch.context() as m:
        _interrupt_after(m, BM25StreamBuilder, "add_chunk", 3, KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            build_index(corpus, tmp_path / "cut", chunk_passages=40, show_progress=False)
    state = read_state(tmp_path / "cut")
    assert state is not None and state.passages == 120 and state.chunks == 3
    with pytest.raises(IndexLoadError, match="unfinished build"):
        load_index(tmp_path / "cut")  # never served half built
    with pytest.raises(IndexBuildError, match="--resume"):
        build_index(corpus, tmp_path / "cut", chunk_passages=40, show_progress=False)
    m = build_index(corpus, tmp_path / "cut", chunk_passages=40, show_progress=False, resume=True)
    assert m.build["resumed"] and m.num_documents == 250
    assert _files(tmp_path / "cut") == _files(tmp_path / "whole")
    assert not (tmp_path / "cut" / ".build").exists()


def test_resuming_against_a_changed_corpus_or_other_options_is_refused(tmp_path, monkeypatch):
    corpus = write_corpus(_zipf_docs(200), tmp_path / "c.jsonl")
    with monkeypatch.context() as m:
        _interrupt_after(m, BM25StreamBuilder, "add_chunk", 2, KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            build_index(corpus, tmp_path / "idx", chunk_passages=40, show_progress=False)
    with pytest.raises(IndexBuildError, match=r"other settings.*chunk_passages: 40 -> 50"):
        build_index(corpus, tmp_path / "idx", chunk_passages=50, show_progress=False, resume=True)
    recorded = read_state(tmp_path / "idx").corpus_sha256
    corpus.write_text(corpus.read_text().replace("w1x", "w1y"))
    with pytest.raises(IndexBuildError, match=f"sha256 {recorded}"):
        build_index(corpus, tmp_path / "idx", chunk_passages=40, show_progress=False, resume=True)
    m = build_index(corpus, tmp_path / "idx", chunk_passages=40, show_progress=False, resume=False)
    assert not m.build["resumed"] and m.num_documents == 200  # --restart: built again from scratch


def test_bad_lines_are_named_or_skipped_and_counted_across_a_resume(tmp_path, monkeypatch):
    lines = [json.dumps({"id": str(i), "contents": f'"T{i}"\nw{i}x text'}) for i in range(100)]
    lines[10] = "not json"
    lines[70] = json.dumps({"id": "70", "title": "no text"})
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:11: invalid JSON"):
        build_index(corpus, tmp_path / "a", show_progress=False)
    with monkeypatch.context() as m:
        _interrupt_after(m, BM25StreamBuilder, "add_chunk", 2, KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            build_index(corpus, tmp_path / "b", chunk_passages=30, skip_bad_lines=True, show_progress=False)
    m = build_index(corpus, tmp_path / "b", chunk_passages=30, skip_bad_lines=True, show_progress=False,
                    resume=True)  # fmt: skip
    assert m.num_documents == 98 and m.skipped_lines == 2


@pytest.mark.parametrize("where", ["reading", "scoring"])
def test_disk_full_is_a_clear_error_and_leaves_nothing_serve_would_load(tmp_path, monkeypatch, where):
    corpus = write_corpus(_zipf_docs(150), tmp_path / "c.jsonl")
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "idx" / "x"))
    if where == "reading":
        _interrupt_after(monkeypatch, build_mod.DocStoreWriter, "sync", 2, full)
    else:
        _interrupt_after(monkeypatch, BM25StreamBuilder, "finish", 0, full)
    with pytest.raises(IndexBuildError, match=r"disk full.*holds no manifest") as info:
        build_index(corpus, tmp_path / "idx", chunk_passages=40, show_progress=False)
    assert "passages are checkpointed: free space and rerun with --resume" in str(info.value)
    assert not (tmp_path / "idx" / "manifest.json").exists()
    with pytest.raises(IndexLoadError, match="unfinished build"):
        load_index(tmp_path / "idx")
    monkeypatch.undo()
    m = build_index(corpus, tmp_path / "idx", chunk_passages=40, show_progress=False, resume=True)
    assert m.num_documents == 150 and len(load_index(tmp_path / "idx").docs) == 150


class _FakeEncoder:
    """A deterministic stand-in for the sentence encoder: vectors from a hash of the text."""

    label, dim = "fake-encoder", 16

    def __init__(self, model=None, device=None, batch_size=64):
        self.calls = 0

    def encode_passages(self, docs):
        out = np.stack([np.random.default_rng(zlib.crc32(d.text.encode())).standard_normal(16) for d in docs])
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("kind", ["flat", "ivfpq"])
def test_a_resumed_dense_build_equals_an_uninterrupted_one(tmp_path, monkeypatch, kind):
    monkeypatch.setattr(build_mod, "Encoder", _FakeEncoder)
    corpus = write_corpus(_zipf_docs(400), tmp_path / "c.jsonl")
    opts = {"retriever": "dense", "index_type": kind, "chunk_passages": 50, "show_progress": False,
            "dense": {"nlist": 4, "pq_m": 4}}  # fmt: skip
    build_index(corpus, tmp_path / "whole", **opts)
    with monkeypatch.context() as m:
        _interrupt_after(m, _FakeEncoder, "encode_passages", 5, KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            build_index(corpus, tmp_path / "cut", **opts)
    assert read_state(tmp_path / "cut").passages == 250
    manifest = build_index(corpus, tmp_path / "cut", resume=True, **opts)
    assert manifest.model == "fake-encoder" and manifest.params["index_type"] == kind
    assert _files(tmp_path / "cut") == _files(tmp_path / "whole")


def test_a_dense_build_interrupted_while_filling_the_index_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    import faiss

    monkeypatch.setattr(build_mod, "Encoder", _FakeEncoder)
    corpus = write_corpus(_zipf_docs(300), tmp_path / "c.jsonl")
    opts = {"retriever": "dense", "index_type": "flat", "chunk_passages": 100, "show_progress": False}
    build_index(corpus, tmp_path / "whole", **opts)
    monkeypatch.setattr(build_mod.BuildRequest, "checkpoint_vectors", 64)
    real_fill = build_mod.fill_index

    def fill_then_stop(index, vectors, start=0, **kw):
        real_fill(index, vectors[:200], start=start, block=64, progress=None,
                  checkpoint=kw["checkpoint"], checkpoint_every=64)  # fmt: skip
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(build_mod, "fill_index", fill_then_stop)
        with pytest.raises(KeyboardInterrupt):
            build_index(corpus, tmp_path / "cut", **opts)
    state = read_state(tmp_path / "cut")
    assert state.phase == "index" and state.extra["added"] == 192
    build_index(corpus, tmp_path / "cut", resume=True, **opts)
    a = faiss.read_index(str(tmp_path / "cut" / "dense" / "index.faiss"))
    b = faiss.read_index(str(tmp_path / "whole" / "dense" / "index.faiss"))
    assert a.ntotal == b.ntotal == 300
    assert np.array_equal(a.reconstruct_n(0, 300), b.reconstruct_n(0, 300))


def test_cli_names_an_unfinished_build_and_resumes_it(tmp_path, monkeypatch, capsys):
    from searchr1.cli import main

    corpus = write_corpus(_zipf_docs(120), tmp_path / "c.jsonl")
    args = [
        "index",
        "build",
        "--corpus",
        str(corpus),
        "--out",
        str(tmp_path / "idx"),
        "--chunk-passages",
        "30",
    ]
    with monkeypatch.context() as m:
        _interrupt_after(m, BM25StreamBuilder, "add_chunk", 1, KeyboardInterrupt())
        assert main(args) == 2
    assert "rerun the same command with --resume" in capsys.readouterr().err
    assert main(args) == 2
    assert "holds an unfinished build (30 passages read" in capsys.readouterr().err
    assert main(["search", "--index", str(tmp_path / "idx"), "w1x"]) == 2
    assert "unfinished build" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0
    assert "indexed 120 passages" in capsys.readouterr().out
