"""What the demo evaluates "after" RL is the policy the run keeps (``<run>/checkpoints/best/model``): after a
warm start and RL that made no update, its answers are those of that folder evaluated alone, not the starting
model's (issue 54: the "after" row once printed the "before" row's numbers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from searchr1.cli import main

NO_UPDATE = [
    "reward.components={exact_match: 0.0}", "reward.step_gain=0.0", "reward.step_redundancy=0.0",
    "reward.step_superfluous=0.0", "replay.enabled=false", "guidance.off_policy=0", "guidance.branched=0",
    "guidance.decision_groups=0",
]  # fmt: skip
"""Every trajectory scores 0, no step reward, nothing guided or replayed: every group's rewards are equal, so
RL makes no update."""
WARM_START = [
    "warmstart.epochs=1", "warmstart.max_examples=8", "warmstart.batch_size=4", "warmstart.micro_batch_size=4",
    "warmstart.lr=0.05", "warmstart.warmup_steps=0",
]  # fmt: skip
"""Two optimizer steps at a high rate: enough to change the tiny model's greedy answers."""
TINY = [
    "--seeds", "3", "--num-test", "4", "--template", "base", "--no-zero-shot", "--nq-sample", "",
    "--hotpotqa-sample", "", "--threads", "1", "--only", "search", "--steps", "1", "trainer.batch_size=2",
    "trainer.mini_batch_size=2", "rollout.n=2", "rollout.max_turn_tokens=16", "trainer.progress_bar=false",
]  # fmt: skip


