"""``searchr1 demo --data hotpotqa``: Search-R1 in miniature on real HotpotQA questions, in one command.

Where the synthetic demo shows the pipeline, this one asks what RL adds over supervised imitation and RAG,
the comparison the Search-R1 paper makes, on the shared HotpotQA sample (``hotpotqa_data``: training
questions from train and most of dev, a fixed validation slice of dev, test questions only for the rows;
BM25 over every paragraph of the sample). Six rows, each evaluated greedily on the same test questions:

    direct    the starting model answers from its own knowledge (FlashRAG's prompt, no search)
    rag       the starting model answers from the top-k passages retrieved for the question
    agent     the starting model in the Search-R1 loop (its prompt: ``--template``, instruct_2hop)
    warm      the warm start alone: supervised LoRA on the training questions' gold paths
              (``searchr1.trainer.warmstart``, trajectories by ``searchr1.rollout.gold``)
    rl        RL alone from the starting model (the recipe of configs/hotpotqa_rl.yaml without the
              warm start; the first seed)
    warm_rl   the warm start, then RL from its policy, once per seed (one warm start serves every seed)

RL keeps the policy of the best validation EM (``trainer.keep_best``, the validation slice); that policy is
the one evaluated. Each row gives ``em``, ``f1``, ``valid_format``, ``searches_bridge`` and
``searches_comparison`` (searches per question of each type), the RL rows ``em_by_seed``, ``em_mean`` and
``em_std`` too, and ``minutes``; ``summary.json`` in the run folder holds them with the split and the
settings, and the console prints them as a table. A finished row is kept in ``rows/`` and not run again
when the same command runs into the same folder (``--rows`` picks rows). With ``--jobs N`` the runs go to N
worker processes at once (``run_rows``): the starting model's evaluations, ``rl`` and each seed of ``warm_rl``
a process each, the warm start in the main process while the first ones run; on a GPU they share the card.

The pieces: ``hotpotqa_data`` (split and corpus), this module (the rows), ``hotpotqa_report`` (the numbers,
the table, the results file), ``hotpotqa_cli`` (the flags of ``searchr1 demo`` that reach it).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from searchr1.config import load_config, shipped_config
from searchr1.data.hotpotqa import missing_gold_line
from searchr1.data.prompts import load_template
from searchr1.demo.hotpotqa_data import check_sample_folder, load_demo_data
from searchr1.demo.hotpotqa_report import ROWS, machine, row_metrics, seed_rows
from searchr1.demo.settings import (
    RL_ONLY_OVERRIDES,
    algorithm_overrides,
    find_hotpotqa_sample,
    resolve_starting_model,
    write_prompt,
)
from searchr1.demo.workers import worker_pool
from searchr1.evaluation import evaluate
from searchr1.models import DEFAULT_MODEL, load_model, load_tokenizer
from searchr1.trainer.warmstart import run_warm_start

CONFIG_NAME = "hotpotqa_rl"
"""The shipped recipe (``searchr1/configs/hotpotqa_rl.yaml``)."""
SUMMARY_FILE = "summary.json"
RUN_FILE = "run.json"
QUICK_OVERRIDES: tuple[str, ...] = (
    "trainer.batch_size=4",
    "trainer.mini_batch_size=4",
    "trainer.val_before_train=false",
    "trainer.val_every=0",
    "trainer.keep_best=none",
)
"""``--quick``'s keys of the recipe (before the user's): RL steps of 4 questions x 4 trajectories, no
validation (the last policy is evaluated)."""


HOTPOTQA_TEMPLATE = "instruct_2hop"
"""The real-data run's prompt: Search-R1's instruction and two two-search worked examples (its budgets in
``configs/hotpotqa_rl.yaml`` were measured with it)."""


@dataclass
class HotpotQASettings:
    """One HotpotQA demo (``quick_settings``: fewer questions and steps, one seed)."""

    sample: str = "auto"
    """The sample folder (train.jsonl, dev.jsonl, test.jsonl); ``auto``: ``shared/data/hotpotqa-sample``
    beside or above the working directory or this package."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """RL seeds of ``warm_rl``; ``rl`` and the warm start take the first."""
    rows: tuple[str, ...] = ROWS
    """The rows to run (a finished row in the folder is kept either way)."""
    val_questions: int = 64
    """The validation slice of dev: half bridge, half comparison."""
    train_questions: int = 0
    """Training questions: the first N of train + the rest of dev (0: all 529)."""
    test_questions: int = 0
    """Test questions of every row: the first N of test.jsonl (0: all 497)."""
    steps: int = 0
    """RL steps per run (0: the recipe's ``trainer.total_steps``)."""
    model: str = DEFAULT_MODEL
    template: str = HOTPOTQA_TEMPLATE
    algorithm: str = "grpo"
    overrides: list[str] = field(default_factory=list)
    """Dotted ``key=value`` overrides of the recipe (``trainer.device=cuda`` ...), for every stage."""
    quick: bool = False
    jobs: int = 1
    """Worker processes for the runs (``run_rows``): the starting model's evaluations, ``rl`` and each seed of
    ``warm_rl`` at once (on a GPU, the card shared); 1: one after another in this process."""

    @classmethod
    def quick_settings(cls) -> HotpotQASettings:
        """Every row on 100 test questions, one RL seed, as little training as shows each stage: 64 training
        questions (a warm start of 4 steps of 16), 2 RL steps of 4 x 4 trajectories per run, no validation
        (``QUICK_OVERRIDES``); the split is the full demo's. Estimated from its parts (CPU seconds of each,
        measured on one thread): ~55 minutes on 2 AVX2 cores in float32, four fifths of it the four agent
        evaluations and RL; see the README."""
        return cls(
            seeds=(0,), train_questions=64, test_questions=100, steps=2, overrides=list(QUICK_OVERRIDES),
            quick=True,
        )  # fmt: skip

    def fingerprint(self) -> str:
        """What a folder's finished rows must have been run with (everything but ``rows`` and ``jobs``)."""
        keys = {k: v for k, v in asdict(self).items() if k not in ("rows", "jobs")}
        return hashlib.sha256(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()[:16]


def recipe(
    settings: HotpotQASettings, seed: int, out_dir: Path, prompt: Path | str, model_dir: Path | str,
    extra: Sequence[str] = (),
) -> Any:  # fmt: skip
    """The configuration of one stage: the shipped recipe, the stage's own keys, then the user's."""

    path = shipped_config(CONFIG_NAME)
    if path is None:
        raise FileNotFoundError(f"shipped config {CONFIG_NAME}.yaml is missing")
    overrides = [
        f"seed={seed}",
        f"trainer.out_dir={out_dir}",
        f"data.template={prompt}",
        f"model.path={model_dir}",
        *algorithm_overrides(settings.algorithm),
        *([f"trainer.total_steps={settings.steps}"] if settings.steps else []),
        *settings.overrides,
        *extra,
    ]
    return load_config(path, overrides)


def validate(settings: HotpotQASettings) -> Path:
    """Every setting checked, nothing written (a ``ValueError`` names the flag or key); returns the sample
    folder."""

    if not settings.seeds:
        raise ValueError("--seeds: at least one seed is needed")
    unknown = [r for r in settings.rows if r not in ROWS]
    if unknown or not settings.rows:
        raise ValueError(
            f"--rows: expected some of {', '.join(ROWS)}, got {' '.join(settings.rows) or 'none'}"
        )
    for flag, value, least in (("--val-questions", settings.val_questions, 1), ("--jobs", settings.jobs, 1),
                               ("--train-questions", settings.train_questions, 0),
                               ("--num-test", settings.test_questions, 0), ("--steps", settings.steps, 0)):  # fmt: skip
        if value < least:
            raise ValueError(f"{flag} must be >= {least}, got {value}")
    try:
        load_template(settings.template)
    except ValueError as exc:
        raise ValueError(f"--template: {exc}") from None
    cfg = recipe(settings, settings.seeds[0], Path("runs/hotpotqa-check"), settings.template, settings.model)
    if {"warm", "warm_rl"} & set(settings.rows) and not cfg.warmstart.enabled:
        raise ValueError("warmstart.epochs=0: the warm and warm_rl rows need a warm start")
    folder = find_hotpotqa_sample(settings.sample)
    if folder is None:
        raise ValueError(
            "HotpotQA sample not found (shared/data/hotpotqa-sample beside or above this folder); "
            "give --hotpotqa-sample FOLDER"
        )
    check_sample_folder(folder)
    resolve_starting_model(settings.model)
    return folder


@dataclass
class Stage:
    """What every row of one demo shares: its folder, data, search backend, prompt and starting model."""

    out: Path
    settings: HotpotQASettings
    data: Any
    retriever: Any
    prompt: Path
    model_dir: Path
    log: Callable[[str], None]

    def row_file(self, name: str) -> Path:
        return self.out / "rows" / f"{name}.json"

    def done(self, name: str) -> dict[str, Any] | None:
        """A row finished earlier in this folder (same settings: the folder's ``run.json`` says so)."""
        path = self.row_file(name)
        return json.loads(path.read_text()) if path.is_file() else None

    def keep(self, name: str, row: dict[str, Any]) -> dict[str, Any]:
        path = self.row_file(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(row, indent=1) + "\n")
        tmp.replace(path)
        return row

    def trainer(self, seed: int, out_dir: Path, model_dir: Path, extra: Sequence[str] = ()) -> Any:
        """An RL trainer (set up, nothing trained) of the recipe on a fresh copy of ``model_dir``, in a fresh
        ``out_dir`` (an unfinished run's folder is started over)."""
        from searchr1.trainer.loop import RLTrainer

        if out_dir.exists():
            shutil.rmtree(out_dir)
        # the trainer never runs the warm start itself (``warm_start`` runs it once, for every seed): the
        # shared RL_ONLY_OVERRIDES (``warmstart.epochs=0``) turn it off
        cfg = recipe(self.settings, seed, out_dir, self.prompt, model_dir, [*extra, *RL_ONLY_OVERRIDES])
        trainer = RLTrainer(
            cfg, model=load_model(model_dir), tokenizer=load_tokenizer(model_dir), retriever=self.retriever,
            train_samples=self.data.train, val_samples=self.data.val,
        )  # fmt: skip
        trainer.setup()
        return trainer

    def evaluate(self, trainer: Any, mode: str, out_dir: Path) -> dict[str, Any]:
        """The trainer's policy, greedy, on the test questions in ``mode`` (direct | rag | agent)."""
        trainer.policy.eval()
        summary = evaluate(
            trainer.engine, self.data.test, tokenizer=trainer.tokenizer, mode=mode,
            retriever=self.retriever if mode == "rag" else None, batch_size=trainer.cfg.rollout.max_batch_rows,
            out_dir=out_dir, resume=False, template=str(self.prompt), topk=trainer.cfg.retrieval.topk,
            seed=trainer.cfg.seed,
        )  # fmt: skip
        return row_metrics(summary, self.data.test, out_dir)

    def train(self, trainer: Any, name: str) -> dict[str, Any]:
        """RL, then the best validated policy put back; what the run did."""
        result = trainer.train()
        best = trainer.restore_best() if trainer.cfg.trainer.keep_best != "none" else None
        if best is not None:
            self.log(f"  {name}: the best validated policy is evaluated: step {best['step']} "
                     f"(validation EM {best['em']:.3f})")  # fmt: skip
        return {"steps": result.get("step"), "updates": result.get("updates"), "best": best}


def _line(name: str, row: dict[str, Any]) -> str:
    """A row's console line; a number the row lacks (searches of a type its test questions lack: None) is -."""

    def num(key: str, digits: int) -> str:
        value = row.get(key)
        return f"{value:.{digits}f}" if isinstance(value, int | float) else "-"

    return (f"{name}: EM {num('em', 3)}  F1 {num('f1', 3)}  valid format {num('valid_format', 2)}  searches "
            f"bridge {num('searches_bridge', 2)} / comparison {num('searches_comparison', 2)}  "
            f"({num('minutes', 1)} min)")  # fmt: skip


START_ROWS = ("direct", "rag", "agent")
"""The starting model's rows: evaluations only, on one trainer."""


def start_unit(stage: Stage, modes: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``direct``, ``rag`` and ``agent`` (those of ``modes``): the starting model evaluated, each row kept."""
    rows: dict[str, dict[str, Any]] = {}
    trainer = stage.trainer(stage.settings.seeds[0], stage.out / "start", stage.model_dir, RL_ONLY_OVERRIDES)
    try:
        for mode in START_ROWS:
            if mode in modes:
                t = time.perf_counter()
                row = stage.evaluate(trainer, mode, stage.out / "eval" / mode)
                row["minutes"] = (time.perf_counter() - t) / 60
                rows[mode] = stage.keep(mode, row)
                stage.log(_line(mode, row))
    finally:
        trainer.close()
    return rows


def rl_unit(stage: Stage) -> dict[str, Any]:
    """``rl``: RL from the starting model (the first seed), then its evaluation; the row kept."""
    seed = stage.settings.seeds[0]
    t = time.perf_counter()
    trainer = stage.trainer(seed, stage.out / "rl", stage.model_dir, RL_ONLY_OVERRIDES)
    try:
        stage.log(f"rl: RL from the starting model, seed {seed}")
        run = stage.train(trainer, "rl")
        row = stage.evaluate(trainer, "agent", stage.out / "eval" / "rl")
    finally:
        trainer.close()
    row = seed_rows({seed: {**row, **run}})
    row["minutes"] = (time.perf_counter() - t) / 60
    stage.log(_line("rl", row))
    return stage.keep("rl", row)


def warm_start(stage: Stage) -> tuple[Any, float]:
    """The warm start on the training questions' gold paths, once for every seed (a finished one in the
    folder is reused): (its result, minutes)."""
    import gc

    t0 = time.perf_counter()
    cfg = recipe(stage.settings, stage.settings.seeds[0], stage.out / "warm", stage.prompt, stage.model_dir,
                 [f"warmstart.out_dir={stage.out / 'warm_start'}"])  # fmt: skip
    gc.collect()
    result = run_warm_start(
        cfg, model=load_model(stage.model_dir), retriever=stage.retriever, train_samples=stage.data.train,
        progress=cfg.trainer.progress_bar, log=lambda line: stage.log(f"  {line}"),
    )  # fmt: skip
    return result, (time.perf_counter() - t0) / 60


def warm_unit(stage: Stage, model_dir: Path, summary: dict[str, Any], warm_minutes: float) -> dict[str, Any]:
    """``warm``: the warm start's policy alone (``model_dir``), evaluated; the row kept."""
    t = time.perf_counter()
    trainer = stage.trainer(stage.settings.seeds[0], stage.out / "warm_eval", model_dir)
    try:
        row = stage.evaluate(trainer, "agent", stage.out / "eval" / "warm")
    finally:
        trainer.close()
    row["warm_start"] = {key: v for key, v in summary.items() if key != "losses"}
    row["minutes"] = warm_minutes + (time.perf_counter() - t) / 60
    stage.log(_line("warm", row))
    return stage.keep("warm", row)


def warm_rl_unit(stage: Stage, seed: int, model_dir: Path) -> dict[str, Any]:
    """One seed of ``warm_rl``: RL from the warm start's policy (``model_dir``), then its evaluation; the
    seed's row kept (``warm_rl_seed_<seed>``)."""
    t = time.perf_counter()
    trainer = stage.trainer(seed, stage.out / "warm_rl" / f"seed_{seed}", model_dir)
    try:
        stage.log(f"warm_rl: RL from the warm start, seed {seed}")
        run = stage.train(trainer, f"warm_rl seed {seed}")
        row = stage.evaluate(trainer, "agent", stage.out / "eval" / f"warm_rl_seed_{seed}")
    finally:
        trainer.close()
    return stage.keep(f"warm_rl_seed_{seed}", {**row, **run, "minutes": (time.perf_counter() - t) / 60})


def run_rows(stage: Stage, wanted: Sequence[str], rows: dict[str, Any], jobs: int = 1) -> None:
    """The rows of ``wanted`` not in ``rows`` (those finished before), one after another, or with ``jobs`` > 1
    in that many worker processes at once (the evaluations of the starting model, ``rl`` and each seed of
    ``warm_rl`` a process each; the warm start in this process, as soon as the pool has started, and the runs
    that need it after it)."""
    import gc

    start = [m for m in START_ROWS if m in wanted and m not in rows]
    seeds = stage.settings.seeds
    warm_rl = "warm_rl" in wanted and "warm_rl" not in rows
    per_seed = {s: row for s in seeds if warm_rl and (row := stage.done(f"warm_rl_seed_{s}")) is not None}
    for s in per_seed:
        stage.log(f"warm_rl, seed {s}: done before")
    todo_seeds = [s for s in seeds if warm_rl and s not in per_seed]
    need_warm_start = ("warm" in wanted and "warm" not in rows) or bool(todo_seeds)
    t_rl = time.perf_counter()
    if jobs <= 1:
        if start:
            rows.update(start_unit(stage, start))
        if "rl" in wanted and "rl" not in rows:
            gc.collect()
            rows["rl"] = rl_unit(stage)
        if need_warm_start:
            result, warm_minutes = warm_start(stage)
            t_rl = time.perf_counter()
            if "warm" in wanted and "warm" not in rows:
                gc.collect()
                rows["warm"] = warm_unit(stage, result.model_dir, result.summary, warm_minutes)
            for s in todo_seeds:
                gc.collect()
                per_seed[s] = warm_rl_unit(stage, s, result.model_dir)
    else:
        with worker_pool(jobs) as pool:
            args = (str(stage.out), stage.settings, str(stage.prompt), str(stage.model_dir))
            futures = {}
            if start:
                futures["start"] = pool.submit(_unit_in_worker, *args, "start", tuple(start))
            if "rl" in wanted and "rl" not in rows:
                futures["rl"] = pool.submit(_unit_in_worker, *args, "rl")
            if need_warm_start:
                result, warm_minutes = warm_start(stage)
                t_rl = time.perf_counter()
                warm_dir = str(result.model_dir)
                if "warm" in wanted and "warm" not in rows:
                    futures["warm"] = pool.submit(_unit_in_worker, *args, "warm", warm_dir, result.summary,
                                                  warm_minutes)  # fmt: skip
                for s in todo_seeds:
                    futures[f"warm_rl_seed_{s}"] = pool.submit(_unit_in_worker, *args, "warm_rl", s, warm_dir)
            for name, future in futures.items():
                got = future.result()
                if name == "start":
                    rows.update(got)
                elif name.startswith("warm_rl_seed_"):
                    per_seed[int(name.rsplit("_", 1)[1])] = got
                else:
                    rows[name] = got
    if warm_rl:
        row = seed_rows({s: per_seed[s] for s in seeds})
        row["minutes"] = (time.perf_counter() - t_rl) / 60
        row["warm_start_minutes"] = warm_minutes if need_warm_start else None
        rows["warm_rl"] = stage.keep("warm_rl", row)
        stage.log(_line("warm_rl", row))


def _unit_in_worker(
    out: str, settings: HotpotQASettings, prompt: str, model_dir: str, unit: str, *args: Any
) -> Any:  # fmt: skip
    """One unit of ``run_rows`` in a worker process (``--jobs``): the stage rebuilt from the settings the main
    process validated (the same split and corpus: both are deterministic), log lines prefixed with the unit."""
    folder = find_hotpotqa_sample(settings.sample)
    data = load_demo_data(folder, val_questions=settings.val_questions, train_questions=settings.train_questions,
                          test_questions=settings.test_questions)  # fmt: skip
    name = unit if unit != "warm_rl" else f"warm_rl seed {args[0]}"
    stage = Stage(Path(out), settings, data, data.retriever(), Path(prompt), Path(model_dir),
                  lambda line: _stderr(f"[{name}] {line}"))  # fmt: skip
    if unit == "start":
        return start_unit(stage, *args)
    if unit == "rl":
        return rl_unit(stage)
    if unit == "warm":
        warm_dir, summary, minutes = args
        return warm_unit(stage, Path(warm_dir), summary, minutes)
    seed, warm_dir = args
    return warm_rl_unit(stage, seed, Path(warm_dir))


def summary_of(
    rows: dict[str, Any], settings: Any, cfg: Any, data: Any, model_dir: Path, command: str, seconds: float
) -> dict[str, Any]:
    """``summary.json``: the rows in the table's order, the split, the settings, the recipe's budgets."""
    return {
        "rows": {name: rows[name] for name in ROWS if name in rows},
        "data": data.counts(),
        "settings": asdict(settings),
        "starting_model": {"name": settings.model, "path": str(model_dir)},
        "recipe": {
            "config": CONFIG_NAME,
            "retrieval.topk": cfg.retrieval.topk,
            "rollout.max_obs_tokens": cfg.rollout.max_obs_tokens,
            "rollout.max_turn_tokens": cfg.rollout.max_turn_tokens,
            "rollout.max_response_tokens": cfg.rollout.max_response_tokens,
            "trainer.total_steps": cfg.trainer.total_steps,
            "warmstart.max_examples": cfg.warmstart.max_examples,
        },
        "machine": machine(cfg.trainer.device),
        "command": command,
        "seconds": seconds,
    }


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def check_folder(out: Path, settings: HotpotQASettings) -> None:
    """A folder of a run with other settings (its ``run.json``) is refused in one line."""
    path = out / RUN_FILE
    if path.is_file() and json.loads(path.read_text()).get("fingerprint") != settings.fingerprint():
        raise ValueError(
            f"--out {out} holds a HotpotQA demo run with other settings; give another folder "
            "(only --rows may differ when a run is continued)"
        )


def open_folder(out: Path, settings: HotpotQASettings) -> None:
    """``check_folder``, then ``run.json`` written (the settings and their fingerprint)."""
    check_folder(out, settings)
    out.mkdir(parents=True, exist_ok=True)
    record = {"fingerprint": settings.fingerprint(), "settings": asdict(settings)}
    (out / RUN_FILE).write_text(json.dumps(record, indent=1) + "\n")


def run_hotpotqa_demo(
    out_dir: str | Path,
    settings: HotpotQASettings | None = None,
    log: Callable[[str], None] | None = None,
    command: str = "",
) -> dict[str, Any]:
    """Run the rows of ``settings`` into ``out_dir``; returns (and writes) the summary."""

    settings = settings or HotpotQASettings()
    log = log or _stderr
    out = Path(out_dir)
    t_start = time.perf_counter()
    folder = validate(settings)
    open_folder(out, settings)
    data = load_demo_data(folder, val_questions=settings.val_questions, train_questions=settings.train_questions,
                          test_questions=settings.test_questions)  # fmt: skip
    c = data.counts()
    log(f"HotpotQA sample {folder}: {c['train']} training, {c['val']} validation, {c['test']} test questions; "
        f"corpus {c['corpus']} passages (every distinct paragraph of the sample)")  # fmt: skip
    if any(c["dropped"].values()):
        log(
            f"left out of training and validation (a test or validation row's id or question): {c['dropped']}"
        )
    log(missing_gold_line(data.missing, len(data.train) + len(data.val) + len(data.test))
        or "corpus: every gold paragraph of the questions is in it")  # fmt: skip
    data.write(out / "data")
    model_dir = resolve_starting_model(settings.model)
    log(f"starting model: {settings.model} ({model_dir})")
    stage = Stage(out, settings, data, data.retriever(), write_prompt(out, settings.template), model_dir, log)
    rows: dict[str, Any] = {}
    for name in ROWS:
        if (earlier := stage.done(name)) is not None:
            rows[name] = earlier
            log(f"{name}: done before ({stage.row_file(name)})")
    run_rows(stage, settings.rows, rows, settings.jobs)
    cfg = recipe(settings, settings.seeds[0], out, stage.prompt, model_dir)
    summary = summary_of(rows, settings, cfg, data, model_dir, command, time.perf_counter() - t_start)
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


__all__ = [
    "CONFIG_NAME",
    "ROWS",
    "HotpotQASettings",
    "check_folder",
    "recipe",
    "run_hotpotqa_demo",
    "validate",
]
