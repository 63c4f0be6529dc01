"""The HotpotQA demo's search and token budgets, measured on the dev questions only.

    python benchmarks/hotpotqa_budgets.py [--sample shared/data/hotpotqa-sample] [--topk 1 2 3]

BM25 (the project's ``bm25`` backend, its defaults) over the whole sample's corpus (every distinct paragraph
of train, dev and test: ``searchr1.demo.hotpotqa_data``), so a search must find the question's paragraph among
all the others. For each ``topk`` and each query the model could send:

* ``question``: the question itself (what a policy searches first); the share of the question's two gold
  paragraphs retrieved, and of questions with both;
* ``gold_1`` / ``gold_2``: the gold path's two searches (``searchr1.rollout.gold``: the first and the second
  supporting title, as the warm start and guidance query them); the share where that title's paragraph is
  retrieved;

and the SmolLM2 tokens of the ``<information>`` block each search gives (Search-R1's ``Doc i(Title: t) text``
lines, as the rollout encodes them). The whole gold trajectory of each dev question (``GoldWriter`` with no
limit) gives the tokens of its generated turns and of its response. The budgets of
``searchr1/configs/hotpotqa_rl.yaml`` follow from these by the rule in ``choose``. Prints a table and writes
``benchmarks/results/hotpotqa_budgets.json``; takes well under a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
TEMPLATE = "instruct_2hop"
QUERIES = ("question", "gold_1", "gold_2")


def percentile(values: list[int], q: float) -> int:
    """The nearest-rank ``q``-th percentile (0-100) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def spread(values: list[int]) -> dict[str, float]:
    return {
        "mean": sum(values) / len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p95": percentile(values, 95),
        "max": max(values),
    }


def round_up(value: float, step: int = 16) -> int:
    return int(math.ceil(value / step) * step)


def measure_search(rows: list[dict], retriever: Any, tokenizer: Any, topk: int) -> dict[str, Any]:
    """Gold paragraphs retrieved and observation tokens per query kind, at ``topk``."""
    from searchr1.data.prompts import format_observation_docs, wrap_information
    from searchr1.data.supporting import supporting_titles, title_key

    gold = [[title_key(t) for t in supporting_titles(r["metadata"])] for r in rows]
    queries = {
        "question": [r["question"] for r in rows],
        "gold_1": [supporting_titles(r["metadata"])[0] for r in rows],
        "gold_2": [supporting_titles(r["metadata"])[1] for r in rows],
    }
    out: dict[str, Any] = {}
    for kind, texts in queries.items():
        hits = retriever.search(texts, topk)
        found = [{title_key(h.title) for h in hs} for hs in hits]
        tokens = [
            len(tokenizer.encode(wrap_information(format_observation_docs(hs)), add_special_tokens=False))
            for hs in hits
        ]
        if kind == "question":
            share = [sum(t in f for t in g) / len(g) for g, f in zip(gold, found, strict=True)]
            both = [all(t in f for t in g) for g, f in zip(gold, found, strict=True)]
            row = {"gold_share": sum(share) / len(share), "both_gold": sum(both) / len(both)}
        else:
            k = QUERIES.index(kind) - 1
            row = {"gold_share": sum(g[k] in f for g, f in zip(gold, found, strict=True)) / len(rows)}
        out[kind] = {**row, "obs_tokens": spread(tokens)}
    return out


def measure_gold(rows: list[dict], retriever: Any, tokenizer: Any, topk: int) -> dict[str, Any]:
    """Tokens of the gold trajectories' generated turns and responses at ``topk``, observations uncut."""
    from searchr1.data.prompts import build_prompt
    from searchr1.rollout.config import RolloutConfig
    from searchr1.rollout.gold import GoldWriter, gold_path
    from searchr1.rollout.types import Role

    config = RolloutConfig(
        max_turns=2, max_obs_tokens=10**6, max_response_tokens=10**6, last_search_notice=True
    )
    writer = GoldWriter(tokenizer, config, retriever, topk)
    turns: list[int] = []
    responses: list[int] = []
    prompts: list[int] = []
    for i, row in enumerate(rows):
        prompt = tokenizer.encode(
            build_prompt(row["question"], TEMPLATE, tokenizer), add_special_tokens=False
        )
        traj = writer.trajectory(prompt, gold_path(row), {"index": i}).trajectory
        run = 0
        for role in [*traj.roles, int(Role.OBSERVATION)]:  # generated runs, each one turn
            if role == int(Role.GENERATED):
                run += 1
            elif run:
                turns.append(run)
                run = 0
        responses.append(len(traj.response_ids))
        prompts.append(len(prompt))
    return {
        "turn_tokens": spread(turns),
        "response_tokens": spread(responses),
        "prompt_tokens": spread(prompts),
    }


