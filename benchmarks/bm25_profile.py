"""BM25 per query class and posting decode: revisions side by side in one process, query by query.

Every revision builds its own index of the same generated wiki-like passages (its own format; each
build in its own process with the revision's code first on ``PYTHONPATH``). The revisions are then
loaded into *one* process -- each revision's ``searchr1`` package copied under a name of its own
(``searchr1_<label>``, every ``searchr1`` in its source renamed) -- and measured alternately, query by
query, so that other work on the machine falls on all of them alike (on shared cores, two processes
run minutes apart differed by 20% on the same code; neighbouring calls do not):

    nice -n 5 python benchmarks/bm25_profile.py --n 250000 --rev old=/tmp/old --rev new=. \\
        --out benchmarks/results/bm25_profile.json

* **decode**: the ``--columns`` longest posting lists decoded whole (``decode_rate`` of
  ``benchmarks/bm25_kernel.py``: rows and term frequencies), revisions alternated, the fastest of
  ``--repeats`` rounds: CPU nanoseconds a posting;
* **queries by class**: each query searched alone (``search([q], 3)``, one thread, in process) by each
  revision in turn, ``--repeats`` rounds after an untimed one, its CPU time the least of them; per
  class and revision the count, mean, median, 99th percentile and worst query (with its text), and per
  class the geometric mean over its queries of each revision's time over the first revision's. The
  classes, from the terms' document frequencies ``p = df / N``: *all common* (two or more terms, every
  one with ``p >= 5%``: the MaxScore worst case, one essential list and every posting decoded), *rare*
  (every term below 1%), *mixed* (the rest). The queries: ``--nq`` of the bench's NQ-style questions
  (``WikiLikeCorpus.queries``) and ``--common-queries`` of three of the corpus's 200 most common words;
* a hash of every revision's top-3 lists (they must agree).

CPU time (``time.thread_time``) is what compares on shared cores; the load average is recorded
before and after each part.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
COMMON, RARE = 0.05, 0.01
"""A term is common when it is in at least 5% of the passages, rare below 1%."""


def _child_build(corpus: str, index: str) -> dict:
    from searchr1.retrieval.index import build_index

    load = os.getloadavg()
    wall, cpu = time.perf_counter(), time.process_time()
    build_index(corpus, index, show_progress=False, resume=False, workers=1)
    return {"build_wall_s": time.perf_counter() - wall, "build_cpu_s": time.process_time() - cpu,
            "load_before": load, "load_after": os.getloadavg()}  # fmt: skip


def _build(code: Path, corpus: Path, index: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code)}
    cmd = [sys.executable, __file__, "--child-build", str(corpus), str(index)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the build with {code} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def renamed_copy(code: Path, label: str, into: Path) -> str:
    """``code``'s ``searchr1`` package copied to ``into/searchr1_<label>`` with every ``searchr1`` in
    its Python source renamed (so that two revisions import side by side); returns the package name."""
    name = f"searchr1_{label}"
    dest = into / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(code / "searchr1", dest, ignore=shutil.ignore_patterns("__pycache__"))
    word = re.compile(r"\bsearchr1\b")
    for path in dest.rglob("*.py"):
        path.write_text(word.sub(name, path.read_text(encoding="utf-8")), encoding="utf-8")
    return name


def _classify(r, query: str) -> str:
    ids = sorted(set(r.term_ids(query)))
    if not ids:
        return "none"
    indptr = np.asarray(r.postings.indptr)
    p = np.array([int(indptr[t + 1] - indptr[t]) for t in ids]) / r.matrix.num_docs
    if len(p) >= 2 and p.min() >= COMMON:
        return "all common"
    if p.max() < RARE:
        return "rare"
    return "mixed"


def _decode(retrievers: dict, columns: int, repeats: int) -> dict:
    from bm25_kernel import decode_rate  # benchmarks/: this script's folder

    load = os.getloadavg()
    best: dict[str, dict] = {}
    for _ in range(repeats):
        for label, r in retrievers.items():
            row = decode_rate(r, columns, repeats=1)
            if label not in best or row["decode_ns_per_posting"] < best[label]["decode_ns_per_posting"]:
                best[label] = row
    return {"revisions": best, "load_before": load, "load_after": os.getloadavg()}


def _profile(retrievers: dict, queries: list[str], repeats: int) -> dict:
    load = os.getloadavg()
    labels = list(retrievers)
    for q in queries:  # untimed: compiled code, page cache
        for r in retrievers.values():
            r.search([q], 3)
    ms = {label: np.full(len(queries), np.inf) for label in labels}
    ids: dict[str, list] = {label: [] for label in labels}
    for j, q in enumerate(queries):
        for _ in range(repeats):
            for label in labels:
                t = time.thread_time()
                retrievers[label].search([q], 3)
                ms[label][j] = min(ms[label][j], (time.thread_time() - t) * 1000)
        for label in labels:
            ids[label].append([h.id for h in retrievers[label].search([q], 3)[0]])
    first = retrievers[labels[0]]
    classes: dict[str, list[int]] = {}
    for j, q in enumerate(queries):
        classes.setdefault(_classify(first, q), []).append(j)
    summary: dict[str, dict] = {}
    for name, members in sorted(classes.items()):
        summary[name] = {"queries": len(members)}
        for label in labels:
            t = ms[label][members]
            worst = members[int(np.argmax(t))]
            summary[name][label] = {"mean_ms": float(t.mean()), "median_ms": float(np.median(t)),
                                    "p99_ms": float(np.percentile(t, 99)), "worst_ms": float(t.max()),
                                    "worst_query": queries[worst],
                                    "geomean_over_first": float(np.exp(np.mean(np.log(t / ms[labels[0]][members]))))}  # fmt: skip
    return {"classes": summary,
            "top3_ids_sha256": {label: hashlib.sha256(json.dumps(ids[label]).encode()).hexdigest()[:16] for label in labels},
            "load_before": load, "load_after": os.getloadavg()}  # fmt: skip


def _common_queries(count: int, seed: int) -> list[str]:
    """``count`` queries of three of the corpus's most common content words (the generator's ranks
    0-199), as "the w1 w2 w3" (the stop word dropped by the analyzer)."""
    from searchr1.bench.retrieval_scale import WikiLikeCorpus

    gen = WikiLikeCorpus(seed=0)
    rng = np.random.default_rng(seed)
    return [" ".join(["the", *(gen.word(int(x)) for x in rng.choice(200, 3, replace=False))]) for _ in range(count)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=250_000, help="passages (at most 250,000 on a shared machine)")
    ap.add_argument("--rev", action="append", default=[], help="LABEL=PATH: a revision's code (repeatable; "
                    "the first is the reference of the ratios)")  # fmt: skip
    ap.add_argument("--workdir", default="/tmp/bm25_profile_bench")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bm25_profile.json"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--columns", type=int, default=8)
    ap.add_argument("--nq", type=int, default=1024, help="NQ-style queries")
    ap.add_argument("--common-queries", type=int, default=256, help="queries of three common words")
    ap.add_argument("--child-build", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_build:
        print(json.dumps(_child_build(*args.child_build)))
        return
    from bm25_build import generated_corpus, nq_queries  # benchmarks/: this script's folder

    work, corpus = generated_corpus(args.workdir, args.n)
    queries_file = work / f"queries_{args.n}_{args.nq}_{args.common_queries}.json"
    if not queries_file.is_file():
        nq = nq_queries(args.n, args.nq)
        queries_file.write_text(json.dumps(nq + _common_queries(args.common_queries, seed=2)))
    queries = json.loads(queries_file.read_text())
    revs = {k: Path(v).resolve() for k, v in (r.split("=", 1) for r in args.rev)} or {"this": ROOT}
    rows: list[dict] = []
    for label, code in revs.items():
        index = work / f"{label}_{args.n}"
        if not (index / "manifest.json").is_file():
            rows.append({"label": label, "step": "build", **_build(code, corpus, index)})
            print(json.dumps(rows[-1]), flush=True)
    sys.path.insert(0, str(work / "code"))
    retrievers = {}
    for label, code in revs.items():
        package = renamed_copy(code, label, work / "code")
        load_index = importlib.import_module(f"{package}.retrieval.index").load_index
        retrievers[label] = load_index(work / f"{label}_{args.n}")
    rows.append({"step": "decode", **_decode(retrievers, args.columns, args.repeats)})
    print(json.dumps(rows[-1]), flush=True)
    rows.append({"step": "profile", **_profile(retrievers, queries, args.repeats)})
    print(json.dumps(rows[-1]), flush=True)
    result = {
        "what": "benchmarks/bm25_profile.py: BM25 posting decode and per-class query CPU time, revisions side "
                "by side in one process, alternated query by query",
        "command": " ".join(sys.argv),
        "machine": f"{os.cpu_count()} cores shared with other work: CPU times and ratios within this run count",
        "n": args.n,
        "revisions": {k: str(v) for k, v in revs.items()},
        "rows": rows,
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    _table(rows, list(revs))


def _table(rows: list[dict], labels: list[str]) -> None:
    for r in rows:
        if r["step"] == "decode":
            print(f"\n{'decode':<10}{'ns/posting':>11}{'postings':>11}   load {r['load_before'][0]:.1f} -> "
                  f"{r['load_after'][0]:.1f}")  # fmt: skip
            for label, d in r["revisions"].items():
                print(f"{label:<10}{d['decode_ns_per_posting']:>11.2f}{d['decode_postings']:>11,}")
        if r["step"] == "profile":
            print(f"\n{'class':<12}{'rev':<8}{'n':>6}{'mean ms':>9}{'p50 ms':>8}{'p99 ms':>8}{'worst ms':>9}"
                  f"{'x first':>9}   load {r['load_before'][0]:.1f} -> {r['load_after'][0]:.1f}")  # fmt: skip
            for name, c in r["classes"].items():
                for label in labels:
                    d = c[label]
                    print(f"{name:<12}{label:<8}{c['queries']:>6}{d['mean_ms']:>9.3f}{d['median_ms']:>8.3f}"
                          f"{d['p99_ms']:>8.3f}{d['worst_ms']:>9.3f}{d['geomean_over_first']:>9.3f}")  # fmt: skip
            print("top-3 sha256:", r["top3_ids_sha256"])


if __name__ == "__main__":
    main()
