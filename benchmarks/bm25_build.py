"""BM25 index build and its parts, this revision against an earlier one, on generated wiki-like passages.

One run measures every revision on the same corpus, each step in its own process with the revision's
code first on ``PYTHONPATH``, the steps interleaved (builds first, then searches, alternating), so
that the load of other work on the machine falls on all of them alike:

    nice -n 19 python benchmarks/bm25_build.py --n 100000 --rev before=/tmp/old --rev after=. \\
        --workers after=1,2 --out benchmarks/results/bm25_build.json

Every build reads chunks of 20,000 lines (this revision's default) at ``--memory-mb`` 512. Per build: wall
seconds, CPU seconds (the build's process and its workers), peak RSS (the build's
process and its workers together, sampled every 0.2 s), and the index folder's bytes by part:
postings (``bm25/`` posting blocks and their tables), store (the passage store) and other (the rest:
vocabulary, norms, id keys, settings, manifest). Per search (each index by the code that built it):
1,024 of the bench's NQ-style queries at batch 128, top 3, on one thread, in process: CPU ms a query
and queries/s (after one warm batch), and a hash of every top-3 list. Every figure has the load
average before and after it: CPU seconds and ratios within one run are what count on shared cores.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _parts(index: Path) -> dict[str, int]:
    """Bytes of an index folder by part."""
    out = {"postings": 0, "store": 0, "other": 0}
    for p in index.rglob("*"):
        if not p.is_file():
            continue
        rel = p.relative_to(index).as_posix()
        if rel.startswith("docs."):
            out["store"] += p.stat().st_size
        elif rel.startswith("bm25/") and (p.name.startswith(("postings.", "blocks.", "superblocks.", "scores.", "data.csc",
                                                              "indices.csc", "indptr.csc"))):  # fmt: skip
            out["postings"] += p.stat().st_size
        else:
            out["other"] += p.stat().st_size
    out["total"] = sum(out.values())
    return out


def _tree_rss(pid: int) -> int:
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def _child_build(args: argparse.Namespace) -> dict:
    import resource

    from searchr1.retrieval.index import build_index

    extra = {} if args.child_workers is None else {"workers": args.child_workers}
    wall, cpu = time.perf_counter(), time.process_time()
    build_index(args.corpus, args.index, chunk_passages=20_000, show_progress=False, resume=False, **extra)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"build_wall_s": time.perf_counter() - wall,
            "build_cpu_s": time.process_time() - cpu + children.ru_utime + children.ru_stime}  # fmt: skip


def _child_search(args: argparse.Namespace) -> dict:
    from searchr1.retrieval.index import load_index

    queries = json.loads(Path(args.queries).read_text())
    r = load_index(args.index)
    r.search(queries[:128], 3)  # warm: compiled code, page cache
    ids: list[list[str]] = []
    wall, cpu = time.perf_counter(), time.process_time()
    for lo in range(0, len(queries), 128):
        ids += [[h.id for h in hits] for hits in r.search(queries[lo : lo + 128], 3)]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    r.close()
    return {"cpu_ms_per_query": cpu / len(queries) * 1000, "qps": len(queries) / wall,
            "top3_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]}  # fmt: skip


def _run(step: str, code: Path, n: int, corpus: Path, index: Path, workers: int | None,
         queries: Path | None = None) -> dict:
    """One step in its own process with ``code`` first on the path; its figures with the load average
    before and after and, for a build, the peak RSS of its process tree."""
    cmd = [sys.executable, __file__, "--child", step, "--n", str(n), "--corpus", str(corpus), "--index", str(index)]
    if workers is not None:
        cmd += ["--child-workers", str(workers)]
    if queries is not None:
        cmd += ["--queries", str(queries)]
    env = {**os.environ, "PYTHONPATH": str(code)}
    load_before = os.getloadavg()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    peak = {"rss": 0}

    def sample() -> None:
        while proc.poll() is None:
            peak["rss"] = max(peak["rss"], _tree_rss(proc.pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{step} with {code} failed ({proc.returncode})")
    row = json.loads(out.strip().splitlines()[-1])
    if step == "build":
        row["build_peak_rss_mb"] = peak["rss"] / 2**20
        row["parts_bytes"] = _parts(index)
    row["load_before"], row["load_after"] = load_before, os.getloadavg()
    return row


def generated_corpus(workdir: str | Path, n: int) -> tuple[Path, Path]:
    """The work folder (made if missing) and its corpus of ``n`` generated wiki-like passages,
    ``corpus_<n>.jsonl``, written once; ``benchmarks/bm25_profile.py`` uses it too."""
    from searchr1.bench.retrieval_scale import WikiLikeCorpus, write_corpus_file

    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / f"corpus_{n}.jsonl"
    if not corpus.is_file():
        write_corpus_file(WikiLikeCorpus(seed=0), n, corpus)
    return work, corpus


def nq_queries(n: int, count: int) -> list[str]:
    """``count`` of the bench's NQ-style queries (seed 1) about the first passages (at most 200,000) of
    the generated corpus of ``n``."""
    from searchr1.bench.retrieval_scale import WikiLikeCorpus

    gen = WikiLikeCorpus(seed=0)
    return gen.queries(list(gen.passages(0, min(n, 200_000))), count, seed=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="passages (at most 100,000 on a shared machine)")
    ap.add_argument("--rev", action="append", default=[], help="LABEL=PATH: a revision's code (repeatable)")
    ap.add_argument("--workers", action="append", default=[],
                    help="LABEL=1,2: build that revision once per worker count (default: its default)")
    ap.add_argument("--workdir", default="/tmp/bm25_build_bench")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bm25_build.json"))
    ap.add_argument("--child", choices=["build", "search"], help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--index", help=argparse.SUPPRESS)
    ap.add_argument("--child-workers", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--queries", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child_build(args) if args.child == "build" else _child_search(args)))
        return
    work, corpus = generated_corpus(args.workdir, args.n)
    queries = work / f"queries_{args.n}.json"  # the bench's NQ-style queries, made once
    if not queries.is_file():
        queries.write_text(json.dumps(nq_queries(args.n, 1024)))
    revs = dict(r.split("=", 1) for r in args.rev) or {"this": str(ROOT)}
    counts = {k: [int(x) for x in v.split(",")] for k, v in (w.split("=", 1) for w in args.workers)}
    builds = [(label, Path(path).resolve(), w) for label, path in revs.items() for w in counts.get(label, [None])]
    rows = []
    for label, code, w in builds:
        index = work / f"{label}_w{w}_{args.n}"
        row = {"label": label, "workers": w, "n": args.n, "code": str(code)}
        row.update(_run("build", code, args.n, corpus, index, w))
        rows.append(row)
        print(json.dumps(row), flush=True)
    searched = {}  # one index per revision: its first build
    for label, code, w in builds:
        searched.setdefault(label, (code, work / f"{label}_w{w}_{args.n}"))
    for rep in range(2):
        for label, (code, index) in searched.items():
            row = {"label": label, "search_pass": rep, **_run("search", code, args.n, corpus, index, None, queries)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {
        "what": "benchmarks/bm25_build.py: BM25 build and search, revisions interleaved in one run",
        "machine": f"{os.cpu_count()} cores shared with an RL training run; every step at nice 19: wall seconds "
                   "and queries/s depend on that load (see each row's load averages); CPU seconds and the "
                   "ratios within this run are what count",
        "n": args.n,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    _table(rows)


def _table(rows: list[dict]) -> None:
    print(f"\n{'build':<16}{'wall s':>9}{'CPU s':>9}{'peak RSS MB':>13}{'postings MB':>13}{'store MB':>10}"
          f"{'other MB':>10}{'total MB':>10}   load before -> after")  # fmt: skip
    for r in rows:
        if "build_wall_s" in r:
            p = r["parts_bytes"]
            print(f"{r['label'] + ' w' + str(r['workers']):<16}{r['build_wall_s']:>9.1f}{r['build_cpu_s']:>9.1f}"
                  f"{r['build_peak_rss_mb']:>13.0f}{p['postings'] / 1e6:>13.1f}{p['store'] / 1e6:>10.1f}"
                  f"{p['other'] / 1e6:>10.1f}{p['total'] / 1e6:>10.1f}   {r['load_before'][0]:.1f} -> "
                  f"{r['load_after'][0]:.1f}")  # fmt: skip
    print(f"\n{'search':<16}{'CPU ms/query':>14}{'queries/s':>11}  {'top-3 sha256':<18}load before -> after")
    for r in rows:
        if "qps" in r:
            print(f"{r['label'] + ' #' + str(r['search_pass']):<16}{r['cpu_ms_per_query']:>14.3f}{r['qps']:>11.0f}  "
                  f"{r['top3_sha256']:<18}{r['load_before'][0]:.1f} -> {r['load_after'][0]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
