"""The scale benchmark's workload generators and growth fits (the full run is `--quick`, slow)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from searchr1.bench.retrieval_scale import (
    BLOCK,
    VectorModel,
    WikiLikeCorpus,
    exact_top,
    extrapolate,
    fit_predict,
    pseudo_word,
    recall_at,
)
from searchr1.retrieval.bm25 import Tokenizer


def test_generated_passages_are_seeded_wiki_shaped_and_any_range_stands_alone():
    gen = WikiLikeCorpus(seed=3)
    first = list(gen.passages(0, BLOCK + 50))
    assert first == list(WikiLikeCorpus(seed=3).passages(0, BLOCK + 50))
    assert first != list(WikiLikeCorpus(seed=4).passages(0, BLOCK + 50))
    assert list(gen.passages(BLOCK - 20, 40)) == first[BLOCK - 20 : BLOCK + 20]  # across a block edge
    assert all(len(d.text.split()) == 100 for d in first[:200]) and len({d.id for d in first}) == len(first)
    tok = Tokenizer()
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
    assert data["targets"]["bm25_build_peak_rss_gb_21M"]["basis"] == "extrapolated"
