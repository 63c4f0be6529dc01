"""``searchr1 bench rollout``: the async KV-cached engine against the turn-synchronous one.

Workload (identical for both engines): questions of the embedded synthetic world in the Search-R1
prompt (mixed prompt lengths), a Qwen2-style model with random weights, the in-process BM25
index of the world's corpus behind an injected latency per search call (0, 50, 200 ms). A
seeded script per row (``searchr1.rollout.steer.ScriptedTurns``) makes the random model behave
like a Search-R1 policy: 1 to 4 searches and then an answer, with a long-tailed number of
thinking tokens per turn (most turns short, some long, as real reasoning lengths are). Only tag
tokens are forced; the tokens in between are sampled from the model's real distribution, and
every forward pass is real. Both engines share per-row random streams, so they sample the same
tokens: the table reports that the two token streams are identical.

Measured per latency: wall time, generated tokens/s and trajectories/s of each engine, and the
ratio (async / turn-sync throughput = turn-sync wall / async wall); also the process CPU time of
each run, whose ratio is less sensitive to other load on a shared machine. Peak memory: the KV cache's peak bytes of each engine, and the peak
resident memory of one rollout in a fresh subprocess per engine (CPU: ``VmHWM`` after a
``clear_refs`` reset, minus the resident set before the rollout; CUDA: max allocated).
Targets: >= 2x at 200 ms (the headline), >= 1.3x at 0 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from searchr1.bench import BenchResult
from searchr1.retrieval.base import Hit, Retriever


@dataclass
class Sizes:
    rows: int
    latencies_ms: tuple[int, ...]
    hidden_size: int
    layers: int
    heads: int
    searches: tuple[int, int]
    think_median: float
    think_sigma: float
    think_range: tuple[int, int]
    max_obs_tokens: int
    entities: int


FULL = Sizes(
    rows=48,
    latencies_ms=(0, 50, 200),
    hidden_size=128,
    layers=4,
    heads=4,
    searches=(1, 4),
    think_median=24,
    think_sigma=1.0,
    think_range=(4, 256),
    max_obs_tokens=200,
    entities=120,
)
QUICK = Sizes(
    rows=16,
    latencies_ms=(0, 200),
    hidden_size=64,
    layers=2,
    heads=4,
    searches=(1, 4),
    think_median=10,
    think_sigma=1.0,
    think_range=(2, 96),
    max_obs_tokens=128,
    entities=40,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:  # pragma: no cover - harness hook
    pass


class LatencyRetriever(Retriever):
    """Wraps a retriever; every ``search`` call first sleeps ``latency_s`` (a network round trip)."""

    name = "latency"

    def __init__(self, inner: Retriever, latency_s: float) -> None:
        self.inner = inner
        self.latency_s = latency_s
        self.calls = 0

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        self.calls += 1
        if self.latency_s:
            time.sleep(self.latency_s)
        return self.inner.search(queries, topk)


def build_workload(sizes: Sizes, seed: int) -> dict[str, Any]:
    """Tokenizer, model, retriever, prompts and per-row scripts (deterministic in ``seed``)."""
    import torch

    from searchr1.data.prompts import build_prompt
    from searchr1.data.synth import SynthConfig, generate_world
    from searchr1.models import build_tiny_model, train_tokenizer
    from searchr1.retrieval.bm25 import BM25Retriever
    from searchr1.retrieval.corpus import Document
    from searchr1.rollout.steer import make_script

    synth = SynthConfig(num_entities=sizes.entities, num_train=200, num_val=20, num_test=20, seed=seed)
    world = generate_world(synth)
    texts = [row["contents"] for row in world.corpus] + [build_prompt("x")]
    tokenizer = train_tokenizer(texts, vocab_size=1024)
    torch.manual_seed(seed)
    model = build_tiny_model(
        tokenizer,
        seed=seed,
        hidden_size=sizes.hidden_size,
        intermediate_size=3 * sizes.hidden_size,
        num_hidden_layers=sizes.layers,
        num_attention_heads=sizes.heads,
        num_key_value_heads=max(1, sizes.heads // 2),
        max_position_embeddings=8192,
    ).eval()
    docs = []
    for row in world.corpus:
        title, _, text = row["contents"].partition("\n")
        docs.append(Document(id=row["id"], title=title.strip('"'), text=text))
    bm25 = BM25Retriever.from_documents(docs)
    rng = random.Random(seed)
    questions = [q["question"] for q in world.splits["train"]]
    rng.shuffle(questions)
    prompts = [tokenizer.encode(build_prompt(q), add_special_tokens=False) for q in questions[: sizes.rows]]
    metas = [
        {
            "question": q,
            "script": make_script(
                rng,
                rng.randint(*sizes.searches),
                think=sizes.think_range,
                query=(3, 8),
                answer=(1, 4),
                think_lognormal=(sizes.think_median, sizes.think_sigma),
            ),
        }
        for q in questions[: sizes.rows]
    ]
    return {"tokenizer": tokenizer, "model": model, "bm25": bm25, "prompts": prompts, "metas": metas}


def make_engine(name: str, work: dict[str, Any], sizes: Sizes, latency_s: float) -> Any:
    from searchr1.rollout.config import RolloutConfig
    from searchr1.rollout.hf import HFRolloutEngine, TurnSyncRolloutEngine
    from searchr1.rollout.steer import ScriptedTurns

    cls = {"async_kv": HFRolloutEngine, "turn_sync": TurnSyncRolloutEngine}[name]
    cfg = RolloutConfig(
        max_turns=4,
        max_turn_tokens=512,
        max_obs_tokens=sizes.max_obs_tokens,
        max_response_tokens=8192,
        max_batch_rows=sizes.rows,
        search_workers=8,
    )
    retriever = LatencyRetriever(work["bm25"], latency_s)
    steer = ScriptedTurns(work["tokenizer"])
    return cls(work["model"], work["tokenizer"], retriever, cfg, topk=3, steer=steer)


def run_once(name: str, work: dict[str, Any], sizes: Sizes, latency_s: float, seed: int) -> tuple[list, dict]:
    from searchr1.rollout.sampling import SamplingParams

    with make_engine(name, work, sizes, latency_s) as engine:
        t0, cpu0 = time.perf_counter(), time.process_time()
        trajs = engine.generate(
            work["prompts"], work["metas"], sampling=SamplingParams(temperature=1.0), seed=seed
        )
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        stats = dict(engine.last_stats, wall_s=wall, cpu_s=cpu, search_calls=engine.retriever.calls)
    return trajs, stats


def _memory_child(name: str, quick: bool, seed: int) -> dict[str, float]:
    """Run one rollout in this (fresh) process and measure its peak memory."""
    import torch

    torch.set_num_threads(1)
    sizes = QUICK if quick else FULL
    work = build_workload(sizes, seed)
    if torch.cuda.is_available():  # pragma: no cover - GPU machines
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        _, stats = run_once(name, work, sizes, 0.0, seed)
        peak = torch.cuda.max_memory_allocated() - before
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident set
        before = _status_kb("VmRSS")
        _, stats = run_once(name, work, sizes, 0.0, seed)
        peak = (_status_kb("VmHWM") - before) * 1024
    return {"peak_bytes": float(peak), "peak_kv_cache_bytes": stats["peak_kv_cache_bytes"]}


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure_memory(name: str, quick: bool, seed: int) -> dict[str, float]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    code = (
        "import json, sys; from searchr1.bench.rollout import _memory_child; "
        f"print('RESULT ' + json.dumps(_memory_child({name!r}, {quick!r}, {seed!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"memory probe for {name} failed:\n{out.stderr[-2000:]}")


def run(args: argparse.Namespace) -> BenchResult:
    import torch

    torch.set_num_threads(1)
    quick = bool(getattr(args, "quick", False))
    seed = int(getattr(args, "seed", 0))
    sizes = QUICK if quick else FULL
    work = build_workload(sizes, seed)
    run_once("async_kv", work, sizes, 0.0, seed)  # warm-up (both engines share the model)
    rows: list[dict[str, Any]] = []
    ratios: dict[int, float] = {}
    for latency_ms in sizes.latencies_ms:
        results = {}
        for name in ("turn_sync", "async_kv"):
            trajs, stats = run_once(name, work, sizes, latency_ms / 1000, seed)
            results[name] = (trajs, stats)
            gen = sum(t.num_generated for t in trajs)
            rows.append(
                {
                    "latency_ms": latency_ms,
                    "engine": name,
                    "wall_s": stats["wall_s"],
                    "cpu_s": stats["cpu_s"],
                    "gen_tok_per_s": gen / stats["wall_s"],
                    "traj_per_s": len(trajs) / stats["wall_s"],
                    "gen_tokens": gen,
                    "fed_tokens": int(stats["fed_tokens"]),
                    "forwards": int(stats["forward_calls"]),
                    "search_calls": stats["search_calls"],
                    "peak_kv_MB": stats["peak_kv_cache_bytes"] / 2**20,
                }
            )
        (ta, sa), (tb, sb) = results["async_kv"], results["turn_sync"]
        same = sum(a.response_ids == b.response_ids for a, b in zip(ta, tb, strict=True)) / len(ta)
        ratios[latency_ms] = sb["wall_s"] / sa["wall_s"]
        rows[-1]["speedup"] = ratios[latency_ms]
        rows[-1]["cpu_ratio"] = sb["cpu_s"] / sa["cpu_s"]
        rows[-1]["same_tokens"] = same
    memory: dict[str, dict[str, float]] = {}
    if not quick:  # a fresh process per engine; --quick reports the KV-cache peaks only
        memory = {name: measure_memory(name, quick, seed) for name in ("turn_sync", "async_kv")}
    for name, mem in memory.items():
        rows.append(
            {
                "latency_ms": 0,
                "engine": f"{name} (memory)",
                "peak_MB": mem["peak_bytes"] / 2**20,
                "peak_kv_MB": mem["peak_kv_cache_bytes"] / 2**20,
            }
        )
    searches = [len(m["script"]) - 1 for m in work["metas"]]
    params = {
        **asdict(sizes),
        "quick": quick,
        "seed": seed,
        "prompt_tokens": [min(map(len, work["prompts"])), max(map(len, work["prompts"]))],
        "searches_per_row": {str(k): searches.count(k) for k in sorted(set(searches))},
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "torch_threads": 1,
        "sampling": "temperature 1.0, tags forced by ScriptedTurns",
    }
    top = max(sizes.latencies_ms)
    return BenchResult(
        name="rollout",
        params=params,
        rows=rows,
        headline=ratios[top],
        headline_label=f"async KV-cached / turn-synchronous rollout throughput at {top} ms search latency "
        f"(target >= 2; at 0 ms: {ratios[min(sizes.latencies_ms)]:.2f}, target >= 1.3)",
        extra={"speedup_by_latency_ms": {str(k): v for k, v in ratios.items()}, "memory": memory},
    )
