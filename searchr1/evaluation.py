"""Evaluation: run a model over question sets and score it per data source.

Three modes give the paper's comparison rows with the same model and data (Search-R1, Jin et al.
2025, Table 2):

* ``agent``  the Search-R1 loop: reason, ``<search>`` as often as needed, ``<answer>``;
* ``direct`` answer from the model's own knowledge, without any search;
* ``rag``    retrieve the top-k passages for the question once, put them in the prompt, answer.

Per data source the summary gives exact match (EM), substring EM (the golden answer appears in the
predicted one), token F1, average searches and turns, the valid-format rate and the truncation rate.
Every trajectory is written to ``trajectories.jsonl`` (question, golden answers, the whole
trajectory as role-tagged segments, queries, retrieved documents, answer, scores) one batch at a
time, so that an interrupted run keeps its partial results and a rerun continues where it stopped.

    summary = evaluate(engine, samples, tokenizer=tok, mode="agent", batch_size=16, out_dir="eval/")
    summary["sources"]["nq"]["em"]
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1.data.prompts import ANSWER_CLOSE, format_observation_docs
from searchr1.rollout.types import Role, Trajectory

MODES = ("agent", "direct", "rag")
SUMMARY_FILE = "summary.json"
TRAJECTORIES_FILE = "trajectories.jsonl"
STATE_FILE = "eval_state.json"
ROLE_NAMES = {Role.PROMPT: "prompt", Role.GENERATED: "generated", Role.OBSERVATION: "observation"}
METRICS = ("em", "sub_em", "f1", "searches", "turns", "valid_format", "truncated")
"""Per-source averages in the summary, in table order."""

# The baselines' instructions, worded like the Search-R1 instruction minus the search part.
DIRECT_INSTRUCTION = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first. "
    "Then provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)
RAG_INSTRUCTION = (
    "Answer the given question using the documents below. "
    "You must conduct reasoning inside <think> and </think> first. "
    "Then provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>.\n"
    "Documents:\n{documents}"
    "Question: {question}\n"
)


class EvaluationError(ValueError):
    """Evaluation cannot run or continue as asked; the message names the file or setting."""


# ---------------------------------------------------------------------------------------------
# adapters to the data and reward packages (one place to change if their names move)
# ---------------------------------------------------------------------------------------------


def _sample_field(sample: Any, name: str, default: Any = None) -> Any:
    if isinstance(sample, dict):
        return sample.get(name, default)
    return getattr(sample, name, default)


def sample_view(sample: Any, index: int) -> dict[str, Any]:
    """The fields evaluation reads from a ``Sample`` (or a FlashRAG-style dict)."""
    golden = _sample_field(sample, "golden_answers") or []
    if isinstance(golden, str):
        golden = [golden]
    metadata = _sample_field(sample, "metadata") or {}
    source = _sample_field(sample, "data_source") or (metadata.get("data_source") if metadata else None)
    sid = _sample_field(sample, "id")
    return {
        "index": index,
        "id": str(sid) if sid is not None else str(index),
        "question": str(_sample_field(sample, "question", "")),
        "golden_answers": [str(g) for g in golden],
        "data_source": str(source or "unknown"),
    }


def score_answer(answer: str | None, golden_answers: Sequence[str]) -> dict[str, float]:
    """EM, substring EM and token F1 of one predicted answer against its golden answers (best over them)."""
    from searchr1.rewards.text import exact_match, f1_score, sub_exact_match

    return {
        "em": float(exact_match(answer, golden_answers)),
        "sub_em": float(sub_exact_match(answer, golden_answers)),
        "f1": float(f1_score(answer, golden_answers)),
    }


def extract_answer(response: str) -> str | None:
    """The last closed ``<answer>`` of the response, ``<information>`` blocks ignored."""
    from searchr1.rewards.text import extract_answer as _extract

    return _extract(response)


def is_valid_format(response: str) -> bool:
    """The reward package's Search-R1 structure check (think, then searches, then one answer).

    The direct and rag instructions ask for ``<think>`` then ``<answer>``, which the same check accepts.
    """
    from searchr1.rewards.format import is_valid_format as _valid

    return bool(_valid(response))


# ---------------------------------------------------------------------------------------------
# prompts of each mode
# ---------------------------------------------------------------------------------------------


def _render(text: str, template: str, tokenizer: Any) -> str:
    from searchr1.data.prompts import render_messages

    return render_messages([{"role": "user", "content": text}], template, tokenizer)


def build_mode_prompt(
    question: str, mode: str, *, template: str, tokenizer: Any, hits: list | None = None
) -> str:
    """The prompt text of ``mode``: the Search-R1 prompt (agent) or a baseline instruction."""
    from searchr1.data.prompts import build_prompt, is_chat_template, normalize_question

    if mode == "agent":
        return build_prompt(question, template, tokenizer)
    base_template = "instruct" if is_chat_template(template) else "base"
    q = normalize_question(question)
    if mode == "direct":
        return _render(DIRECT_INSTRUCTION.replace("{question}", q), base_template, tokenizer)
    if mode == "rag":
        docs = format_observation_docs(hits or [])
        text = RAG_INSTRUCTION.replace("{documents}", docs).replace("{question}", q)
        return _render(text, base_template, tokenizer)
    raise EvaluationError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


def agent_prompt(sample: Any, template: str, tokenizer: Any) -> str:
    """The Search-R1 prompt of a sample: its stored chat messages (parquet rows) or the template's."""
    if hasattr(sample, "prompt"):
        return sample.prompt(template, tokenizer)
    return build_mode_prompt(
        str(_sample_field(sample, "question", "")), "agent", template=template, tokenizer=tokenizer
    )


