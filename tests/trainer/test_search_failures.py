"""Search failures in training (issue 23): counted in the metrics, shown in the progress line, one
warning with the cause when they start, and a stop with a checkpoint and a non-zero exit code when
their share over a window of steps exceeds ``rollout.max_search_failure_rate``.

Fault injection: search backends registered for these tests that fail every other call, or hang
(with a short ``rollout.search_timeout_s``), during short runs of the tiny model; every trajectory
searches once (the ``ForceSearch`` steer)."""

from __future__ import annotations

import threading

import pytest
import rlworld

from searchr1.retrieval.base import RETRIEVERS, Retriever, SearchError
from searchr1.trainer.loop import RLTrainer
from searchr1.trainer.search_health import SearchFailureMonitor
from searchr1.trainer.tracking import PROGRESS_KEYS


class FailEveryOther(Retriever):
    """BM25 over the world corpus; calls 1, 3, 5, ... raise. Counts the queries of failed calls."""

    name = "fail_every_other"

    def __init__(self, corpus: str) -> None:
        from searchr1.retrieval.bm25 import BM25Retriever

        self.inner = BM25Retriever.from_corpus(corpus)
        self.calls = 0
        self.failed_queries = 0
        self.queries = 0

    def search(self, queries, topk):
        self.calls += 1
        self.queries += len(queries)
        if self.calls % 2:
            self.failed_queries += len(queries)
            raise SearchError("backend overloaded (injected)")
        return self.inner.search(queries, topk)


class Hanging(Retriever):
    """Every call blocks until the test releases it (a backend that accepts and never answers)."""

    name = "hanging"
    release = threading.Event()

    def search(self, queries, topk):
        self.release.wait(60)
        return [[] for _ in queries]


@pytest.fixture
def backends():
    made: dict[str, Retriever] = {}

    def flaky(cfg):
        made["flaky"] = FailEveryOther(cfg.corpus)
        return made["flaky"]

    RETRIEVERS.add("test_fail_every_other", flaky)
    RETRIEVERS.add("test_hanging", lambda cfg: Hanging())
    Hanging.release.clear()
    yield made
    Hanging.release.set()  # let the hung worker threads finish
    RETRIEVERS.remove("test_fail_every_other")
    RETRIEVERS.remove("test_hanging")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return rlworld.write_world(tmp_path_factory.mktemp("world"))


@pytest.fixture
def force_search(monkeypatch):
    """Every rollout engine the trainer builds searches once per trajectory."""
    from searchr1.rollout.registry import build_engine
    from searchr1.trainer import loop

    def forced(cfg, model, tokenizer, retriever):
        return build_engine(cfg, model, tokenizer, retriever, steer=rlworld.ForceSearch(tokenizer))

    monkeypatch.setattr(loop, "build_engine", forced)


# -- the rule ---------------------------------------------------------------------------------------


def test_monitor_warns_once_per_outage_and_stops_over_the_window():
    causes = iter(f"cause {i}" for i in range(10))
    mon = SearchFailureMonitor(max_rate=0.5, window=3)
    seen = [mon.observe(s, f, 4, lambda: next(causes)) for s, f in enumerate([0, 2, 0, 2, 0, 0, 0, 4, 4], 1)]
    warned = [i + 1 for i, a in enumerate(seen) if a.warning]
    assert warned == [2, 8]  # the first failures, and again after 3 clean steps; not at step 4
    assert "2 of 4 searches failed at step 2" in seen[1].warning and "cause 0" in seen[1].warning
    assert [a.stop is not None for a in seen] == [False] * 8 + [True]  # steps 7-9: 8 of 12 failed
    assert (
        "67% of the searches of the last 3 steps" in seen[8].stop and "cause 2" in seen[8].stop
    )  # the latest cause


def test_monitor_never_stops_at_rate_one_and_not_before_the_window_is_full():
    never = SearchFailureMonitor(max_rate=1.0, window=2)
    assert all(never.observe(s, 4, 4, lambda: "down").stop is None for s in range(10))
    early = SearchFailureMonitor(max_rate=0.0, window=3)
    assert [early.observe(s, 1, 1, lambda: "down").stop is None for s in range(3)] == [True, True, False]


def test_progress_line_shows_the_failure_rate():
    assert ("rollout/search_failure_rate", "srch_fail") in PROGRESS_KEYS


# -- short runs with injected faults ----------------------------------------------------------------


def test_failing_share_is_counted_warned_once_and_the_run_goes_on(
    world, tiny_model_dir, tmp_path, backends, force_search, capsys
):
    cfg = rlworld.load(world, tiny_model_dir, tmp_path / "run", retrieval__backend="test_fail_every_other",
                       rollout__search_retries=0, rollout__max_search_failure_rate=1.0,
                       rollout__search_failure_window=2, trainer__total_steps=4,
                       rollout__max_obs_tokens=64, rollout__max_response_tokens=200)  # fmt: skip
    summary = RLTrainer(cfg).train()
    backend = backends["flaky"]
    rows = rlworld.read_metrics(tmp_path / "run")
    assert len(rows) == 4 and summary["step"] == 4
    assert sum(r["rollout/search_failures_total"] for r in rows) == backend.failed_queries > 0
    assert backend.failed_queries < backend.queries  # a share, not all
    for r in rows:
        assert r["rollout/search_failure_rate"] == pytest.approx(
            r["rollout/search_failures"] / r["rollout/searches"]
        )
    warnings = [line for line in capsys.readouterr().err.splitlines() if "searches failed" in line]
    assert len(warnings) == 1 and "backend overloaded (injected)" in warnings[0]
    assert (tmp_path / "run/checkpoints/step_000004/COMPLETE").is_file()


def test_hanging_backend_stops_the_cli_run_with_a_checkpoint_and_exit_code_2(
    world, tiny_model_dir, tmp_path, backends, force_search, capsys
):
    from searchr1.cli import main

    args = rlworld.overrides(world, tiny_model_dir, tmp_path / "run", retrieval__backend="test_hanging",
                             rollout__search_timeout_s=0.3, rollout__search_retries=0,
                             rollout__max_search_failure_rate=0.5, rollout__search_failure_window=2,
                             trainer__total_steps=6, rollout__max_obs_tokens=64,
                             rollout__max_response_tokens=200)  # fmt: skip
    code = main(["train", *args])
    err = capsys.readouterr().err
    assert code == 2
    rows = rlworld.read_metrics(tmp_path / "run")
    assert len(rows) == 2 and all(r["rollout/search_failure_rate"] == 1.0 for r in rows)
    assert (tmp_path / "run/checkpoints/step_000002/COMPLETE").is_file()
    warnings = [line for line in err.splitlines() if "searches failed at step" in line]
    assert len(warnings) == 1 and "timed out after 0.3s" in warnings[0]
    assert "error: stopping at step 2: 100% of the searches of the last 2 steps failed" in err
    assert "Checkpoint written to" in err
