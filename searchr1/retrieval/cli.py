"""``searchr1 index build``, ``searchr1 search``, ``searchr1 serve``."""

from __future__ import annotations

import argparse
import json
import os
import sys

from searchr1.cli_common import (
    add_config_flags,
    add_search_flags,
    command_config,
    help_lists_names,
    open_retriever,
    search_overrides,
)
from searchr1.errors import UserFacingError
from searchr1.retrieval.base import SearchError
from searchr1.retrieval.config import DENSE_INDEX_TYPES

EXAMPLES_INDEX = """examples:
  searchr1 data synth --out data/world
  searchr1 index build --retriever bm25 --corpus data/world/corpus.jsonl --out indexes/world
  searchr1 index build --retriever dense --corpus data/world/corpus.jsonl --out indexes/world-dense --index-type hnsw
  searchr1 index build --retriever bm25 --corpus shared/data/flashrag-sample/wiki18_sample_corpus.jsonl \\
      --out indexes/wiki18-chunks --chunk-size 100 --overlap 20
  searchr1 index build --retriever dense --corpus data/world/corpus.jsonl --out indexes/world-ivfpq \\
      --index-type ivfpq --pq-m 48          (IVF-PQ: 48 bytes per passage, trained on a sample)
  searchr1 index build --retriever bm25 --corpus data/world/corpus.jsonl --out indexes/world --resume

Builds stream: the corpus is read once in chunks (--chunk-passages), each chunk checkpointed, so an
interrupted build continues with --resume; the manifest is written last, so a half-built folder is
never served.
"""

EXAMPLES_SEARCH = """examples:
  searchr1 search --index indexes/world "who founded the Quillon Press" "where was Clara Thoped born"
  searchr1 search --corpus data/world/corpus.jsonl --topk 5 "query"      (BM25 in memory, no index)
  searchr1 search --search-url http://127.0.0.1:8000 --json "query"       (ask a running server)
  searchr1 search --backend hybrid --set retrieval.hybrid_indexes=[indexes/world,indexes/world-dense] "q"
"""

EXAMPLES_SERVE = """examples:
  searchr1 serve --index indexes/world --port 8000
  SEARCHR1_API_KEY=secret searchr1 serve --index indexes/world --host 0.0.0.0
  searchr1 serve --corpus shared/data/flashrag-sample/wiki18_sample_corpus.jsonl --body-timeout 10 --no-access-log
  curl -s localhost:8000/retrieve -H 'content-type: application/json' \\
       -d '{"queries": ["who founded Acme"], "topk": 3, "return_scores": true}'
"""


