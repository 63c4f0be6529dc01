"""Run a model over question sets in one or several modes and write what it did, batch by batch.

    summary = evaluate(engine, samples, tokenizer=tok, mode="agent", out_dir="eval/agent")
    summary["sources"]["nq"]["em"]
    results = evaluate_modes(["direct", "rag", "agent"], engine_for, samples, tokenizer=tok, out_dir="eval/")

Per batch: build each question's prompt for the mode (``modes.mode_prompt``; rag first retrieves
for the question, with the rollout's timeout and retries), generate with a rollout engine (the
agent's, or ``SingleTurnEngine`` for the baselines), turn each trajectory into a scored record
(``searchr1.rollout.records.trajectory_record``) and append it to disk (``store``). The summary is
the per-source aggregate of the records (``aggregate``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1.data.prompts import resolve_template
from searchr1.evaluation import store
from searchr1.evaluation.aggregate import aggregate
from searchr1.evaluation.errors import EvaluationError
from searchr1.evaluation.modes import MODES, Mode, get_mode, mode_prompt, parse_modes, sample_view
from searchr1.evaluation.tables import TABLE_METRICS, format_paper_table, generated_by, paper_table
from searchr1.rollout.config import RolloutConfig
from searchr1.rollout.records import jsonable_hit, trajectory_record
from searchr1.rollout.search import SearchRunner

DEFAULT_REPLY_TOKENS = {"direct": 64, "rag": 64, "cot": 500}
"""Tokens a baseline's reply may take: a short answer, or reasoning then an answer (one agent turn)."""


@dataclass
class BatchProgress:
    """What ``on_batch`` receives after each batch is on disk."""

    batch: int
    done: int
    total: int
    records: list[dict[str, Any]]
    mode: str = ""


def _single_turn_engine(engine: Any, tokenizer: Any, max_new_tokens: int) -> tuple[Any, bool]:
    """The engine of a baseline: ``engine`` if it is single-turn, else a ``SingleTurnEngine`` on its
    model, with its rollout settings (the generation dtype among them), built here, so closed here: the
    second value."""
    from searchr1.rollout.single_turn import SingleTurnEngine  # torch: only when generating

    if isinstance(engine, SingleTurnEngine):
        return engine, False
    model = getattr(engine, "model", engine)
    config = getattr(engine, "config", None)
    config = config if isinstance(config, RolloutConfig) else None
    return SingleTurnEngine(model, tokenizer, max_new_tokens=max_new_tokens, config=config), True


def _greedy() -> Any:
    from searchr1.rollout.sampling import SamplingParams  # torch: only when generating

    return SamplingParams.greedy_eval()


def _retrieve(
    retriever: Any, questions: list[str], topk: int, timeout_s: float, retries: int
) -> tuple[list[list[Any]], str | None]:
    """rag's one search per question (as one batched call), with the rollout's timeout and retries;
    ``(hits per question, None)`` or ``(empty lists, the error)`` when it failed for good."""
    runner = SearchRunner(retriever, topk=topk, timeout_s=timeout_s, retries=retries, workers=1)
    try:
        job = runner.submit(questions, owners=list(range(len(questions))))
        job.wait()
    finally:
        runner.close()
    if job.result is None:
        return [[] for _ in questions], job.error or "search failed"
    return job.result, None


