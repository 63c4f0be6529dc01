"""Our slowest BM25 queries against Lucene's time on the same queries (issue 56's tail target).

At one corpus size of ``searchr1 bench retrieval-scale`` (its ``--reuse`` folder holds our index ``bm25_N``,
Lucene's ``lucene_N`` and the peer queries ``peer_queries_N.jsonl``), one thread each:

1. ours: every query searched alone in this process (top 3), the fastest of ``--repeats`` rounds, after one
   untimed pass over all of them (the kernel compiled, the index's pages mapped in);
2. the ``--slowest`` (default 1,024) slowest queries of ours;
3. Lucene on those queries: pyserini's ``LuceneSearcher.search`` in pyserini's Python
   (``SEARCHR1_PYSERINI_PYTHON``; ``searchr1/bench/pyserini_peer.py`` with ``per_query``), timed the same
   way after one untimed pass over every query (the JIT's warm-up);
4. per query the ratio of our time to Lucene's, and whether both return the same top 3.

The target: our slowest query no slower than 2x Lucene's time on the same query. Prints a table and writes
``benchmarks/results/bm25_slowest.json`` (each size its own entry):

    SEARCHR1_PYSERINI_PYTHON=/work/venv-pyserini/bin/python \\
        python benchmarks/bm25_slowest.py --reuse /work/scratch-56 --n 4000000

With ``--slowest`` equal to the number of queries, every query is timed on both sides; once the output file
holds two such sizes, its ``scaling`` entry gives how each one's mean time a query grows with the corpus:
``t ~ N^e``, ``e = log(t2 / t1) / log(N2 / N1)`` (one thread, one query a call: the kernel and the per-query
work of each library, without the fixed costs of a batch that flatten a throughput exponent):

    python benchmarks/bm25_slowest.py --reuse /work/scratch-56 --n 1000000 --slowest 4096 \\
        --out benchmarks/results/bm25_per_query_all.json   # then the same with --n 4000000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from searchr1.bench.retrieval_scale import PEER_SCRIPT, pyserini_python
from searchr1.retrieval.index import load_index

RESULTS = Path(__file__).parent / "results" / "bm25_slowest.json"


def our_times(index: Path, queries: list[str], repeats: int) -> tuple[list[float], list[list[str]]]:
    """Seconds per query (the fastest of ``repeats`` rounds, one thread) and each query's top-3 ids."""
    r = load_index(index, threads=1)
    try:
        for q in queries:  # untimed pass
            r.search([q], 3)
        best = [float("inf")] * len(queries)
        top: list[list[str]] = [[] for _ in queries]
        for _ in range(repeats):
            for i, q in enumerate(queries):
                t = time.perf_counter()
                hits = r.search([q], 3)[0]
                best[i] = min(best[i], time.perf_counter() - t)
                top[i] = [h.id for h in hits]
        return best, top
    finally:
        r.close()


