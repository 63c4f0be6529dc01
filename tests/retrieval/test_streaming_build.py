"""Streaming index builds: equal to one-shot builds, resumable, refusing a changed corpus, and never
leaving a loadable half index (disk full, interruption)."""

from __future__ import annotations

import errno
import json
import os
import zlib
from pathlib import Path

import numpy as np
import pytest

from searchr1.retrieval import build as build_mod
from searchr1.retrieval.bm25 import BM25Params, BM25Retriever, hash_terms
from searchr1.retrieval.bm25 import build as bm25_build
from searchr1.retrieval.bm25.analysis import RegexAnalyzer
from searchr1.retrieval.bm25.build import BM25StreamBuilder
from searchr1.retrieval.bm25.files import POSTINGS_FILE
from searchr1.retrieval.bm25.retriever import _best
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


@pytest.mark.parametrize(
    "settings",
    [{}, {"preset": "bm25s"}, {"preset": "bm25s", "method": "bm25+"}, {"method": "robertson"},
     {"doc_length": "exact", "analyzer": "regex"}],
)  # fmt: skip
def test_the_spilled_and_merged_build_equals_the_in_memory_one(tmp_path, monkeypatch, settings):
    docs = _zipf_docs(300)
    corpus = write_corpus(docs, tmp_path / "c.jsonl")
    plans = []
    real_plan = bm25_build.plan_ranges
    monkeypatch.setattr(
        bm25_build, "plan_ranges", lambda runs, budget: plans.append(real_plan(runs, budget)) or plans[-1]
    )
    # chunks of 37 passages and ~100 postings merged at a time: 9 runs, many hash ranges
    build_index(corpus, tmp_path / "idx", bm25=settings, chunk_passages=37, memory_mb=0.01, show_progress=False)
    ((groups, cuts),) = plans
    assert len(cuts) == 9 and len(groups) > 20
    streamed = load_index(tmp_path / "idx")
    in_memory = BM25Retriever.from_documents(docs, **settings)
    a, b = streamed.matrix, in_memory.matrix
    (ptr_a, rows_a, data_a), (ptr_b, rows_b, data_b) = streamed.csc(), in_memory.csc()
    assert np.array_equal(ptr_a, ptr_b) and np.array_equal(rows_a, rows_b)
    assert np.array_equal(data_a, data_b)  # bit-identical float32 scores, decoded from the blocks
    assert np.array_equal(a.column_max(), b.column_max())
    columns = in_memory.vocab.vocab
    assert streamed.vocab.terms() == sorted(columns, key=columns.__getitem__)
    assert (a.nonoccurrence is None) == (b.nonoccurrence is None)
    if a.nonoccurrence is not None:
        assert np.array_equal(a.nonoccurrence, b.nonoccurrence)
    queries = [" ".join(d.text.split()[:4]) for d in docs[::9]] + ["w1x w1x w7x", "t3x", "nothing"]
    assert streamed.search(queries, 5) == in_memory.search(queries, 5)


def test_each_merged_range_holds_at_most_the_budget_unless_it_stands_alone():
    docs = _zipf_docs(400, seed=3, vocab=3000)
    analyzer = BM25Params.from_preset().make_analyzer()
    runs = [bm25_build.make_run(docs[i : i + 50], analyzer, i) for i in range(0, 400, 50)]
    for budget in (50, 400, 3000):
        groups, cuts = bm25_build.plan_ranges(runs, budget)
        sizes = [sum(int(p[g1] - p[g0]) for _, p in cuts) for g0, g1 in groups]
        assert sum(sizes) == sum(r.n_postings for r in runs)
        assert all(size <= budget or g1 - g0 == 1 for size, (g0, g1) in zip(sizes, groups, strict=True))
        assert [g[0] for g in groups[1:]] == [g[1] for g in groups[:-1]]  # contiguous, in hash order


def test_terms_whose_first_hashes_collide_get_columns_of_their_own_and_the_vocabulary_is_hashed_again(
    tmp_path, monkeypatch
):
    real = bm25_build.term_key
    monkeypatch.setattr(bm25_build, "term_key", lambda t: (7, real(t)[1]))  # every first hash the same
    docs = _zipf_docs(120, seed=5)
    build_index(write_corpus(docs, tmp_path / "c.jsonl"), tmp_path / "idx", chunk_passages=30, show_progress=False)
    streamed = load_index(tmp_path / "idx")
    hashes = np.load(tmp_path / "idx" / "bm25" / "vocab.hash.npy")  # hashed again: distinct, sorted
    assert len(np.unique(hashes)) == len(hashes) == len(in_memory_terms := streamed.vocab.terms())
    assert np.all(hashes[1:] > hashes[:-1]) and len(in_memory_terms) > 100
    in_memory = BM25Retriever.from_documents(docs)
    assert np.array_equal(streamed.csc()[2], in_memory.csc()[2])
    queries = [" ".join(d.text.split()[:3]) for d in docs[::5]]
    assert streamed.search(queries, 5) == in_memory.search(queries, 5)
    assert all(streamed.search([t], 1)[0] for t in ("w1x", "w2x", "t3x"))