def evaluate(
    engine: Any,
    samples: Sequence[Any],
    *,
    tokenizer: Any,
    mode: str | Mode = "agent",
    retriever: Any = None,
    batch_size: int = 16,
    out_dir: str | Path | None = None,
    resume: bool = True,
    template: str = "auto",
    topk: int = 3,
    seed: int = 0,
    sampling: Any = None,
    settings: dict[str, Any] | None = None,
    on_batch: Callable[[BatchProgress], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_tokens: Callable[[Sequence[Any]], None] | None = None,
    normalization: str = "squad",
    max_new_tokens: int | None = None,
    search_timeout_s: float = 30.0,
    search_retries: int = 2,
) -> dict[str, Any]:
    """Evaluate ``samples`` in ``mode`` in batches and return the summary (also written to ``out_dir``).

    ``engine``: a rollout engine (``generate(prompt_ids, metas, sampling=..., seed=...)``); the
    baselines (direct, cot, rag) run a ``SingleTurnEngine`` — ``engine`` itself if it is one, else one
    on its model with ``max_new_tokens`` (default ``DEFAULT_REPLY_TOKENS``). ``sampling``: default
    greedy. ``retriever``: rag's search backend (``topk`` hits, ``search_timeout_s`` and
    ``search_retries`` as in the rollout). ``normalization``: of EM / subEM / F1 (``squad``, the
    paper's; or ``unicode``). ``settings``: what else identifies the run (model, data files): with
    ``resume`` a rerun into the same ``out_dir`` must match them and the samples, keeps the records
    written and generates the missing ones and those whose searches failed. ``on_start(done,
    total)`` and ``on_batch`` (after each batch is on disk) show progress; tests interrupt from them;
    ``on_tokens`` is the engine's token listener while a batch decodes (``RolloutEngine.generate``).
    """
    mode = get_mode(mode) if isinstance(mode, str) else mode
    template = resolve_template(template, tokenizer)
    if mode.search == "once" and retriever is None:
        raise EvaluationError(f"mode {mode.name!r} needs a retriever (an index, a search URL or a corpus)")
    if batch_size < 1:
        raise EvaluationError(f"batch_size must be >= 1, got {batch_size}")
    views = [sample_view(s, i) for i, s in enumerate(samples)]
    out = Path(out_dir) if out_dir is not None else None
    own_engine = False
    if mode.search != "agent":
        reply_tokens = max_new_tokens or DEFAULT_REPLY_TOKENS.get(mode.name, 256)
        engine, own_engine = _single_turn_engine(engine, tokenizer, reply_tokens)
    try:
        records, retried = _evaluate_pending(
            engine, samples, views, mode, tokenizer=tokenizer, retriever=retriever, batch_size=batch_size,
            out=out, resume=resume, template=template, topk=topk,
            seed=seed, sampling=sampling if sampling is not None else _greedy(), settings=settings,
            on_batch=on_batch, on_start=on_start, on_tokens=on_tokens, normalization=normalization,
            search_timeout_s=search_timeout_s, search_retries=search_retries,
        )  # fmt: skip
    finally:
        if own_engine:
            engine.close()

    ordered = [records[i] for i in sorted(records)]
    summary = {
        "mode": mode.name,
        "label": mode.label,
        "num_samples": len(ordered),
        "normalization": normalization,
        **aggregate(ordered),
        "settings": dict(settings or {}),
    }
    if out is not None:
        if retried:
            store.rewrite_records(out, ordered)
        store.write_json_atomic(out / store.SUMMARY_FILE, summary)
    return summary


def run_state(
    mode: Mode,
    views: Sequence[dict[str, Any]],
    *,
    template: str,
    topk: int,
    normalization: str,
    reply_tokens: int | None,
    settings: dict[str, Any] | None,
) -> dict[str, Any]:
    """What identifies a run of ``mode`` (``eval_state.json``): a resumed run must match it."""
    return {
        "mode": mode.name,
        "template": template,
        "topk": topk,
        "normalization": normalization,
        "num_samples": len(views),
        "samples_sha256": store.samples_fingerprint(views),
        **({"reply_tokens": reply_tokens} if mode.search != "agent" else {}),
        **(settings or {}),
    }


def _evaluate_pending(
    engine: Any,
    samples: Sequence[Any],
    views: list[dict[str, Any]],
    mode: Mode,
    *,
    out: Path | None,
    resume: bool,
    settings: dict[str, Any] | None,
    batch_size: int,
    on_batch: Callable[[BatchProgress], None] | None,
    on_start: Callable[[int, int], None] | None,
    **batch_kwargs: Any,
) -> tuple[dict[int, dict[str, Any]], bool]:
    """Open (or resume) the run's folder, generate the questions not yet done, batch by batch;
    returns the records by sample index and whether a question was retried."""
    done: dict[int, dict[str, Any]] = {}
    if out is not None:
        state = run_state(
            mode,
            views,
            template=batch_kwargs["template"],
            topk=batch_kwargs["topk"],
            normalization=batch_kwargs["normalization"],
            reply_tokens=getattr(engine, "max_new_tokens", None),
            settings=settings,
        )
        done = store.open_run(out, state, resume)
    pending = [v for v in views if v["index"] not in done or done[v["index"]].get("search_failures", 0)]
    if on_start is not None:
        on_start(len(views) - len(pending), len(views))
    records = dict(done)
    for b, start in enumerate(range(0, len(pending), batch_size)):
        new = _run_batch(engine, samples, pending[start : start + batch_size], mode, **batch_kwargs)
        if out is not None:
            store.append_records(out, new)
        records.update((rec["index"], rec) for rec in new)
        if on_batch is not None:
            on_batch(BatchProgress(b, len(records), len(views), new, mode.name))
    return records, any(v["index"] in done for v in pending)


def _run_batch(
    engine: Any,
    samples: Sequence[Any],
    batch: list[dict[str, Any]],
    mode: Mode,
    *,
    tokenizer: Any,
    retriever: Any,
    template: str,
    topk: int,
    seed: int,
    sampling: Any,
    normalization: str,
    search_timeout_s: float,
    search_retries: int,
    on_tokens: Callable[[Sequence[Any]], None] | None,
) -> list[dict[str, Any]]:
    """Prompts, generation and scored records of one batch of questions."""
    hits: list[list[Any]] = [[] for _ in batch]
    error = None
    if mode.search == "once":
        questions = [v["question"] for v in batch]
        hits, error = _retrieve(retriever, questions, topk, search_timeout_s, search_retries)
    prompts = [
        mode_prompt(mode, samples[v["index"]], template=template, tokenizer=tokenizer, hits=h)
        for v, h in zip(batch, hits, strict=True)
    ]
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    trajs = engine.generate(
        prompt_ids, [dict(v) for v in batch], sampling=sampling, seed=seed, on_tokens=on_tokens
    )
    if mode.search == "once":  # the one retrieval is part of the record (a search the model did not choose)
        for t, v, h in zip(trajs, batch, hits, strict=True):
            t.queries, t.documents, t.searches = [v["question"]], [[jsonable_hit(x) for x in h]], 1
            if error is not None:
                t.search_failures = 1
                t.meta.setdefault("search_errors", []).append(error)
    return [
        trajectory_record(
            t, v, tokenizer, mode.name, reply_fallback=mode.reply_fallback, normalization=normalization
        )
        for t, v in zip(trajs, batch, strict=True)
    ]


def evaluate_modes(
    modes: str | Sequence[str],
    engine_for: Callable[[Mode], Any],
    samples: Sequence[Any],
    *,
    tokenizer: Any,
    out_dir: str | Path,
    settings: dict[str, Any] | None = None,
    on_start: Callable[[Mode, int, int], None] | None = None,
    on_batch: Callable[[BatchProgress], None] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Evaluate several modes into ``out_dir/<mode>/`` and write ``results.json`` and ``table.md``.

    ``engine_for(mode)`` gives the engine of a mode (it is closed after the mode); ``kwargs`` go to
    ``evaluate``. Returns ``results``: the summaries by mode (every complete mode in ``out_dir`` that
    evaluated the same questions with the same model, this run's and earlier ones') and the tables.
    """
    chosen = parse_modes(modes)
    out = Path(out_dir)
    summaries: dict[str, dict[str, Any]] = {}
    for mode in chosen:
        engine = engine_for(mode)
        try:
            summaries[mode.name] = evaluate(
                engine,
                samples,
                tokenizer=tokenizer,
                mode=mode,
                out_dir=out / mode.name,
                settings=settings,
                on_start=(lambda done, total, m=mode: on_start(m, done, total)) if on_start else None,
                on_batch=on_batch,
                **kwargs,
            )
        finally:
            if hasattr(engine, "close"):
                engine.close()
    return write_results(out, summaries, settings or {})


def write_results(
    out: Path, summaries: dict[str, dict[str, Any]], settings: dict[str, Any]
) -> dict[str, Any]:
    """``results.json`` and ``table.md`` of ``out``: ``summaries`` plus the complete modes an earlier
    run left in ``out`` for the same questions, model and settings."""
    merged = dict(summaries)
    reference = next(iter(summaries.values()), None)
    for name, summary in store.mode_summaries(out).items():
        if name in merged or name not in MODES or reference is None:
            continue
        same_run = all(summary.get(k) == reference.get(k) for k in ("settings", "normalization"))
        if same_run and _same_questions(out, name, reference):
            merged[name] = summary
    results = {
        "modes": [m for m in MODES if m in merged],
        "settings": settings,
        "summaries": {m: merged[m] for m in MODES if m in merged},
        "tables": {metric: _table_json(paper_table(merged, metric)) for metric in TABLE_METRICS},
    }
    store.write_json_atomic(out / store.RESULTS_FILE, results)
    head = generated_by(settings)
    table = format_paper_table(paper_table(merged, "em"), markdown=True)
    (out / store.TABLE_FILE).write_text(f"{head}\n\n{table}" if head else table)
    return results


def _same_questions(out: Path, mode: str, reference: dict[str, Any]) -> bool:
    """Whether ``out/<mode>`` evaluated the same questions as the reference summary's run."""
    try:
        state = json.loads((out / mode / store.STATE_FILE).read_text(encoding="utf-8"))
        ref_mode = reference["mode"]
        ref = json.loads((out / ref_mode / store.STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError):
        return False
    return state.get("samples_sha256") == ref.get("samples_sha256")


def _table_json(table: Any) -> dict[str, Any]:
    return {
        "metric": table.metric,
        "columns": table.columns,
        "rows": [
            {"method": label, "mode": mode, "values": values, "search_failures": failures}
            for label, mode, values, failures in zip(
                table.labels, table.modes, table.values, table.failures, strict=True
            )
        ],
        "questions": table.counts,
    }