# ---------------------------------------------------------------------------------------------
# single-turn generation (the direct and rag baselines)
# ---------------------------------------------------------------------------------------------


class SingleTurnEngine:
    """Greedy one-turn generation that stops at ``</answer>`` or EOS: the no-search baselines.

    Produces the same ``Trajectory`` type as the rollout engine (prompt / generated roles, one turn,
    no searches), so scoring, files and the report treat every mode alike.
    """

    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int = 256):
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens

    def generate(
        self, prompt_ids: list[list[int]], metas: list[dict[str, Any]], **_: Any
    ) -> list[Trajectory]:
        import torch

        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        width = max(len(p) for p in prompt_ids)
        ids = torch.full((len(prompt_ids), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompt_ids):  # left padding: every row ends where generation starts
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        device = next(self.model.parameters()).device
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                stop_strings=[ANSWER_CLOSE],
                tokenizer=tok,
                pad_token_id=pad,
                eos_token_id=tok.eos_token_id,
            )
        trajectories = []
        for i, p in enumerate(prompt_ids):
            new = out[i, width:].tolist()
            response, finish = self._cut(new)
            text = tok.decode([t for t in response if t != tok.eos_token_id], skip_special_tokens=False)
            trajectories.append(
                Trajectory(
                    prompt_ids=list(p),
                    response_ids=response,
                    roles=[int(Role.GENERATED)] * len(response),
                    logprobs=[0.0] * len(response),
                    turns=1,
                    truncated=finish == "length",
                    finish_reason=finish,
                    response_text=text,
                    meta=dict(metas[i]),
                )
            )
        return trajectories

    def _cut(self, new: list[int]) -> tuple[list[int], str]:
        """The response up to the first EOS (kept) or the token that closes ``</answer>``."""
        tok = self.tokenizer
        eos = tok.eos_token_id
        end = new.index(eos) + 1 if eos in new else len(new)
        text = tok.decode(new[:end], skip_special_tokens=False)
        pos = text.find(ANSWER_CLOSE)
        if pos >= 0:
            need = pos + len(ANSWER_CLOSE)
            lo, hi = 1, end  # the shortest prefix whose text holds the closing tag
            while lo < hi:
                mid = (lo + hi) // 2
                if len(tok.decode(new[:mid], skip_special_tokens=False)) >= need:
                    hi = mid
                else:
                    lo = mid + 1
            return new[:lo], "answer"
        if eos in new:
            return new[:end], "eos"
        return new, "length"


def single_turn_engine(engine: Any, tokenizer: Any) -> Any:
    """The engine to use for direct / rag: ``engine`` itself if it is single-turn, else one on its model."""
    if isinstance(engine, SingleTurnEngine):
        return engine
    model = getattr(engine, "model", engine)
    cfg = getattr(engine, "config", None)
    max_new = getattr(cfg, "max_turn_tokens", 256) if cfg is not None else 256
    return SingleTurnEngine(model, tokenizer, max_new_tokens=max_new)


def greedy_sampling() -> Any:
    """The rollout package's greedy evaluation sampling (``SamplingParams.greedy_eval()``)."""
    from searchr1.rollout.sampling import SamplingParams

    return SamplingParams.greedy_eval()


# ---------------------------------------------------------------------------------------------
# one record per trajectory
# ---------------------------------------------------------------------------------------------


def role_segments(traj: Trajectory, decode: Callable[[list[int]], str]) -> list[dict[str, Any]]:
    """The whole trajectory as runs of same-role tokens: ``[{"role", "text", "tokens"}, ...]``."""
    segments = [{"role": "prompt", "text": decode(traj.prompt_ids), "tokens": len(traj.prompt_ids)}]
    run: list[int] = []
    run_role: int | None = None
    for tid, role in zip(traj.response_ids, traj.roles, strict=True):
        if role != run_role and run:
            segments.append({"role": ROLE_NAMES[Role(run_role)], "text": decode(run), "tokens": len(run)})
            run = []
        run_role = role
        run.append(tid)
    if run:
        segments.append({"role": ROLE_NAMES[Role(run_role)], "text": decode(run), "tokens": len(run)})
    return segments


