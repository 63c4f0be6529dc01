"""The retrieval benchmark in quick mode writes its JSON with the headline (slow: starts a server)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from searchr1.bench.retrieval import clustered_vectors, make_corpus, make_queries


def test_generated_workload_is_seeded_and_shaped():
    a, b = make_corpus(50, seed=3), make_corpus(50, seed=3)
    assert a == b and len({d.id for d in a}) == 50
    assert all(len(d.text.split()) == 60 for d in a)
    assert make_queries(a, 5, 3) == make_queries(b, 5, 3)
    v = clustered_vectors(100, 16, seed=0, clusters=5)
    assert v.shape == (100, 16) and abs(float((v**2).sum(axis=1).mean()) - 1.0) < 1e-5


@pytest.mark.slow
def test_quick_bench_writes_results(tmp_path):
    from searchr1.bench import report
    from searchr1.bench.retrieval import run

    result = run(SimpleNamespace(quick=True, seed=0, out_dir=str(tmp_path)))
    path = report(result, tmp_path)
    data = json.loads(path.read_text())
    assert data["headline"] == pytest.approx(result.headline) and data["headline"] > 0
    paths = {(r["bench"], r["path"]) for r in data["measurements"]}
    assert ("bm25", "server") in paths and ("dense", "hnsw") in paths and ("dense", "ivf") in paths