def records(path: Path) -> dict[str, dict[str, Any]]:
    """An evaluation's trajectory records by question id."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {r["id"]: r for r in rows}


def answers(path: Path) -> dict[str, tuple[Any, ...]]:
    """What each question got: the response's text segments, the searches' queries and the scores."""
    return {
        qid: (json.dumps(r.get("segments"), sort_keys=True), json.dumps(r.get("queries")), r["scores"]["em"])
        for qid, r in records(path).items()
    }


def evaluate_folder(folder: Path, run: Path, demo: Path, out: Path) -> Path:
    """The saved policy ``folder`` evaluated alone, as the demo evaluates (greedy, the run's settings, its
    prompt, BM25 over the seed's world); returns its trajectories file."""
    from searchr1.config import load_config
    from searchr1.evaluation import evaluate
    from searchr1.models import load_model, load_tokenizer
    from searchr1.retrieval.bm25 import BM25Retriever
    from searchr1.retrieval.corpus import read_corpus
    from searchr1.rollout.registry import build_engine

    cfg = load_config(run / "config.yaml", [])
    world = demo / "seed_3" / "world"
    samples = [json.loads(x) for x in (world / "test.jsonl").read_text().splitlines() if x.strip()][:4]
    retriever = BM25Retriever.from_documents(list(read_corpus(world / "corpus.jsonl")))
    model, tokenizer = load_model(folder), load_tokenizer(folder)
    model.eval()
    with build_engine(cfg, model, tokenizer, retriever) as engine:
        evaluate(
            engine, samples, tokenizer=tokenizer, mode="agent", batch_size=64, out_dir=out, resume=False,
            template=str(demo / "prompt.json"), topk=cfg.retrieval.topk, seed=3,
        )  # fmt: skip
    return out / "trajectories.jsonl"


def test_after_a_warm_start_and_no_update_the_after_row_is_the_kept_policy(
    tmp_path, tiny_model_dir, one_thread
):
    demo = tmp_path / "demo"
    argv = ["demo", "--out", str(demo), "--model", str(tiny_model_dir), *TINY, *WARM_START, *NO_UPDATE]
    assert main(argv) == 0
    run = demo / "seed_3" / "search"
    row = json.loads((demo / "summary.json").read_text())["seeds"]["3"]["runs"]["search"]
    assert row["updates"] == 0 and row["best"]["step"] == 0  # RL changed nothing; its step 0 is kept
    before, warm, after = (
        answers(run / f"eval_{w}" / "trajectories.jsonl") for w in ("before", "warm", "after")
    )
    # the warm start changed the answers: the starting model's are not the kept policy's
    assert before != warm

    alone = answers(evaluate_folder(run / "checkpoints" / "best" / "model", run, demo, tmp_path / "alone"))
    assert after == alone == warm
    assert row["after"] == row["warm"] and row["after"]["em"] == pytest.approx(
        sum(a[2] for a in alone.values()) / len(alone)
    )
    probe = json.loads((run / "probe.json").read_text())  # the probe read the same policy
    assert probe["after"] == probe["warm"] and probe["after"] != probe["before"]


def write_world(folder: Path) -> dict[str, Path]:
    """A corpus of three passages, four questions about them and a one-line prompt template."""
    folder.mkdir(parents=True)
    passages = [("Alice Verdan", "Alice Verdan was born in Borvik."), ("Borvik", "Borvik is a city on the Ost."),
                ("Mira Lund", "Mira Lund wrote The Glass Field.")]  # fmt: skip
    questions = [("where was Alice Verdan born", "Borvik"), ("what did Mira Lund write", "The Glass Field"),
                 ("which river flows through Borvik", "Ost"), ("who was born in Borvik", "Alice Verdan")]  # fmt: skip
    files = {
        "corpus": folder / "corpus.jsonl",
        "questions": folder / "questions.jsonl",
        "template": folder / "t.txt",
    }
    files["corpus"].write_text("".join(
        json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n" for i, (t, x) in enumerate(passages)
    ))  # fmt: skip
    files["questions"].write_text("".join(
        json.dumps({"id": f"q{i}", "question": q, "golden_answers": [a], "metadata": {"data_source": "tiny"}}) + "\n"
        for i, (q, a) in enumerate(questions)
    ))  # fmt: skip
    files["template"].write_text("Question: {question}\n")
    return files


class CopyServingEngine:
    """Like the vLLM engine: generates with its own copy of ``model.path``'s weights, which only
    ``update_weights`` (a state dict) changes; the policy object it is given is not what it runs."""

    weight_format = "state_dict"

    def __init__(
        self, build: Any, cfg: Any, policy: Any, tokenizer: Any, retriever: Any, **kwargs: Any
    ) -> None:
        from searchr1.models import load_model

        self.copy = load_model(cfg.model.path)
        self.copy.eval()
        self.inner = build(cfg, self.copy, tokenizer, retriever, **kwargs)

    def update_weights(self, weights: Any) -> None:
        self.copy.load_state_dict(dict(weights.state_dict))

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.generate(*args, **kwargs)

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> CopyServingEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def test_the_real_data_rows_evaluate_the_trained_weights_on_an_engine_that_serves_a_copy(
    tmp_path, tiny_model_dir, monkeypatch, one_thread
):
    """``_evaluate_real`` builds an engine of its own; one that serves a copy of ``model.path`` (vLLM) must be
    handed the policy's weights: its answers are those of the policy (moved away from the saved model), not
    the saved model's."""
    from types import SimpleNamespace

    import torch
    from tinyrun import run_overrides

    import searchr1.rollout.registry as registry
    from searchr1.config import load_config
    from searchr1.demo.runs import _evaluate_real, evaluate_policy
    from searchr1.models import load_model, load_tokenizer
    from searchr1.retrieval.bm25 import BM25Retriever
    from searchr1.retrieval.corpus import read_corpus
    from searchr1.rollout.registry import build_engine
    from searchr1.trainer.distributed import DistInfo

    world = write_world(tmp_path / "world")
    args = run_overrides(tiny_model_dir, tmp_path / "run", [world["questions"]], [world["questions"]],
                         world["corpus"], data__template=str(world["template"]), rollout__max_turns=2)  # fmt: skip
    cfg = load_config(None, args)
    samples = [json.loads(x) for x in world["questions"].read_text().splitlines()]
    retriever = BM25Retriever.from_documents(list(read_corpus(world["corpus"])))
    tokenizer = load_tokenizer(tiny_model_dir)
    policy = load_model(tiny_model_dir)
    torch.manual_seed(0)
    with torch.no_grad():  # "training": the policy's weights are no longer model.path's
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    trainer = SimpleNamespace(cfg=cfg, policy=policy, tokenizer=tokenizer, step=1, lora=False, dist=DistInfo(),
                              out_dir=tmp_path / "run")  # fmt: skip

    def evaluated(model: Any, out: Path) -> dict[str, tuple[Any, ...]]:
        with build_engine(cfg, model, tokenizer, retriever) as engine:
            evaluate_policy(SimpleNamespace(**{**vars(trainer), "policy": model}), samples, out,
                            str(world["template"]), 3, engine=engine)  # fmt: skip
        return answers(out / "trajectories.jsonl")

    of_policy = evaluated(policy, tmp_path / "policy")
    of_saved = evaluated(load_model(tiny_model_dir).eval(), tmp_path / "saved")
    assert of_policy != of_saved  # the policy answers differently from the saved model

    real = build_engine
    monkeypatch.setattr(registry, "build_engine", lambda *a, **k: CopyServingEngine(real, *a, **k))
    _evaluate_real(trainer, (samples, retriever), tmp_path / "real", world["template"], 3)
    assert answers(tmp_path / "real" / "trajectories.jsonl") == of_policy
