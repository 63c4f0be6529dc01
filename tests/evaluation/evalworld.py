"""Helpers of the evaluation and report tests: a handmade world, and run folders written the way
the trainer and ``evaluate`` write them."""

from __future__ import annotations

import json
import math
from pathlib import Path

from searchr1.data.prompts import build_prompt, format_observation_docs, wrap_information
from searchr1.evaluation import TRAJECTORIES_FILE, aggregate
from searchr1.retrieval.base import Hit
from searchr1.rollout.records import trajectory_record
from searchr1.rollout.types import Role, Trajectory

WORLD = [
    # (id, title, text, question, answer, data_source)
    (
        "d0",
        "Alice Verdan",
        "Alice Verdan was born in Borvik in 1901. She founded the Quillon Press.",
        "Where was Alice Verdan born",
        "Borvik",
        "synth",
    ),
    (
        "d1",
        "Quillon Press",
        "The Quillon Press is a publisher based in Borvik, founded by Alice Verdan.",
        "Who founded the Quillon Press",
        "Alice Verdan",
        "synth",
    ),
    (
        "d2",
        "Ivo Marsk",
        "Ivo Marsk was born in Tarnholm in 1887. He was a painter.",
        "Where was Ivo Marsk born",
        "Tarnholm",
        "synth",
    ),
    (
        "d3",
        "Tarnholm",
        "Tarnholm is a city in Velmark on the northern coast.",
        "In which country is Tarnholm",
        "Velmark",
        "nq",
    ),
    (
        "d4",
        "Greta Holm",
        "Greta Holm was a composer born in Edrivik in 1920.",
        "What was the occupation of Greta Holm",
        "composer",
        "nq",
    ),
    (
        "d5",
        "Borvik",
        "Borvik is a city in Tarnland on the river Sel.",
        "On which river is Borvik",
        "Sel",
        "nq",
    ),
]


def write_world(folder: Path) -> dict[str, Path]:
    """A FlashRAG-style corpus and two dataset files (one per data source)."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": d, "contents": f'"{t}"\n{x}'}) + "\n" for d, t, x, *_ in WORLD)
    )
    files = {"corpus": corpus}
    for source in ("synth", "nq"):
        path = folder / f"{source}.jsonl"
        rows = [
            {"id": f"{source}_{i}", "question": q, "golden_answers": [a], "metadata": {"data_source": source}}
            for i, (_, _, _, q, a, s) in enumerate(WORLD)
            if s == source
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        files[source] = path
    return files


def scripted_trajectory(
    tokenizer, question: str, steps: list[tuple[str, str]], hits: list[list[Hit]]
) -> Trajectory:
    """A trajectory from role-tagged text pieces (what a model would have produced), tokenised piece by piece."""
    prompt_ids = tokenizer(build_prompt(question, "base", tokenizer), add_special_tokens=False)["input_ids"]
    traj = Trajectory(prompt_ids=prompt_ids)
    for role, text in steps:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        traj.response_ids += ids
        traj.roles += [int(Role.GENERATED if role == "gen" else Role.OBSERVATION)] * len(ids)
        traj.logprobs += [0.0] * len(ids)
        traj.turns += role == "gen"
    traj.queries = [q for r, t in steps if r == "gen" for q in _queries(t)]
    traj.searches = len(traj.queries)
    traj.documents = [[h.to_dict() for h in hs] for hs in hits]
    traj.finish_reason = "answer"
    return traj


def _queries(text: str) -> list[str]:
    out = []
    while "<search>" in text and "</search>" in text:
        a, b = text.index("<search>") + len("<search>"), text.index("</search>")
        out.append(text[a:b].strip())
        text = text[b + len("</search>") :]
    return out


def scripted_records(tokenizer, step: int) -> list[dict]:
    """Records of a validation pass where the model gets more right as training goes on: for sample i,
    ``i % 3`` searches, and a correct answer when ``(i + step) % 2 == 0``."""
    records = []
    for i, (doc_id, title, text, question, answer, source) in enumerate(WORLD):
        hit = Hit(doc_id, title, text, 1.5)
        n_search = i % 3
        steps: list[tuple[str, str]] = []
        for k in range(n_search):
            steps.append(
                ("gen", f"<think> I need to look up {title}. </think> <search> {title} {k} </search>")
            )
            steps.append(("obs", wrap_information(format_observation_docs([hit]))))
        said = answer if (i + step) % 2 == 0 else "Nowhere"
        steps.append(("gen", f"<think> The passage says it. </think> <answer> {said} </answer>"))
        traj = scripted_trajectory(tokenizer, question, steps, [[hit]] * n_search)
        sample = {
            "index": i,
            "id": f"{source}_{i}",
            "question": question,
            "golden_answers": [answer],
            "data_source": source,
        }
        records.append(trajectory_record(traj, sample, tokenizer, "agent"))
    return records


def write_eval_folder(folder: Path, records: list[dict], mode: str = "agent") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / TRAJECTORIES_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"mode": mode, "num_samples": len(records), **aggregate(records), "settings": {}}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def write_run_folder(folder: Path, tokenizer, steps: int = 12, val_every: int = 5) -> Path:
    """metrics.jsonl with the trainer's namespaced keys plus validation/step_N folders."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "metrics.jsonl", "w") as fh:
        for s in range(1, steps + 1):
            row = {
                "step": s,
                "reward/mean": 0.1 + 0.05 * s,
                "reward/exact_match": 0.08 + 0.05 * s,
                "reward/format": 0.5 + 0.02 * s,
                "rollout/searches": 0.5 + 0.1 * s,
                "rollout/response_length": 120 + 3 * s,
                "actor/kl": 0.001 * s,
                "actor/entropy": 2.0 - 0.05 * s,
                "actor/clipfrac": 0.02 + 0.001 * math.sin(s),
                "actor/grad_norm": "nan" if s == 3 else 1.0 / s,
                "timing/rollout": 1.2,
                "timing/search": 0.3,
                "timing/update": 0.8,
                "critic/vf_loss": 0.5 / s,
            }
            if s % val_every == 0:
                recs = scripted_records(tokenizer, s)
                agg = aggregate(recs)
                for src, r in agg["sources"].items():
                    row[f"val/{src}/em"] = r["em"]
                write_eval_folder(folder / "validation" / f"step_{s}", recs)
            fh.write(json.dumps(row) + "\n")
    return folder