def test_the_bm25s_preset_scores_as_bm25s_does():
    import bm25s

    docs = _zipf_docs(300, seed=4)
    for method in ("lucene", "bm25l"):
        ours = BM25Retriever.from_documents(docs, preset="bm25s", method=method)
        tok = RegexAnalyzer("english", "en")
        vocab: dict[str, int] = {}
        ids = [[vocab.setdefault(t, len(vocab)) for t in tok(f"{d.title} {d.text}")] for d in docs]
        model = bm25s.BM25(k1=1.5, b=0.75, method=method)
        model.index((ids, vocab), show_progress=False)
        sc = model.scores
        terms = set(vocab) - {""}  # bm25s adds an empty term to the vocabulary it is given
        assert terms == set(ours.vocab.vocab)
        for term in terms:
            col = model.vocab_dict[term]
            theirs = slice(sc["indptr"][col], sc["indptr"][col + 1])
            mine = ours.vocab.lookup([term])[0]
            rows, vals = ours._column(mine)
            assert np.array_equal(rows, sc["indices"][theirs]) and np.array_equal(vals, sc["data"][theirs])


def test_maxscore_top_k_equals_exhaustive_scoring(tmp_path):
    docs = _zipf_docs(3000, seed=1, vocab=2000)
    r = BM25Retriever.from_documents(docs)
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
    from searchr1.retrieval.bm25 import vocabulary as bm25_index

    real = bm25_index.term_hash
    monkeypatch.setattr(bm25_index, "term_hash", lambda t, s=0: 7 if s == 0 else real(t, s))  # all collide
    _, _, salt = bm25_index.hash_terms(terms)
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