def trajectory_record(traj: Trajectory, sample: dict[str, Any], tokenizer: Any, mode: str) -> dict[str, Any]:
    """The JSON line written for one evaluated sample (scores included)."""

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    response = decode(traj.response_ids)
    answer = extract_answer(response)
    scores = score_answer(answer, sample["golden_answers"])
    scores["valid_format"] = float(is_valid_format(response))
    return {
        **sample,
        "mode": mode,
        "answer": answer,
        "scores": scores,
        "correct": scores["em"] == 1.0,
        "searches": traj.searches,
        "turns": traj.turns,
        "truncated": bool(traj.truncated),
        "finish_reason": traj.finish_reason,
        "invalid_actions": traj.invalid_actions,
        "search_failures": traj.search_failures,
        "queries": list(traj.queries),
        "documents": [[_jsonable_hit(h) for h in hits] for hits in traj.documents],
        "num_tokens": {
            "prompt": len(traj.prompt_ids),
            "response": len(traj.response_ids),
            "generated": traj.num_generated,
        },
        "segments": role_segments(traj, decode),
    }


def _jsonable_hit(hit: Any) -> dict[str, Any]:
    if isinstance(hit, dict):
        return hit
    if hasattr(hit, "to_dict"):
        return hit.to_dict()
    return {
        "id": getattr(hit, "id", ""),
        "title": getattr(hit, "title", ""),
        "text": getattr(hit, "text", ""),
        "score": getattr(hit, "score", 0.0),
    }


# ---------------------------------------------------------------------------------------------
# aggregation
# ---------------------------------------------------------------------------------------------


def _record_values(rec: dict[str, Any]) -> dict[str, float]:
    s = rec["scores"]
    return {
        "em": s["em"],
        "sub_em": s["sub_em"],
        "f1": s["f1"],
        "searches": float(rec["searches"]),
        "turns": float(rec["turns"]),
        "valid_format": s["valid_format"],
        "truncated": float(rec["truncated"]),
    }


def aggregate(
    records: Iterable[dict[str, Any]], group: Callable[[dict[str, Any]], str] | None = None
) -> dict[str, Any]:
    """Per-source and overall means of ``METRICS`` (overall = over all samples, not over sources);
    ``group`` names another grouping of the records than their ``data_source``."""
    groups: dict[str, list[dict[str, float]]] = {}
    everything: list[dict[str, float]] = []
    for rec in records:
        values = _record_values(rec)
        groups.setdefault(rec["data_source"] if group is None else group(rec), []).append(values)
        everything.append(values)

    def mean(rows: list[dict[str, float]]) -> dict[str, float]:
        out: dict[str, float] = {"n": len(rows)}
        for m in METRICS:
            out[m] = sum(r[m] for r in rows) / len(rows) if rows else math.nan
        return out

    return {"sources": {k: mean(v) for k, v in sorted(groups.items())}, "overall": mean(everything)}


def flatten_summary(summary: dict[str, Any], prefix: str = "val") -> dict[str, float]:
    """``{"val/nq/em": 0.41, ..., "val/all/em": 0.38}``: the summary as namespaced metrics."""
    flat = {}
    for source, row in summary["sources"].items():
        for m in METRICS:
            flat[f"{prefix}/{source}/{m}"] = row[m]
    for m in METRICS:
        flat[f"{prefix}/all/{m}"] = summary["overall"][m]
    return flat


def format_table(summary: dict[str, Any]) -> str:
    """The summary as an aligned text table (one row per source, then ``all``)."""
    head = ["source", "n", "EM", "subEM", "F1", "searches", "turns", "valid", "trunc"]
    rows = [[src, str(r["n"])] + [f"{r[m]:.3f}" for m in METRICS] for src, r in summary["sources"].items()]
    o = summary["overall"]
    rows.append(["all", str(o["n"])] + [f"{o[m]:.3f}" if o["n"] else "-" for m in METRICS])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = [
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths, strict=True))
        )
    ]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# files: append per batch, resume after an interruption
# ---------------------------------------------------------------------------------------------