def lucene_times(exe: str, reuse: Path, n: int, timed: list[int], repeats: int) -> dict[str, Any]:
    """Lucene's seconds and top-3 ids on the queries ``timed`` (indices into the peer queries file)."""
    task = {"corpus": str(reuse / f"corpus_{n}.jsonl"), "index": str(reuse / f"lucene_{n}"),
            "queries": str(reuse / f"peer_queries_{n}.jsonl"), "threads": 1, "batch": 128, "k": 3,
            "per_query": timed, "repeats": repeats}  # fmt: skip
    tfile = reuse / f"slowest_task_{n}.json"
    tfile.write_text(json.dumps(task))
    proc = subprocess.run([exe, str(PEER_SCRIPT), str(tfile)], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"pyserini per-query run failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def scaling(saved: dict[str, Any]) -> dict[str, Any] | None:
    """Mean time a query against corpus size over the two largest sizes of ``saved`` that timed every query
    on both sides: ``t ~ N^e`` for ours and for Lucene (None with fewer than two such sizes)."""
    full = sorted((int(n), e) for n, e in saved.items() if n.isdigit() and e["slowest"] == e["queries"])
    if len(full) < 2:
        return None
    (n1, a), (n2, b) = full[-2], full[-1]
    grow = math.log(n2 / n1)
    return {"sizes": [n1, n2],
            "ours_mean_ms": [a["ours_mean_ms_all"], b["ours_mean_ms_all"]],
            "lucene_mean_ms": [a["lucene_mean_ms_slowest"], b["lucene_mean_ms_slowest"]],
            "ours_time_exponent": math.log(b["ours_mean_ms_all"] / a["ours_mean_ms_all"]) / grow,
            "lucene_time_exponent": math.log(b["lucene_mean_ms_slowest"] / a["lucene_mean_ms_slowest"]) / grow}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reuse", required=True, help="the --reuse folder of bench retrieval-scale")
    parser.add_argument("--n", type=int, required=True, help="corpus size (passages)")
    parser.add_argument("--slowest", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    reuse = Path(args.reuse)
    index, qfile = reuse / f"bm25_{args.n}", reuse / f"peer_queries_{args.n}.jsonl"
    if not (index / "manifest.json").is_file() or not qfile.is_file() or not (reuse / f"lucene_{args.n}").is_dir():
        parser.error(f"{reuse} lacks bm25_{args.n}, lucene_{args.n} or peer_queries_{args.n}.jsonl: "
                     f"run searchr1 bench retrieval-scale --sizes {args.n} --parts build,serve,peer first")  # fmt: skip
    exe, why = pyserini_python()
    if exe is None:
        parser.error(why)
    queries = [json.loads(line)["query"] for line in qfile.read_text().splitlines() if line.strip()]
    load_before = os.getloadavg()
    ours, our_top = our_times(index, queries, args.repeats)
    timed = sorted(range(len(queries)), key=lambda i: -ours[i])[: args.slowest]
    lucene = lucene_times(exe, reuse, args.n, timed, args.repeats)
    load_after = os.getloadavg()
    rows = [
        {"query": queries[i], "ours_ms": ours[i] * 1e3, "lucene_ms": lucene["per_query_s"][j] * 1e3,
         "ratio": ours[i] / lucene["per_query_s"][j], "same_top3": our_top[i] == lucene["per_query_top_ids"][j]}
        for j, i in enumerate(timed)
    ]  # fmt: skip
    ratios = sorted(r["ratio"] for r in rows)
    worst = rows[0]  # our slowest query
    result = {
        "n": args.n,
        "queries": len(queries),
        "slowest": len(rows),
        "repeats": args.repeats,
        "pyserini": lucene.get("pyserini"),
        "our_slowest": worst,
        "target_met": worst["ratio"] <= 2.0,
        "ratio_median": statistics.median(ratios),
        "ratio_p90": ratios[int(0.9 * (len(ratios) - 1))],
        "ratio_max": ratios[-1],
        "over_2x": sum(r > 2.0 for r in ratios),
        "ours_mean_ms_all": 1e3 * sum(ours) / len(ours),
        "ours_mean_ms_slowest": statistics.mean(r["ours_ms"] for r in rows),
        "lucene_mean_ms_slowest": statistics.mean(r["lucene_ms"] for r in rows),
        "same_top3": sum(r["same_top3"] for r in rows),
        "load_before": load_before,
        "load_after": load_after,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "rows": rows[:64],  # the 64 slowest of ours, with Lucene's time on each
    }
    print(f"BM25 at {args.n:,} passages, one thread, the {len(rows)} slowest of {len(queries)} queries for us")
    print(f"  our slowest: {worst['ours_ms']:.2f} ms, Lucene on it {worst['lucene_ms']:.2f} ms "
          f"(ratio {worst['ratio']:.2f}; target <= 2: {'met' if result['target_met'] else 'not met'})")  # fmt: skip
    print(f"  ours / Lucene over them: median {result['ratio_median']:.2f}, p90 {result['ratio_p90']:.2f}, "
          f"max {result['ratio_max']:.2f}, over 2x: {result['over_2x']}")  # fmt: skip
    print(f"  mean ms over them: ours {result['ours_mean_ms_slowest']:.2f}, Lucene {result['lucene_mean_ms_slowest']:.2f};"
          f" same top 3 on {result['same_top3']} / {len(rows)}; load {load_before[0]:.2f} -> {load_after[0]:.2f}")  # fmt: skip
    out = Path(args.out)
    saved = json.loads(out.read_text()) if out.is_file() else {}
    saved[str(args.n)] = result
    if (grown := scaling(saved)) is not None:
        saved["scaling"] = grown
        print(f"  mean time a query from {grown['sizes'][0]:,} to {grown['sizes'][1]:,} passages: ours ~N^"
              f"{grown['ours_time_exponent']:.2f}, Lucene ~N^{grown['lucene_time_exponent']:.2f}")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(saved, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