def register(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p_index = sub.add_parser("index", help="build search indexes", description="Build search indexes.")
    index_sub = p_index.add_subparsers(dest="index_command", metavar="SUBCOMMAND")
    b = index_sub.add_parser(
        "build",
        help="index a jsonl corpus (bm25 or dense) into a folder with a manifest",
        description="Read a jsonl corpus ({id, contents} or {id, title, text}) and write an index folder "
        "(manifest.json with retriever, model, corpus checksum, document count, creation time).",
        epilog=EXAMPLES_INDEX,
        formatter_class=fmt,
    )
    b.add_argument("--retriever", choices=["bm25", "dense"], default="bm25", help="index kind (default bm25)")
    b.add_argument("--corpus", required=True, help="corpus jsonl file")
    b.add_argument("--out", required=True, help="index folder to write")
    b.add_argument("--chunk-size", type=int, default=None, help="split documents into passages of N words")
    b.add_argument(
        "--overlap", type=int, default=0, help="words shared by consecutive passages (with --chunk-size)"
    )
    b.add_argument(
        "--skip-bad-lines", action="store_true", help="skip and count malformed lines instead of failing"
    )
    g = b.add_mutually_exclusive_group()
    g.add_argument(
        "--resume",
        dest="resume",
        action="store_const",
        const=True,
        default=None,
        help="continue the unfinished build in --out (refused if the corpus or options changed)",
    )
    g.add_argument(
        "--restart",
        dest="resume",
        action="store_const",
        const=False,
        help="discard an unfinished build in --out and start again",
    )
    b.add_argument(
        "--chunk-passages", type=int, default=20_000,
        help="lines (passages) read, indexed and checkpointed at a time, by one worker (default 20000)",
    )  # fmt: skip
    b.add_argument(
        "--workers", type=int, default=None,
        help="processes that parse, analyse and compress the chunks (default: the cores this process may "
        "use; fewer when --memory-mb does not hold a chunk each); the index is the same whatever the number",
    )  # fmt: skip
    g = b.add_argument_group("bm25 (defaults: preset pyserini, Search-R1's retriever)")
    g.add_argument(
        "--preset", choices=["pyserini", "bm25s"], default="pyserini",
        help="settings to start from: pyserini (k1 0.9, b 0.4, Lucene's English analyzer and lengths, as "
        "Search-R1's LuceneSearcher) or bm25s (earlier versions: k1 1.5, b 0.75, regex + Snowball)",
    )  # fmt: skip
    g.add_argument("--k1", type=float, default=None, help="term-frequency saturation (pyserini 0.9)")
    g.add_argument("--b", type=float, default=None, help="length normalisation (pyserini 0.4)")
    g.add_argument("--method", default=None, help="lucene | robertson | atire | bm25l | bm25+ (default lucene)")
    g.add_argument("--analyzer", default=None, help="lucene-english | regex (pyserini: lucene-english)")
    g.add_argument("--stemmer", default=None, help="porter, a PyStemmer language, or 'none' (pyserini: porter)")
    g.add_argument("--stopwords", default=None, help="lucene, a bm25s list (en, de, ...), or 'none'")
    g.add_argument("--doc-length", default=None, choices=["lucene", "exact"],
                   help="document lengths as Lucene stores them (one byte) or exact (pyserini: lucene)")  # fmt: skip
    g.add_argument(
        "--memory-mb", type=int, default=512,
        help="postings merged at a time in the final pass, in MB (default 512): with one chunk "
        "(--chunk-passages) of the first pass, what bounds the build's memory",
    )  # fmt: skip
    g = b.add_argument_group("dense")
    g.add_argument(
        "--model",
        default=None,
        help="sentence-transformers folder or hub id (default: bundled all-MiniLM-L6-v2)",
    )
    g.add_argument(
        "--index-type",
        choices=list(DENSE_INDEX_TYPES),
        default="flat",
        help="FAISS index (default flat); ivfpq / opq-ivfpq store pq_m bytes per passage",
    )
    g.add_argument("--nlist", type=int, default=None, help="IVF cells (default 4 sqrt(passages))")
    g.add_argument("--pq-m", type=int, default=None, help="PQ bytes per passage (default dim / 8)")
    g.add_argument("--hnsw-m", type=int, default=32, help="HNSW links per node (default 32)")
    g.add_argument("--ef-construction", type=int, default=80, help="HNSW build candidates (default 80)")
    g.add_argument(
        "--train-size", type=int, default=None, help="vectors sampled to train IVF / PQ (default 40 per centroid)"
    )  # fmt: skip
    g.add_argument("--batch-size", type=int, default=64, help="encoder batch size (default 64)")
    g.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    b.set_defaults(func=_index_build)
    p_index.set_defaults(func=lambda args: (p_index.print_help(), 2)[1])

    s = sub.add_parser(
        "search",
        help="search an index, a corpus, a server or a web API and print ranked hits",
        description="Print the ranked hits of each query.",
        epilog=EXAMPLES_SEARCH,
        formatter_class=fmt,
        add_help=False,
    )
    help_lists_names(s, ["retrieval.backend"])
    s.add_argument("queries", nargs="+", help="one or more queries")
    _add_backend_args(s)
    s.add_argument("--json", action="store_true", help="print JSON (one list of hits per query)")
    s.set_defaults(func=_search)

    v = sub.add_parser(
        "serve",
        help="serve a retriever over HTTP (Search-R1 /retrieve API)",
        description="FastAPI + uvicorn server: POST /retrieve, GET /health, OpenAPI docs at /docs. "
        "Binds 127.0.0.1 unless --host says otherwise.",
        epilog=EXAMPLES_SERVE,
        formatter_class=fmt,
        add_help=False,
    )
    help_lists_names(v, ["retrieval.backend"])
    _add_backend_args(v)
    v.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    v.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    v.add_argument(
        "--threads",
        type=int,
        default=None,
        help="BM25: threads each batch of queries is searched on (default: the cores this process may use)",
    )
    v.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' (default: env SEARCHR1_API_KEY)"
    )
    g = v.add_argument_group("limits (each answered with a 4xx that names the problem)")
    g.add_argument(
        "--max-queries", type=int, default=1024, help="queries per request (default 1024; more: 413)"
    )
    g.add_argument("--max-topk", type=int, default=100, help="largest topk (default 100; more: 422)")
    g.add_argument(
        "--max-query-chars", type=int, default=4096, help="characters per query (default 4096; more: 413)"
    )
    g.add_argument(
        "--max-hits",
        type=int,
        default=20_480,
        help="queries x topk per request (default 20480; more: 413): bounds one request's work",
    )
    g.add_argument(
        "--max-body-bytes",
        type=int,
        default=8 << 20,
        help="request body bytes, counted while reading whatever the framing (default 8 MiB; more: 413)",
    )
    g.add_argument(
        "--body-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="seconds for a request body to arrive in full (default 30; longer: 408, connection closed)",
    )
    g.add_argument(
        "--max-batch-queries",
        type=int,
        default=128,
        help="queries per backend call: small requests are merged up to it, large ones split "
        "(default 128; lower = fairer, higher = fewer calls)",
    )
    v.add_argument(
        "--no-access-log",
        dest="access_log",
        action="store_false",
        help="no line per request on stderr (backend failures are still logged)",
    )
    v.set_defaults(func=_serve)


def _add_backend_args(p: argparse.ArgumentParser) -> None:
    add_search_flags(p)
    p.add_argument("--model", dest="encoder", help=argparse.SUPPRESS)  # the former name of --encoder
    add_config_flags(p, "retrieval")


def _retriever_from_args(args: argparse.Namespace):
    cfg = command_config(args, search_overrides(args)).retrieval
    return open_retriever(cfg), cfg


def _index_build(args: argparse.Namespace) -> int:
    from searchr1.retrieval.index import build_index

    try:
        m = build_index(
            args.corpus,
            args.out,
            retriever=args.retriever,
            chunk_size=args.chunk_size,
            overlap=args.overlap,
            skip_bad_lines=args.skip_bad_lines,
            bm25={
                "preset": args.preset,
                "k1": args.k1,
                "b": args.b,
                "method": args.method,
                "analyzer": args.analyzer,
                "stemmer": args.stemmer,
                "stopwords": args.stopwords,
                "doc_length": args.doc_length,
            },
            model=args.model,
            index_type=args.index_type,
            batch_size=args.batch_size,
            device=args.device,
            resume=args.resume,
            chunk_passages=args.chunk_passages,
            memory_mb=args.memory_mb,
            workers=args.workers if args.workers is not None else _usable_cores(),
            dense={
                "nlist": args.nlist,
                "pq_m": args.pq_m,
                "hnsw_m": args.hnsw_m,
                "ef_construction": args.ef_construction,
                "train_size": args.train_size,
            },
        )
    except ValueError as exc:
        raise UserFacingError(str(exc)) from None
    except KeyboardInterrupt:
        raise UserFacingError(
            f"interrupted; the chunks finished so far are checkpointed in {args.out}: "
            "rerun the same command with --resume to continue"
        ) from None
    skipped = f", skipped {m.skipped_lines} malformed line(s)" if m.skipped_lines else ""
    print(
        f"indexed {m.num_documents} passages ({m.retriever}{', ' + m.model if m.model else ''}) into {args.out}{skipped}"
    )
    return 0


def _search(args: argparse.Namespace) -> int:
    retriever, cfg = _retriever_from_args(args)
    try:
        results = retriever.search(args.queries, cfg.topk)
    except SearchError as exc:
        raise UserFacingError(str(exc)) from None
    finally:
        retriever.close()
    if args.json:
        json.dump([[h.to_dict() for h in hits] for hits in results], sys.stdout, ensure_ascii=False, indent=2)
        print()
        return 0
    for query, hits in zip(args.queries, results, strict=True):
        print(f"query: {query}")
        if not hits:
            print("  (no hits)")
        for rank, h in enumerate(hits, 1):
            text = h.text if len(h.text) <= 200 else h.text[:197] + "..."
            print(f"  {rank}. [{h.score:.3f}] {h.title} (id {h.id})\n     {text}")
    return 0


def _usable_cores() -> int:
    """The cores this process may run on (its affinity where the platform says, else all)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _serve(args: argparse.Namespace) -> int:
    from searchr1.retrieval.server import ServerLimits, run_server

    limits = ServerLimits(
        max_queries=args.max_queries,
        max_topk=args.max_topk,
        max_query_chars=args.max_query_chars,
        max_hits=args.max_hits,
        max_body_bytes=args.max_body_bytes,
        body_timeout_s=args.body_timeout,
        max_batch_queries=args.max_batch_queries,
    )
    try:
        limits.validate()
    except ValueError as exc:
        raise UserFacingError(str(exc)) from None
    threads = args.threads if args.threads is not None else _usable_cores()
    if threads < 1:
        raise UserFacingError(f"--threads must be >= 1, got {threads}")
    retriever, cfg = _retriever_from_args(args)
    if hasattr(retriever, "set_threads"):
        retriever.set_threads(threads)
    docs = getattr(retriever, "docs", None)
    print(f"serving {retriever.name} on http://{args.host}:{args.port} (docs at /docs)", flush=True)
    run_server(
        retriever,
        args.host,
        args.port,
        args.api_key,
        limits,
        cfg.topk,
        len(docs) if docs is not None else None,
        access_log=args.access_log,
    )
    return 0
