"""Fair micro-batching for the retrieval server: one backend call at a time, shared max-min fairly.

Requests wait in a queue ordered by when they last got service (arrival, or the end of the last
backend call that answered some of their queries). Each backend call serves the ``topk`` of the
request waiting longest and takes up to ``B = max_batch_queries`` queries from the waiting requests
with that topk (the ``B`` waiting longest), split by water filling (max-min fairness)::

    share_j = min(remaining_j, level),   level = the largest value with  sum_j share_j <= B

so a request of a few queries is finished by the next call whatever else is waiting, and a request
of 1,024 queries is answered over ``ceil(1024 / B)`` calls interleaved with everyone else's.
Concurrent small requests still share one call (one request of 128 queries and 128 requests of one
query cost about the same backend time).

The hits of each call are encoded to JSON on the worker thread, one query at a time
(:class:`searchr1.retrieval.wire.HitEncoder`): small pieces between which the interpreter lock
changes hands, so the event loop keeps answering other clients; it only sends the joined bytes.
"""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

from searchr1.retrieval.base import Retriever
from searchr1.retrieval.wire import HitEncoder, assemble


def fair_shares(remaining: list[int], budget: int) -> list[int]:
    """Split ``budget`` over requests needing ``remaining[j]`` each, max-min fairly (water filling).

    Needs ``len(remaining) <= budget``; every request gets at least one query (or all it needs).
    """
    shares = [0] * len(remaining)
    left = budget
    order = sorted(range(len(remaining)), key=remaining.__getitem__)
    for k, j in enumerate(order):
        give = min(remaining[j], left // (len(order) - k))
        shares[j] = give
        left -= give
    return shares


def _settle(future: Future, result: object = None, error: BaseException | None = None) -> None:
    """Resolve ``future`` unless it is already done (a request cancelled meanwhile)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


@dataclass
class Answer:
    """What a request gets back: the response body and the backend seconds (wall, CPU) it took part in."""

    body: bytes
    search_wall_s: float
    search_cpu_s: float
    backend_calls: int


@dataclass
class _Job:
    queries: list[str]
    topk: int
    scores: bool
    future: Future = field(default_factory=Future)
    ready_at: int = 0
    """Queue position: the tick of its arrival or of the end of the last call that served it."""
    scheduled: int = 0
    """Queries handed to backend calls so far."""
    pieces: list[str | None] = field(default_factory=list)
    answered: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    calls: int = 0

    def __post_init__(self) -> None:
        self.pieces = [None] * len(self.queries)


class FairBatcher:
    """A worker thread that answers queued requests in fair, bounded backend calls."""

    def __init__(self, retriever: Retriever, max_batch_queries: int = 128) -> None:
        if max_batch_queries < 1:
            raise ValueError(f"max_batch_queries must be >= 1, got {max_batch_queries}")
        self.retriever = retriever
        self.max_batch_queries = max_batch_queries
        self.backend_calls = 0
        self.encoder = HitEncoder()
        """Used on the worker thread only."""
        self.call_sizes: list[int] = []
        """Queries of each backend call so far (the last 1,000)."""
        self._pending: list[_Job] = []
        self._ticks = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="retrieval-batcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            waiting = list(self._pending)
            self._pending.clear()
            self._cond.notify_all()
        for job in waiting:
            _settle(job.future, error=RuntimeError("the retrieval server is shutting down"))
        if self._thread is not None:
            self._thread.join(timeout_s)

    def submit(self, queries: list[str], topk: int, scores: bool) -> Future:
        """Queue a request; the future resolves to an :class:`Answer` (or the backend's exception)."""
        job = _Job(list(queries), topk, scores)
        with self._cond:
            job.ready_at = next(self._ticks)
            if self._closed:
                raise RuntimeError("the retrieval server is shutting down")
            self._pending.append(job)
            self._cond.notify()
        return job.future

    # -- worker ------------------------------------------------------------------------------------

    def _take(self) -> tuple[int, list[tuple[_Job, int, int]]]:
        """The next call's topk and its slices ``(job, start, stop)`` (called with the lock held)."""
        self._pending = [j for j in self._pending if not j.future.done()]  # drop cancelled or failed
        if not self._pending:
            return 0, []
        self._pending.sort(key=lambda j: j.ready_at)
        topk = self._pending[0].topk
        candidates = [j for j in self._pending if j.topk == topk][: self.max_batch_queries]
        shares = fair_shares([len(j.queries) - j.scheduled for j in candidates], self.max_batch_queries)
        slices = []
        for job, share in zip(candidates, shares, strict=True):
            slices.append((job, job.scheduled, job.scheduled + share))
            job.scheduled += share
        self._pending = [j for j in self._pending if j.scheduled < len(j.queries)]
        return topk, slices

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                topk, slices = self._take()
            if slices:
                self._call(topk, slices)
                with self._cond:  # served requests queue up behind those that arrived meanwhile
                    for job, _, _ in slices:
                        job.ready_at = next(self._ticks)

    def _call(self, topk: int, slices: list[tuple[_Job, int, int]]) -> None:
        queries = [q for job, start, stop in slices for q in job.queries[start:stop]]
        self.backend_calls += 1
        self.call_sizes = [*self.call_sizes[-999:], len(queries)]
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            results = self.retriever.search(queries, topk)
            if len(results) != len(queries):
                raise RuntimeError(f"backend returned {len(results)} results for {len(queries)} queries")
        except Exception as exc:  # answered as 503 to every request in this call
            for job, _, _ in slices:
                _settle(job.future, error=exc)
            return
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        offset = 0
        for job, start, stop in slices:
            hits = results[offset : offset + stop - start]
            offset += stop - start
            if job.future.done():  # cancelled, or failed in an earlier call
                continue
            try:
                job.pieces[start:stop] = [self.encoder.encode(h, job.scores) for h in hits]
            except Exception as exc:  # a backend hit that cannot be encoded
                _settle(job.future, error=exc)
                continue
            job.answered += stop - start
            job.wall_s += wall
            job.cpu_s += cpu
            job.calls += 1
            if job.answered == len(job.queries):
                body = assemble(job.pieces)  # type: ignore[arg-type]
                job.pieces = []
                _settle(job.future, Answer(body, job.wall_s, job.cpu_s, job.calls))
