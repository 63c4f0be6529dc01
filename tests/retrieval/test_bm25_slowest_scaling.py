"""benchmarks/bm25_slowest.py: the per-query scaling entry from two sizes that timed every query."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bm25_slowest.py"


@pytest.fixture(scope="module")
def slowest():
    spec = importlib.util.spec_from_file_location("bm25_slowest", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def entry(n: int, ours_ms: float, lucene_ms: float, slowest: int = 4096) -> dict:
    return {
        "n": n,
        "queries": 4096,
        "slowest": slowest,
        "ours_mean_ms_all": ours_ms,
        "lucene_mean_ms_slowest": lucene_ms,
    }


def test_exponent_of_mean_time_over_the_two_largest_full_sizes(slowest):
    saved = {"250000": entry(250_000, 0.5, 0.6), "1000000": entry(1_000_000, 1.0, 2.0),
             "4000000": entry(4_000_000, 2.0, 8.0), "scaling": {"stale": True}}  # fmt: skip
    got = slowest.scaling(saved)
    assert got["sizes"] == [1_000_000, 4_000_000]
    assert got["ours_time_exponent"] == pytest.approx(0.5)  # 2x for 4x the passages
    assert got["lucene_time_exponent"] == pytest.approx(1.0)
    assert got["ours_mean_ms"] == [1.0, 2.0]


def test_sizes_that_timed_only_the_slowest_do_not_count(slowest):
    saved = {"1000000": entry(1_000_000, 1.0, 2.0), "4000000": entry(4_000_000, 2.0, 8.0, slowest=1024)}
    assert slowest.scaling(saved) is None
    saved["250000"] = entry(250_000, 0.5, 1.0)
    got = slowest.scaling(saved)
    assert got["sizes"] == [250_000, 1_000_000]
    assert got["lucene_time_exponent"] == pytest.approx(math.log(2.0) / math.log(4.0))