def _count_calls(monkeypatch, target, name: str, measure) -> list:
    """Record ``measure(*args)`` of every call of ``target.name`` (the work a resumed build does)."""
    real, seen = getattr(target, name), []

    def wrapped(*args, **kwargs):
        seen.append(measure(*args, **kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, wrapped)
    return seen


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


def _skipping_build_interrupted_then_resumed(monkeypatch, corpus, out):
    """A build that skips bad lines, interrupted after its second chunk (30 passages each), then resumed:
    its manifest."""
    with monkeypatch.context() as m:
        _interrupt_after(m, BM25StreamBuilder, "add_chunk", 2, KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            build_index(corpus, out, chunk_passages=30, skip_bad_lines=True, show_progress=False)
    return build_index(corpus, out, chunk_passages=30, skip_bad_lines=True, show_progress=False, resume=True)


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
    chunks_after = _count_calls(monkeypatch, BM25StreamBuilder, "add_chunk", lambda self, docs, *a, **k: len(docs))
    m = build_index(corpus, tmp_path / "cut", chunk_passages=40, show_progress=False, resume=True)
    assert m.build["resumed"] and m.num_documents == 250
    assert chunks_after == [40, 40, 40, 10]  # only the chunks after the checkpoint were read again
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
    m = _skipping_build_interrupted_then_resumed(monkeypatch, corpus, tmp_path / "b")
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


@pytest.mark.parametrize("where", ["run", "index"])
def test_a_full_disk_while_spilling_or_merging_cleans_up_and_names_the_folder_and_the_space(
    tmp_path, monkeypatch, where
):
    corpus = write_corpus(_zipf_docs(200), tmp_path / "c.jsonl")
    build_index(corpus, tmp_path / "whole", chunk_passages=40, show_progress=False)
    real_write, written = bm25_build._write, {"bytes": 0}

    def filling_disk(fh, data):
        name = str(fh.name)
        hit = ("run_000002" in name) if where == "run" else (f"{os.sep}bm25{os.sep}" in name)
        if hit:
            written["bytes"] += len(data) if isinstance(data, bytes) else np.asarray(data).nbytes
            if written["bytes"] > 300:  # the disk fills a few hundred bytes into the file
                raise OSError(errno.ENOSPC, "No space left on device", name)
        real_write(fh, data)

    monkeypatch.setattr(bm25_build, "_write", filling_disk)
    with pytest.raises(IndexBuildError) as info:
        build_index(corpus, tmp_path / "idx", chunk_passages=40, show_progress=False)
    message = str(info.value)
    spill = tmp_path / "idx" / ".build" / "bm25_runs"
    folder = spill if where == "run" else tmp_path / "idx" / "bm25"
    assert f"disk full in {folder} (its partial file removed; it needs about" in message
    assert "rerun with --resume" in message
    needed = int(message.split(" bytes) more")[0].split("(")[-1].replace(",", ""))
    index = sum(p.stat().st_size for p in (tmp_path / "whole" / "bm25").iterdir())
    # the index still to write (and, while spilling, the runs of the chunks left)
    assert 0.5 * index < needed < (4 if where == "run" else 2) * index
    assert sorted(p.name for p in spill.iterdir()) == [f"run_{k:06d}.run" for k in range(2 if where == "run" else 5)]
    assert not (tmp_path / "idx" / "bm25").exists() and not (tmp_path / "idx" / "manifest.json").exists()
    monkeypatch.undo()
    build_index(corpus, tmp_path / "idx", chunk_passages=40, show_progress=False, resume=True)
    assert _files(tmp_path / "idx") == _files(tmp_path / "whole")


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
    encoded = _count_calls(monkeypatch, _FakeEncoder, "encode_passages", lambda self, docs: len(docs))
    added = _count_calls(monkeypatch, build_mod, "fill_index", lambda index, vectors, start=0, **kw: len(vectors) - start)
    manifest = build_index(corpus, tmp_path / "cut", resume=True, **opts)
    assert manifest.model == "fake-encoder" and manifest.params["index_type"] == kind
    assert sum(encoded) == 150 and added == [400]  # 150 passages encoded after the checkpoint
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
    encoded = _count_calls(monkeypatch, _FakeEncoder, "encode_passages", lambda self, docs: len(docs))
    added = _count_calls(monkeypatch, build_mod, "fill_index", lambda index, vectors, start=0, **kw: len(vectors) - start)
    build_index(corpus, tmp_path / "cut", resume=True, **opts)
    assert encoded == [] and added == [108]  # nothing encoded again, the 108 vectors left added
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


def test_repeated_ids_and_empty_passages_are_named_by_line_or_skipped_keeping_the_first(tmp_path, monkeypatch):
    lines = [json.dumps({"id": str(i), "contents": f'"T{i}"\nw{i}x text'}) for i in range(100)]
    lines[80] = json.dumps({"id": "7", "contents": '"Other"\nrepeats an id read 73 lines before'})
    lines[90] = json.dumps({"id": "90", "contents": " \n "})
    lines[95] = json.dumps({"id": " ", "contents": "no id"})
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:81: id '7' repeats the id of passage 7 .*ids must be unique"):
        build_index(corpus, tmp_path / "a", chunk_passages=30, show_progress=False)
    with pytest.raises(IndexLoadError):  # nothing left that loads as an index
        load_index(tmp_path / "a")
    body = "\n".join(lines[:80] + lines[81:]) + "\n"
    (tmp_path / "empty.jsonl").write_text(body)
    with pytest.raises(ValueError, match=r"empty\.jsonl:90: empty 'contents'"):
        build_index(tmp_path / "empty.jsonl", tmp_path / "e", show_progress=False)
    (tmp_path / "noid.jsonl").write_text("\n".join(lines[95:]) + "\n")
    with pytest.raises(ValueError, match=r"noid\.jsonl:1: field 'id' is empty"):
        build_index(tmp_path / "noid.jsonl", tmp_path / "n", show_progress=False)
    # skipped and counted, across a resume whose checkpoint holds the first "7"
    m = _skipping_build_interrupted_then_resumed(monkeypatch, corpus, tmp_path / "b")
    assert m.num_documents == 97 and m.skipped_lines == 3
    r = load_index(tmp_path / "b")
    assert [h.id for h in r.search(["w7x"], 3)[0]] == ["7"] and r.docs[7].title == "T7"


def _awkward_corpus(path: Path) -> Path:
    """Lines a pass over a real corpus meets: blank ones, malformed ones, an id repeated in a later
    chunk and in the same chunk, long documents cut into several passages, no final newline."""
    lines = [json.dumps({"id": str(i), "contents": f'"T{i % 7}"\n' + " ".join(f"w{(i * j) % 97}x" for j in range(8 + i % 30))})
             for i in range(260)]  # fmt: skip
    lines[5] = ""
    lines[17] = "{not json"
    lines[60] = json.dumps({"id": "3", "contents": '"Again"\nrepeats an id of the first chunk'})
    lines[61] = json.dumps({"id": "61", "contents": '"Twice"\nfirst of two'})
    lines[62] = json.dumps({"id": "61", "contents": '"Twice"\nrepeats the line before'})
    lines[150] = json.dumps({"id": "150", "title": "Long", "text": " ".join(f"v{j}x" for j in range(95))})
    lines[200] = "   "
    path.write_text("\n".join(lines))  # no newline after the last line
    return path


def test_the_index_is_the_same_byte_for_byte_whatever_the_number_of_workers(tmp_path):
    corpus = _awkward_corpus(tmp_path / "c.jsonl")
    opts = {"chunk_passages": 30, "chunk_size": 40, "skip_bad_lines": True, "show_progress": False}
    one = build_index(corpus, tmp_path / "one", workers=1, **opts)
    two = build_index(corpus, tmp_path / "two", workers=2, memory_mb=512, **opts)
    assert two.build["workers"] == 2 and one.build["workers"] == 1
    assert one.skipped_lines == two.skipped_lines == 3  # the malformed line and the two repeats
    assert one.num_documents == two.num_documents == 255 + 2  # line 150 is three passages of 40 words
    files = _files(tmp_path / "one")
    assert {"docs.zst", "docs.frames.npy", "docs.dict", "docs.store.json", f"bm25/{POSTINGS_FILE}"} <= set(files)
    assert files == _files(tmp_path / "two")
    r = load_index(tmp_path / "two")
    assert r.docs[3].id == "3" and [h.id for h in r.search(["repeats an id"], 3)[0]] == []


def test_the_same_index_in_one_process_as_from_the_documents(tmp_path):
    docs = _zipf_docs(200, seed=9)
    corpus = write_corpus(docs, tmp_path / "c.jsonl")
    build_index(corpus, tmp_path / "idx", chunk_passages=45, show_progress=False, workers=2)
    r = load_index(tmp_path / "idx")
    assert [r.docs[i] for i in range(200)] == docs
    in_memory = BM25Retriever.from_documents(docs)
    assert all(np.array_equal(a, b) for a, b in zip(r.csc(), in_memory.csc(), strict=True))


def test_a_build_on_two_workers_interrupted_then_resumed_equals_an_uninterrupted_one(tmp_path, monkeypatch):
    corpus = _awkward_corpus(tmp_path / "c.jsonl")
    opts = {"chunk_passages": 30, "skip_bad_lines": True, "show_progress": False}
    build_index(corpus, tmp_path / "whole", workers=1, **opts)
    with monkeypatch.context() as m:
        _interrupt_after(m, BM25StreamBuilder, "add_chunk", 4, KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            build_index(corpus, tmp_path / "cut", workers=2, **opts)
    state = read_state(tmp_path / "cut")
    assert state.chunks == 4 and state.skipped == 3
    runs = sorted(p.name for p in (tmp_path / "cut" / ".build" / "bm25_runs").iterdir())
    assert runs == [f"run_{k:06d}.run" for k in range(4)]  # what workers wrote ahead was removed
    build_index(corpus, tmp_path / "cut", workers=2, resume=True, **opts)
    assert _files(tmp_path / "cut") == _files(tmp_path / "whole")


def test_chunks_are_cut_on_lines_by_count_and_by_bytes(tmp_path, monkeypatch):
    from searchr1.retrieval.bm25 import first_pass as pass1

    path = tmp_path / "c.jsonl"
    path.write_bytes(b"a\n" * 7 + b"b" * 5000 + b"\n" + b"c\n\n" + b"tail")
    data = path.read_bytes()
    spans = list(pass1.chunk_spans(path, ReadPosition(), 3, 0))  # 3 lines, at most 6,144 bytes
    assert [data[s.start : s.end] for s in spans] == [b"a\na\na\n", b"a\na\na\n", b"a\n" + b"b" * 5000 + b"\nc\n",
                                                     b"\ntail"]  # fmt: skip
    assert [s.lineno for s in spans] == [0, 3, 6, 9] and [s.index for s in spans] == [0, 1, 2, 3]
    # 2 lines, at most 4,096 bytes: the long line is a chunk of its own; from a checkpoint's position
    later = list(pass1.chunk_spans(path, ReadPosition(6, 3, 0), 2, 5))
    assert [data[s.start : s.end] for s in later] == [b"a\na\n", b"a\na\n", b"b" * 5000 + b"\n", b"c\n\n", b"tail"]
    assert [s.index for s in later] == [5, 6, 7, 8, 9] and [s.lineno for s in later] == [3, 5, 7, 8, 10]
    monkeypatch.setattr(pass1, "READ_BLOCK", 3)  # lines across many reads
    assert list(pass1.chunk_spans(path, ReadPosition(), 3, 0)) == spans


def test_no_more_workers_than_the_memory_budget_holds_chunks_for():
    def workers(**kw):
        return build_mod.pass1_workers(build_mod.BuildRequest(Path("c.jsonl"), Path("out"), **kw))

    assert workers(workers=8) == 4  # 512 MB at 20,000 passages a chunk of ~6 kB each
    assert workers(workers=2) == 2 and workers(workers=1) == 1
    assert workers(workers=8, memory_mb=100) == 1  # one chunk always
    assert workers(workers=8, chunk_passages=5_000, memory_mb=512) == 8