def choose(
    searches: dict[int, Any], gold: dict[int, Any], notice_tokens: int, min_gain: float
) -> dict[str, Any]:
    """The budgets. ``topk``: the smallest k where one more passage a search adds less than ``min_gain`` to
    the gold paragraphs found, averaged over the three queries (the question, ``gold_1``, ``gold_2``);
    ``max_obs_tokens``: the largest of the three queries' 90th percentiles of observation tokens at that k
    (rounded up to 16: about a tenth of the observations are cut, on their last passage); ``max_turn_tokens``:
    the 95th percentile of the gold turns (rounded up to 16); ``max_response_tokens``: two searches and an
    answer at their limits, ``3 x max_turn_tokens + 2 x max_obs_tokens + the notice``, the demo config's
    formula."""
    ks = sorted(searches)

    def recall(k: int) -> float:
        return sum(searches[k][q]["gold_share"] for q in QUERIES) / len(QUERIES)

    topk = next((k for k, nxt in itertools.pairwise(ks) if recall(nxt) - recall(k) < min_gain), ks[-1])
    max_obs = round_up(max(searches[topk][q]["obs_tokens"]["p90"] for q in QUERIES))
    max_turn = round_up(gold[topk]["turn_tokens"]["p95"])
    return {
        "retrieval.topk": topk,
        "rollout.max_obs_tokens": max_obs,
        "rollout.max_turn_tokens": max_turn,
        "rollout.max_response_tokens": 3 * max_turn + 2 * max_obs + notice_tokens,
        "gold_found_by_topk": {str(k): round(recall(k), 4) for k in ks},
        "rule": " ".join((choose.__doc__ or "").split("The budgets. ")[1].split()),
    }


def table(searches: dict[int, Any], gold: dict[int, Any]) -> str:
    head = f"{'topk':>4}  {'query':<9} {'gold found':>10} {'both':>6}   obs tokens: {'mean':>6} {'p50':>5} {'p90':>5} {'p95':>5} {'max':>5}"
    lines = [head, "-" * len(head)]
    for k, by in searches.items():
        for q, row in by.items():
            o = row["obs_tokens"]
            both = f"{row['both_gold']:.3f}" if "both_gold" in row else ""
            lines.append(f"{k:>4}  {q:<9} {row['gold_share']:>10.3f} {both:>6}   {'':>12}{o['mean']:>6.1f} "
                         f"{o['p50']:>5} {o['p90']:>5} {o['p95']:>5} {o['max']:>5}")  # fmt: skip
    lines.append("")
    lines.append(
        f"{'topk':>4}  gold trajectories: turn tokens p50/p95/max, response tokens p50/p90/max, prompt p50"
    )
    for k, g in gold.items():
        t, r, p = g["turn_tokens"], g["response_tokens"], g["prompt_tokens"]
        lines.append(
            f"{k:>4}  {t['p50']}/{t['p95']}/{t['max']}   {r['p50']}/{r['p90']}/{r['max']}   {p['p50']}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sample", default="auto", help="the HotpotQA sample folder (default: shared/data/hotpotqa-sample)"
    )
    parser.add_argument(
        "--topk", type=int, nargs="+", default=[1, 2, 3], help="passages per search (default 1 2 3)"
    )
    parser.add_argument("--min-gain", type=float, default=0.05,
                        help="the topk rule: one more passage must add this much gold recall (default 0.05)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "hotpotqa_budgets.json")
    args = parser.parse_args()

    from searchr1.data.hotpotqa import read_hotpotqa
    from searchr1.data.prompts import LAST_SEARCH_NOTICE
    from searchr1.demo.hotpotqa_data import load_demo_data
    from searchr1.demo.settings import find_hotpotqa_sample
    from searchr1.models import load_tokenizer, resolve_model

    folder = find_hotpotqa_sample(args.sample)
    if folder is None:
        print(
            "error: HotpotQA sample not found (shared/data/hotpotqa-sample); give --sample", file=sys.stderr
        )
        return 2
    t0 = time.perf_counter()
    corpus = load_demo_data(folder).corpus  # the whole sample's paragraphs
    from searchr1.demo.hotpotqa_data import HotpotQAData

    retriever = HotpotQAData(Path(folder), [], [], [], corpus).retriever()
    dev = read_hotpotqa(Path(folder) / "dev.jsonl")
    tokenizer = load_tokenizer(resolve_model(MODEL))
    searches = {k: measure_search(dev, retriever, tokenizer, k) for k in args.topk}
    gold = {k: measure_gold(dev, retriever, tokenizer, k) for k in args.topk}
    notice = len(tokenizer.encode(LAST_SEARCH_NOTICE, add_special_tokens=False))
    chosen = choose(searches, gold, notice, args.min_gain)
    print(
        f"{len(dev)} dev questions, BM25 over {len(corpus)} passages (the whole sample), tokenizer {MODEL}\n"
    )
    print(table(searches, gold))
    print("\nchosen: " + ", ".join(f"{k}={v}" for k, v in chosen.items() if k != "rule"))
    result = {
        "questions": len(dev),
        "split": "dev",
        "corpus_passages": len(corpus),
        "tokenizer": MODEL,
        "template": TEMPLATE,
        "search": {str(k): v for k, v in searches.items()},
        "gold_trajectories": {str(k): v for k, v in gold.items()},
        "notice_tokens": notice,
        "chosen": chosen,
        "seconds": round(time.perf_counter() - t0, 1),
        "command": "python benchmarks/hotpotqa_budgets.py " + " ".join(sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
