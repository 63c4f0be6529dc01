"""``searchr1 bench server-load``: concurrent clients against ``searchr1 serve`` on loopback.

Starts ``searchr1 serve`` (BM25; the wiki-18 sample of ``shared/data/flashrag-sample`` when it is found
next to the repository, else ``--corpus``, else 5,000 generated passages) as a separate process on
127.0.0.1, and measures from this process with keep-alive connections (asyncio, raw HTTP/1.1):

1. ``alone``: one client, requests back to back (the latency of an idle server).
2. ``load``: ``--clients`` (default 64) clients, each sending its next request (1-4 queries, topk 3,
   scores on) as soon as the previous one is answered. Requests, errors (non-200 or a wrong number
   of result lists), throughput, latency p50 / p99 / max. Target: 0 errors, p99 <= 3x p50.
   Timing starts once every client has connected and had one warm-up request answered; that
   burst (64 connections at once) is its own row, ``connect + first request``.
3. ``small beside maximal``: one request at the server's limits (``max_hits`` = queries x topk) while
   one client sends one-query requests back to back: their latency while the big one is served, and
   how many finished before it.

Bounded: every client stops after ``--requests`` requests, every phase after ``--max-seconds``; the
traffic goes only to the server this benchmark started on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from searchr1.bench import BenchResult
from searchr1.bench._workload import free_port, make_corpus, make_queries, sample_corpus, start_server

HOST = "127.0.0.1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--clients", type=int, default=64, help="concurrent clients of the load phase (default 64)"
    )
    parser.add_argument(
        "--requests", type=int, default=50, help="requests per client (default 50; --quick: 15)"
    )
    parser.add_argument(
        "--max-seconds", type=float, default=120.0, help="time limit of each phase (default 120)"
    )
    parser.add_argument("--corpus", default=None, help="corpus jsonl to serve (default: the wiki-18 sample)")
    parser.add_argument(
        "--server-option",
        action="append",
        default=[],
        metavar="OPTION",
        help="extra option of `searchr1 serve`, e.g. --server-option=--max-batch-queries=64",
    )


# -- the client ------------------------------------------------------------------------------------


@dataclass
class Tally:
    """Latencies (seconds) of answered requests and the errors, as ``kind: detail`` strings."""

    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    queries: int = 0


def request_bytes(queries: list[str], topk: int) -> bytes:
    body = json.dumps({"queries": queries, "topk": topk, "return_scores": True}).encode()
    head = f"POST /retrieve HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """Status and body of one HTTP/1.1 response with a Content-Length."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return status, await reader.readexactly(length)


class Client:
    """One keep-alive connection sending requests one after another."""

    def __init__(self, port: int, timeout_s: float) -> None:
        self.port = port
        self.timeout_s = timeout_s
        self.conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def ask(self, queries: list[str], topk: int, tally: Tally, parse: bool = True) -> None:
        """Send one request and record its latency, or an error. ``parse=False`` checks only the status
        and the envelope (parsing megabytes here would stall this process's other clients)."""
        start = time.perf_counter()
        try:
            if self.conn is None:
                self.conn = await asyncio.open_connection(HOST, self.port)
            reader, writer = self.conn
            writer.write(request_bytes(queries, topk))
            status, body = await asyncio.wait_for(read_response(reader), self.timeout_s)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as exc:
            tally.errors.append(f"{type(exc).__name__}: {exc}")
            await self.close()
            return
        elapsed = time.perf_counter() - start
        if status != 200:
            tally.errors.append(f"HTTP {status}: {body[:200]!r}")
            return
        if not parse:
            if not (body.startswith(b'{"result":[') and body.endswith(b"]}")):
                tally.errors.append(f"not a result envelope: {body[:100]!r}")
                return
        elif len(results := json.loads(body)["result"]) != len(queries):
            tally.errors.append(f"{len(results)} result lists for {len(queries)} queries")
            return
        tally.latencies.append(elapsed)
        tally.queries += len(queries)

    async def close(self) -> None:
        if self.conn is not None:
            self.conn[1].close()
            self.conn = None


# -- the phases ------------------------------------------------------------------------------------


async def steady_load(
    port: int, queries: list[str], clients: int, requests: int, max_seconds: float, seed: int
) -> tuple[Tally, float, Tally]:
    """``clients`` closed-loop clients; returns the tally, the wall seconds of the phase, and the
    tally of the warm-up requests.

    Each client first opens its connection and sends one warm-up request; timing starts once all
    have (the burst of connection setups is reported apart, as the warm-up tally).
    """
    tally, warm = Tally(), Tally()
    ready = asyncio.Barrier(clients + 1)
    deadline = time.perf_counter() + max_seconds

    async def one(c: int) -> None:
        rng = np.random.default_rng(seed * 1000 + c)
        client = Client(port, timeout_s=max_seconds)

        def pick() -> list[str]:
            return [queries[int(i)] for i in rng.integers(0, len(queries), int(rng.integers(1, 5)))]

        await client.ask(pick(), 3, warm)
        await ready.wait()
        for _ in range(requests):
            if time.perf_counter() > deadline:
                break
            await client.ask(pick(), 3, tally)
        await client.close()

    tasks = [asyncio.create_task(one(c)) for c in range(clients)]
    await ready.wait()
    start = time.perf_counter()
    await asyncio.gather(*tasks)
    return tally, time.perf_counter() - start, warm


