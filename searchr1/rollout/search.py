"""Running searches for the rollout: in a thread pool, with a timeout and retries per call.

A ``SearchJob`` answers one batch of queries. Each attempt runs ``retriever.search`` on a worker
thread; an attempt that raises, returns a malformed answer, or outlives ``timeout_s`` is retried
up to ``retries`` times, after which the job fails with a ``SearchError`` message instead of
hits. A failed search never raises into the engine: it becomes an observation.

The HF engine polls jobs between decoding steps (``poll``); the turn-synchronous engine blocks
on them (``wait``). A timed-out attempt's thread cannot be interrupted; its late answer is
ignored.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

from searchr1.retrieval.base import Hit, Retriever, SearchError


class SearchJob:
    """One batched search call with retries; ``result``/``error`` are set once ``done``."""

    def __init__(self, runner: SearchRunner, queries: list[str], owners: list[Any]) -> None:
        self.runner = runner
        self.queries = queries
        self.owners = owners
        """Who asked (episode indices), aligned with ``queries``."""
        self.attempts = 0
        self.result: list[list[Hit]] | None = None
        self.error: str | None = None
        self.started = time.perf_counter()
        self.finished = 0.0
        self._future: Future | None = None
        self._attempt_start = 0.0
        self._launch()

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    @property
    def elapsed(self) -> float:
        return (self.finished or time.perf_counter()) - self.started

    def _launch(self) -> None:
        self.attempts += 1
        self._attempt_start = time.perf_counter()
        self._future = self.runner.pool.submit(
            self.runner.retriever.search, list(self.queries), self.runner.topk
        )

    def _fail_or_retry(self, message: str) -> None:
        if self.attempts <= self.runner.retries:
            self._launch()
        else:
            self.error = f"{message} (after {self.attempts} attempt{'s' if self.attempts > 1 else ''})"
            self.finished = time.perf_counter()

    def poll(self) -> bool:
        """Advance the job without blocking; True once it has a result or an error."""
        if self.done:
            return True
        fut = self._future
        assert fut is not None
        if fut.done():
            try:
                hits = fut.result()
                self._check(hits)
            except Exception as exc:  # any backend failure becomes an observation
                kind = "search error" if isinstance(exc, SearchError) else type(exc).__name__
                self._fail_or_retry(f"{kind}: {exc}")
                return self.done
            self.result = [list(h) for h in hits]
            self.finished = time.perf_counter()
            return True
        if time.perf_counter() - self._attempt_start > self.runner.timeout_s:
            fut.cancel()
            self._fail_or_retry(f"timed out after {self.runner.timeout_s:g}s")
        return self.done

    def _check(self, hits: Any) -> None:
        if not isinstance(hits, list) or len(hits) != len(self.queries):
            got = len(hits) if isinstance(hits, list) else type(hits).__name__
            raise SearchError(f"backend answered {got} result lists for {len(self.queries)} queries")
        for per_query in hits:
            for hit in per_query:
                if not isinstance(getattr(hit, "title", None), str) or not isinstance(
                    getattr(hit, "text", None), str
                ):
                    raise SearchError(f"backend answered a malformed hit {hit!r:.80} (expected a Hit)")

    def deadline(self) -> float:
        """Seconds until the current attempt times out."""
        return max(0.0, self.runner.timeout_s - (time.perf_counter() - self._attempt_start))

    def wait(self) -> None:
        """Block until the job is done (the turn-synchronous engine's barrier)."""
        while not self.poll():
            assert self._future is not None
            wait_futures([self._future], timeout=self.deadline() + 1e-3)


class SearchRunner:
    """A thread pool that runs ``SearchJob``s against one retriever."""

    def __init__(self, retriever: Retriever, topk: int, timeout_s: float, retries: int, workers: int) -> None:
        self.retriever = retriever
        self.topk = topk
        self.timeout_s = timeout_s
        self.retries = retries
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="searchr1-search")

    def submit(self, queries: list[str], owners: list[Any]) -> SearchJob:
        return SearchJob(self, queries, owners)

    def wait_any(self, jobs: list[SearchJob], timeout: float | None = None) -> None:
        """Block until one of ``jobs`` may have progressed (a future finished or an attempt timed out)."""
        futures = [j._future for j in jobs if not j.done and j._future is not None]
        if not futures:
            return
        limit = min(j.deadline() for j in jobs if not j.done) + 1e-3
        if timeout is not None:
            limit = min(limit, timeout)
        wait_futures(futures, timeout=limit, return_when=FIRST_COMPLETED)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