def read_trajectories(path: str | Path, repair: bool = False) -> list[dict[str, Any]]:
    """Records of a ``trajectories.jsonl``. A truncated last line (an interrupted write) is ignored,
    and with ``repair`` cut from the file; a malformed line elsewhere raises naming file and line."""
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if repair and end < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(end)
    records = []
    for lineno, line in enumerate(data[:end].splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise EvaluationError(f"{path}:{lineno}: not a JSON record ({exc.msg})") from exc
    return records


def _fingerprint(samples: list[dict[str, Any]]) -> str:
    h = hashlib.sha256()
    for s in samples:
        h.update(json.dumps([s["id"], s["question"], s["data_source"]]).encode())
    return h.hexdigest()[:16]


def _check_or_write_state(out: Path, state: dict[str, Any], resume: bool) -> None:
    path = out / STATE_FILE
    if resume and path.is_file():
        old = json.loads(path.read_text())
        for key, value in state.items():
            if old.get(key) != value:
                raise EvaluationError(
                    f"{out} holds a run with a different {key} ({old.get(key)!r}, now {value!r}); "
                    "use another output folder or turn resuming off (--no-resume) to overwrite it"
                )
        return
    for name in (TRAJECTORIES_FILE, SUMMARY_FILE):
        (out / name).unlink(missing_ok=True)
    path.write_text(json.dumps(state, indent=2) + "\n")


@dataclass
class BatchProgress:
    """What ``on_batch`` receives after each batch is on disk."""

    batch: int
    done: int
    total: int
    records: list[dict[str, Any]]


def evaluate(
    engine: Any,
    samples: Sequence[Any],
    *,
    tokenizer: Any,
    mode: str = "agent",
    retriever: Any = None,
    batch_size: int = 16,
    out_dir: str | Path | None = None,
    resume: bool = True,
    template: str = "base",
    topk: int = 3,
    seed: int = 0,
    sampling: Any = None,
    settings: dict[str, Any] | None = None,
    on_batch: Callable[[BatchProgress], None] | None = None,
) -> dict[str, Any]:
    """Evaluate ``samples`` greedily in batches and return the summary (also written to ``out_dir``).

    ``engine``: a rollout engine (``generate(prompt_ids, metas, sampling=..., seed=...)``) for agent
    mode; for direct / rag its model is used through ``SingleTurnEngine``. ``sampling``: the agent's
    ``SamplingParams`` (default: greedy). ``retriever``: needed by
    rag (one search per question, ``topk`` hits). ``settings``: what else identifies the run (model,
    data files); with ``resume`` a rerun into the same ``out_dir`` must match them and the samples,
    skips the samples already written and continues. ``on_batch`` is called after each batch is
    written (progress display; tests interrupt a run from it).
    """
    if mode not in MODES:
        raise EvaluationError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "rag" and retriever is None:
        raise EvaluationError("mode 'rag' needs a retriever (an index or a search URL)")
    if batch_size < 1:
        raise EvaluationError(f"batch_size must be >= 1, got {batch_size}")
    views = [sample_view(s, i) for i, s in enumerate(samples)]

    out = Path(out_dir) if out_dir is not None else None
    done: dict[int, dict[str, Any]] = {}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        state = {
            "mode": mode,
            "template": template,
            "topk": topk,
            "num_samples": len(views),
            "samples_sha256": _fingerprint(views),
            **(settings or {}),
        }
        _check_or_write_state(out, state, resume)
        for rec in read_trajectories(out / TRAJECTORIES_FILE, repair=True):
            done[int(rec["index"])] = rec
    pending = [v for v in views if v["index"] not in done]

    gen = engine if mode == "agent" else single_turn_engine(engine, tokenizer)
    if mode == "agent" and sampling is None:
        sampling = greedy_sampling()
    records = dict(done)
    for b, start in enumerate(range(0, len(pending), batch_size)):
        batch = pending[start : start + batch_size]
        hits_per_q: list[list[Any]] = [[] for _ in batch]
        if mode == "rag":
            hits_per_q = retriever.search([v["question"] for v in batch], topk)
        prompts = [
            agent_prompt(samples[v["index"]], template, tokenizer)
            if mode == "agent"
            else build_mode_prompt(v["question"], mode, template=template, tokenizer=tokenizer, hits=h)
            for v, h in zip(batch, hits_per_q, strict=True)
        ]
        prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        metas = [dict(v) for v in batch]
        trajs = gen.generate(prompt_ids, metas, sampling=sampling, seed=seed)
        if mode == "rag":  # the one retrieval is part of the record (as a search the model did not choose)
            for t, v, h in zip(trajs, batch, hits_per_q, strict=True):
                t.queries, t.documents, t.searches = [v["question"]], [[_jsonable_hit(x) for x in h]], 1
        new = [trajectory_record(t, v, tokenizer, mode) for t, v in zip(trajs, batch, strict=True)]
        if out is not None:
            with open(out / TRAJECTORIES_FILE, "a", encoding="utf-8") as fh:
                for rec in new:
                    fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        for rec in new:
            records[rec["index"]] = rec
        if on_batch is not None:
            on_batch(BatchProgress(batch=b, done=len(records), total=len(views), records=new))

    ordered = [records[i] for i in sorted(records)]
    summary = {
        "mode": mode,
        "num_samples": len(ordered),
        **aggregate(ordered),
        "settings": dict(settings or {}),
    }
    if out is not None:
        (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary
