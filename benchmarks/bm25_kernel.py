"""BM25 kernel and index, this revision against an earlier one, on generated wiki-like passages.

Run once per code revision (the same corpus and queries, seeded), each in its own process, with the
revision first on PYTHONPATH; the rows are appended to one JSON file:

    PYTHONPATH=/tmp/old nice -n 19 python benchmarks/bm25_kernel.py --n 100000 --label old --out rows.json
    PYTHONPATH=.        nice -n 19 python benchmarks/bm25_kernel.py --n 100000 --label new --out rows.json

Per row: build wall and CPU seconds (``index build``'s code in this process), the ``bm25`` folder's and
the passage store's bytes, the decode speed of the longest posting lists (``decode_rate``: CPU
nanoseconds a posting, rows and term frequencies), and in-process search of the bench's NQ-style
queries at batch 128, top 3: CPU seconds a query (one thread: robust to other work on the machine)
and wall queries/s on 1 and N threads (meaningful only on quiet cores), with the load average before
and after. Only public APIs (and ``postings.column``, which every revision with blocks has) are used,
so an earlier revision runs it unchanged (threads where it has them). ``benchmarks/bm25_profile.py``
alternates two revisions in one run and adds the per-class query profile.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

from searchr1.bench.retrieval_scale import WikiLikeCorpus, write_corpus_file
from searchr1.retrieval.index import build_index, load_index


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def decode_rate(r, columns: int = 8, repeats: int = 5) -> dict:
    """CPU nanoseconds a posting to decode the ``columns`` longest posting lists of ``r`` whole
    (``postings.column``: every block of the list, rows and stored values), the fastest of
    ``repeats`` passes after one untimed list."""
    df = np.diff(np.asarray(r.postings.indptr))
    longest = np.argsort(-df, kind="stable")[:columns]
    r.postings.column(int(longest[0]))  # compiled code, page cache
    best = float("inf")
    for _ in range(repeats):
        t = time.thread_time()
        for c in longest:
            r.postings.column(int(c))
        best = min(best, time.thread_time() - t)
    postings = int(df[longest].sum())
    return {"decode_columns": len(longest), "decode_postings": postings, "longest_df": int(df[longest[0]]),
            "decode_ns_per_posting": best / postings * 1e9}  # fmt: skip


def _search(r, queries: list[str], batch: int = 128) -> tuple[float, float, list[list[str]]]:
    """(CPU seconds a query, wall queries/s, every query's hit ids) over ``queries`` in batches."""
    r.search(queries[:batch], 3)  # warm: compiled code, page cache
    ids: list[list[str]] = []
    wall, cpu = time.perf_counter(), time.process_time()
    for lo in range(0, len(queries), batch):
        ids += [[h.id for h in hits] for hits in r.search(queries[lo : lo + batch], 3)]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return cpu / len(queries), len(queries) / wall, ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, required=True, help="passages (at most 250,000 on a shared machine)")
    ap.add_argument("--label", required=True, help="the revision's name in the rows (old, new, ...)")
    ap.add_argument("--workdir", default="/tmp/bm25_kernel_bench")
    ap.add_argument("--out", required=True, help="JSON file the row is appended to")
    ap.add_argument("--queries", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    gen = WikiLikeCorpus(seed=args.seed)
    corpus = work / f"corpus_{args.n}.jsonl"
    if not corpus.is_file():
        write_corpus_file(gen, args.n, corpus)
    index = work / f"{args.label}_{args.n}"
    row: dict = {"label": args.label, "n": args.n, "load_before": os.getloadavg()}
    if not (index / "manifest.json").is_file():
        wall, cpu = time.perf_counter(), time.process_time()
        build_index(corpus, index, chunk_passages=50_000, show_progress=False, resume=False)
        row["build_wall_s"], row["build_cpu_s"] = time.perf_counter() - wall, time.process_time() - cpu
    row["bm25_bytes"], row["docs_bytes"] = _bytes(index / "bm25"), _bytes(index) - _bytes(index / "bm25")
    docs = list(gen.passages(0, min(args.n, 200_000)))
    queries = gen.queries(docs, args.queries, seed=args.seed + 1)
    del docs
    r = load_index(index)
    if hasattr(r, "postings"):
        row.update(decode_rate(r))
    row["cpu_ms_per_query_1t"], row["qps_1t"], ids = _search(r, queries)
    if hasattr(r, "set_threads"):
        r.set_threads(args.threads)
        row[f"cpu_ms_per_query_{args.threads}t"], row[f"qps_{args.threads}t"], threaded = _search(r, queries)
        row["threads_same_hits"] = threaded == ids
    for key in [k for k in row if k.startswith("cpu_ms")]:
        row[key] *= 1000
    row["load_after"] = os.getloadavg()
    row["top3_ids_sha256"] = hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]
    r.close()
    out = Path(args.out)
    rows = json.loads(out.read_text()) if out.is_file() else []
    out.write_text(json.dumps([*rows, row], indent=2) + "\n")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