async def small_beside_maximal(
    port: int, queries: list[str], limits: dict[str, int], max_seconds: float
) -> tuple[Tally, float, int, int]:
    """One request at the limits while one client sends one-query requests.

    Returns the small requests' tally, the big request's seconds, its hits, and how many small
    requests were answered before it.
    """
    topk = min(limits["max_topk"], max(1, limits["max_hits"] // limits["max_queries"]))
    n_big = min(limits["max_queries"], limits["max_hits"] // topk)
    big_queries = [queries[i % len(queries)] for i in range(n_big)]
    big, small = Tally(), Tally()
    done = asyncio.Event()
    before: list[int] = []

    async def send_big() -> None:
        client = Client(port, timeout_s=max_seconds)
        await client.ask(big_queries, topk, big, parse=False)
        before.append(len(small.latencies))
        done.set()
        await client.close()

    async def send_small() -> None:
        client = Client(port, timeout_s=max_seconds)
        i = 0
        while not done.is_set() and i < 10_000:
            await client.ask([queries[i % len(queries)]], 3, small)
            i += 1
        await client.close()

    await asyncio.wait_for(asyncio.gather(send_big(), send_small()), max_seconds)
    if big.errors:
        small.errors.append(f"maximal request failed: {big.errors[0]}")
    big_s = big.latencies[0] if big.latencies else float("nan")
    return small, big_s, n_big * topk, before[0] if before else 0


def _row(phase: str, clients: int, tally: Tally, seconds: float | None = None) -> dict[str, Any]:
    lat = np.asarray(tally.latencies) * 1000
    p50 = float(np.percentile(lat, 50)) if len(lat) else float("nan")
    p99 = float(np.percentile(lat, 99)) if len(lat) else float("nan")
    row: dict[str, Any] = {
        "phase": phase,
        "clients": clients,
        "requests": len(tally.latencies) + len(tally.errors),
        "errors": len(tally.errors),
    }
    if seconds is not None:
        row["req_per_s"] = len(tally.latencies) / seconds
        row["queries_per_s"] = tally.queries / seconds
    row.update(p50_ms=p50, p99_ms=p99, max_ms=float(lat.max()) if len(lat) else float("nan"))
    row["p99_over_p50"] = p99 / p50 if p50 > 0 else float("nan")
    return row


def run(args: argparse.Namespace) -> BenchResult:
    import httpx

    from searchr1.retrieval.corpus import read_corpus, write_corpus
    from searchr1.retrieval.index import build_index

    quick, seed = bool(args.quick), int(args.seed)
    requests = min(args.requests, 15) if quick else args.requests
    with tempfile.TemporaryDirectory(prefix="searchr1-bench-") as tmp:
        work = Path(tmp)
        corpus = Path(args.corpus) if args.corpus else sample_corpus()
        corpus_label = corpus.name if corpus else "generated (5,000 passages)"
        if corpus is None:
            corpus = write_corpus(make_corpus(5_000, seed), work / "corpus.jsonl")
        docs = list(read_corpus(corpus))
        queries = make_queries(docs, 2_000, seed)
        build_index(corpus, work / "bm25", show_progress=False)
        server = start_server(work / "bm25", port := free_port(), list(args.server_option))
        try:
            limits = httpx.get(f"http://{HOST}:{port}/health", timeout=10).json()["limits"]
            alone, alone_s, _ = asyncio.run(
                steady_load(port, queries, 1, 4 * requests, args.max_seconds, seed)
            )
            load, load_s, warm = asyncio.run(
                steady_load(port, queries, args.clients, requests, args.max_seconds, seed + 1)
            )
            small, big_s, big_hits, before = asyncio.run(
                small_beside_maximal(port, queries, limits, args.max_seconds)
            )
        finally:
            server.terminate()
            server.wait(timeout=30)
    rows = [
        _row("alone", 1, alone, alone_s),
        _row("connect + first request", args.clients, warm),
        _row("load", args.clients, load, load_s),
    ]
    beside = _row("small beside maximal", 2, small)
    beside.update(maximal_ms=big_s * 1000, maximal_hits=big_hits, small_done_before_maximal=before)
    rows.append(beside)
    main = rows[2]
    errors = [*warm.errors[:5], *load.errors[:5], *small.errors[:5]]
    return BenchResult(
        name="server_load",
        params={
            "quick": quick,
            "seed": seed,
            "clients": args.clients,
            "requests_per_client": requests,
            "max_seconds": args.max_seconds,
            "corpus": corpus_label,
            "passages": len(docs),
            "topk": 3,
            "queries_per_request": "1-4",
            "server_options": list(args.server_option),
            "limits": limits,
        },
        rows=rows,
        headline=main["p99_over_p50"],
        headline_label=f"p99 / p50 latency with {args.clients} concurrent clients (target <= 3, 0 errors)",
        extra={
            "requests": main["requests"],
            "errors": main["errors"],
            "throughput_req_per_s": main["req_per_s"],
            "throughput_queries_per_s": main["queries_per_s"],
            "p50_ms": main["p50_ms"],
            "p99_ms": main["p99_ms"],
            "error_samples": errors,
        },
    )
