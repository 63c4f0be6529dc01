"""The server-load benchmark's client against a real server on loopback (the full run is slow)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from searchr1.bench.cli import available, module_parser
from searchr1.bench.server_load import sample_corpus, small_beside_maximal, steady_load
from searchr1.retrieval.server import ServerLimits, create_app, serve_in_thread


def test_steady_load_counts_answers_and_errors(bm25, docs):
    queries = [d.title for d in docs]
    with serve_in_thread(create_app(bm25, access_log=False)) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        tally, seconds, warm = asyncio.run(steady_load(port, queries, 4, 5, 60.0, seed=0))
        assert len(tally.latencies) == 20 and len(warm.latencies) == 4 and tally.errors == []
        assert 20 <= tally.queries <= 80 and seconds > 0
    # the server is gone: every request is an error, none hangs
    tally, _, warm = asyncio.run(steady_load(port, queries, 2, 3, 10.0, seed=0))
    assert tally.latencies == [] and len(tally.errors) == 6 and len(warm.errors) == 2


def test_small_beside_maximal_reports_the_maximal_request(bm25, docs):
    limits = ServerLimits(max_queries=32, max_topk=10, max_hits=320, max_batch_queries=8)
    with serve_in_thread(create_app(bm25, limits, access_log=False)) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        small, big_s, hits, _ = asyncio.run(
            small_beside_maximal(port, [d.title for d in docs], vars(limits), 60.0)
        )
    assert hits == 320 and big_s > 0 and small.errors == []


def test_bench_cli_lists_server_load_with_its_options():
    import searchr1.bench.server_load as module

    assert "server-load" in available()
    assert not any(name.startswith("_") or name == "workload" for name in available())  # helpers are no bench
    opts = module_parser("server-load", module).parse_args(["--quick", "--clients", "8"])
    assert opts.quick and opts.clients == 8 and opts.requests == 50 and opts.out_dir == "benchmarks/results"


@pytest.mark.slow
def test_quick_server_load_writes_results(tmp_path):
    from searchr1.bench import report
    from searchr1.bench.server_load import run

    args = SimpleNamespace(
        quick=True, seed=0, clients=8, requests=5, max_seconds=60.0, corpus=None, server_option=[]
    )
    data = json.loads(report(run(args), tmp_path).read_text())
    assert data["errors"] == 0 and data["requests"] == 40
    assert data["p99_ms"] >= data["p50_ms"] > 0
    assert data["params"]["corpus"] == (
        sample_corpus().name if sample_corpus() else "generated (5,000 passages)"
    )
