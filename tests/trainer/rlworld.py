"""Helpers of the trainer tests: a tiny world (corpus, questions, short prompt template) and configs
small enough that a training step takes well under a second on one CPU core.

``token_set_reward`` is the "easy behaviour" of the learning tests: the fraction of the model's own
generated tokens that fall in a fixed quarter of the vocabulary (ids divisible by 4). A random
policy scores about 0.25; a policy that learned the behaviour scores more.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from searchr1.rollout.types import Role

CORPUS = [
    ("Alice Verdan", "Alice Verdan was born in Borvik in 1901. She founded the Quillon Press."),
    ("Borvik", "Borvik is a city in Tarnland on the river Ost."),
    ("Quillon Press", "The Quillon Press is a publisher based in Borvik, founded by Alice Verdan."),
    ("Tarnland", "Tarnland is a country whose capital is Borvik."),
    ("Ost", "The Ost is a river that flows through Borvik."),
    ("Mira Lund", "Mira Lund was born in Kessa in 1923 and wrote The Glass Field."),
]
QUESTIONS = [
    ("where was Alice Verdan born", ["Borvik"]),
    ("who founded the Quillon Press", ["Alice Verdan"]),
    ("what is the capital of Tarnland", ["Borvik"]),
    ("which river flows through Borvik", ["Ost"]),
    ("where was Mira Lund born", ["Kessa"]),
    ("what did Mira Lund write", ["The Glass Field"]),
    ("in which country is Borvik", ["Tarnland"]),
    ("when was Alice Verdan born", ["1901"]),
    ("when was Mira Lund born", ["1923"]),
    ("who wrote The Glass Field", ["Mira Lund"]),
    ("where is the Quillon Press based", ["Borvik"]),
    ("what kind of place is Borvik", ["city"]),
    ("what is the Ost", ["river"]),
    ("what did Alice Verdan found", ["Quillon Press"]),
    ("which city is the capital of Tarnland", ["Borvik"]),
    ("in which city was Mira Lund born", ["Kessa"]),
]


def write_world(folder: Path) -> dict[str, Path]:
    """corpus.jsonl, train.jsonl, val.jsonl and a one-line prompt template under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n" for i, (t, x) in enumerate(CORPUS)
        )
    )
    rows = [
        {"id": f"q{i}", "question": q, "golden_answers": a, "metadata": {"data_source": "tiny"}}
        for i, (q, a) in enumerate(QUESTIONS)
    ]
    train = folder / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    val = folder / "val.jsonl"
    val.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    template = folder / "template.txt"
    template.write_text("Question: {question}\n")
    return {"corpus": corpus, "train": train, "val": val, "template": template}


BRIDGE = {
    "id": "b1",
    "question": "where was the founder of the Quillon Press born",
    "golden_answers": ["Borvik"],
    "metadata": {
        "type": "bridge",
        "data_source": "synth",
        "supporting_titles": ["Quillon Press", "Alice Verdan"],
    },
}
"""A two-hop question whose gold path (its supporting titles) the guidance can follow."""

GUIDED_RUN = {
    "rollout__n": 4, "rollout__max_turns": 2, "rollout__max_obs_tokens": 60, "rollout__max_response_tokens": 160,
    "trainer__batch_size": 2, "trainer__mini_batch_size": 2, "trainer__total_steps": 2, "trainer__shuffle": False,
}  # fmt: skip
"""The sizes of a guided run over ``write_guided_world``'s world (guidance itself: the caller's overrides)."""


def write_guided_world(folder: Path) -> dict[str, Path]:
    """``write_world`` whose training file holds ``BRIDGE`` first, then seven questions without a gold path."""
    files = write_world(folder)
    rows = [json.loads(line) for line in files["train"].read_text().splitlines()]
    files["train"].write_text("".join(json.dumps(r) + "\n" for r in [BRIDGE, *rows[1:8]]))
    return files


def overrides(world: dict[str, Path], model_dir: Path, out_dir: Path, **extra: Any) -> list[str]:
    """Dotted overrides of a tiny, fast run (``extra`` uses ``__`` for dots: trainer__total_steps=3)."""
    # imported here: subprocess runs import this module (for its rewards) with only tests/trainer on the path
    from tinyrun import run_overrides

    extra = {"data__template": str(world["template"]), "trainer__actor_lr": 1e-3, **extra}
    return run_overrides(model_dir, out_dir, [world["train"]], [world["val"]], world["corpus"], **extra)


def load(world: dict[str, Path], model_dir: Path, out_dir: Path, **extra: Any) -> Any:
    from searchr1.config import load_config

    return load_config(None, overrides(world, model_dir, out_dir, **extra))


def token_set_reward(ctx: Any) -> float:
    """Fraction of generated tokens whose id is divisible by 4 (a user reward: ``module:function``)."""
    traj = ctx.trajectory
    ids = [t for t, r in zip(traj.response_ids, traj.roles, strict=True) if r == Role.GENERATED]
    return sum(1 for t in ids if t % 4 == 0) / max(1, len(ids))


def read_metrics(out_dir: Path) -> list[dict[str, Any]]:
    path = Path(out_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


NAN_CALLS = {"left": 0}


def nan_reward(ctx: Any) -> float:
    """NaN while ``NAN_CALLS['left'] > 0`` (counted down per trajectory), then the token-set reward."""
    if NAN_CALLS["left"] > 0:
        NAN_CALLS["left"] -= 1
        return float("nan")
    return token_set_reward(ctx)


class ForceSearch:
    """A rollout steer: turn 0 is ``<search> x x </search>``, later turns ``<answer> x x </answer>``;
    the tokens in between are sampled from the model (every forward pass stays real)."""

    def __init__(self, tokenizer: Any) -> None:
        ids = tokenizer.convert_tokens_to_ids
        self.search = (ids("<search>"), ids("</search>"))
        self.answer = (ids("<answer>"), ids("</answer>"))
        self.tags = {*self.search, *self.answer}

    def __call__(self, rows: list, logits: Any) -> Any:
        import torch

        for i, row in enumerate(rows):
            opening, closing = self.search if row.turn == 0 else self.answer
            n = len(row.turn_ids)
            force = opening if n == 0 else closing if n == 3 else None
            if force is None:
                logits[i, list(self.tags)] = -torch.inf
            else:
                logits[i] = -torch.inf
                logits[i, force] = 0.0
        return logits


def constant_reward(ctx: Any) -> float:
    """The same reward for every trajectory: no group has any advantage."""
    return 0.5


class FixedLogprobs(torch.nn.Module):
    """An 'actor' whose log-probs are its parameter (so the gradient is d loss / d log pi)."""

    def __init__(self, logprobs: torch.Tensor) -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(logprobs.clone())

    def forward(self, input_ids: Any, attention_mask: Any, *, target_mask: Any, temperature: float, return_entropy: bool = False) -> Any:
        return self.theta, torch.zeros_like(self.theta)
