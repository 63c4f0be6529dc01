"""How a starting model behaves on the learning demo's own rollouts, before any RL.

RL with an outcome reward can only reinforce what the policy already does now and then: the
demo learns only if some sampled rollouts search, read a passage holding the answer, and answer
from it. ``probe_policy`` samples the demo's rollouts (its RL config: temperature 1, ``rollout.n``
samples per question) on training questions of one world and counts, as shares of all rollouts:

- ``first_search`` / ``first_answer``: the first turn begins with ``<search>`` / ``<answer>``;
- ``searched``: at least one search ran;
- ``retrieved_answer``: a search returned a passage that contains a gold answer;
- ``answered_after_search``: an ``<answer>`` (closed or not) follows a search's ``<information>`` block;
- ``rewarded``: reward > 0; ``mean_reward``; ``groups_with_signal``: the share of questions whose
  group has a rewarded rollout (GRPO's advantage is zero in the others).

    searchr1 demo --probe 32        # the demo's starting model, 32 questions x rollout.n
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass
class ProbeResult:
    """Shares of all sampled rollouts (see the module docstring)."""

    rollouts: int
    first_search: float
    first_answer: float
    searched: float
    retrieved_answer: float
    answered_after_search: float
    rewarded: float
    mean_reward: float
    groups_with_signal: float

    def as_dict(self) -> dict[str, int | float]:
        return asdict(self)


def _first_action(text: str) -> str:
    """``search`` | ``answer`` | ``other``: what the first turn of a response begins with."""
    head = text.lstrip()
    for action in ("search", "answer"):
        if head.startswith(f"<{action}>"):
            return action
    return "other"


def summarise(trajectories: Sequence[Any], rewards: Sequence[float], groups: Sequence[int]) -> ProbeResult:
    """Count the behaviours of ``trajectories`` (with their ``response_text``, ``searches``,
    ``documents`` and ``meta['golden_answers']``), their ``rewards`` and group ids."""
    n = len(trajectories)
    if n == 0 or len(rewards) != n or len(groups) != n:
        raise ValueError(f"need as many rewards and groups as trajectories (got {n}, {len(rewards)}, {len(groups)})")
    first = [_first_action(t.response_text) for t in trajectories]
    retrieved = answered = 0
    for t in trajectories:
        if not t.searches:
            continue
        gold = [str(g) for g in t.meta.get("golden_answers", [])]
        passages = " ".join(f"{hit.get('title', '')} {hit.get('text', '')}" for hits in t.documents for hit in hits)
        retrieved += any(g and g in passages for g in gold)
        _, block, after = t.response_text.partition("</information>")
        answered += bool(block) and "<answer>" in after
    signal = {g for g, r in zip(groups, rewards, strict=True) if r > 0}
    return ProbeResult(
        rollouts=n,
        first_search=first.count("search") / n,
        first_answer=first.count("answer") / n,
        searched=sum(1 for t in trajectories if t.searches) / n,
        retrieved_answer=retrieved / n,
        answered_after_search=answered / n,
        rewarded=sum(1 for r in rewards if r > 0) / n,
        mean_reward=sum(rewards) / n,
        groups_with_signal=len(signal) / len(set(groups)),
    )


def probe_policy(model_dir: str | Path, settings: Any = None, seed: int = 0, questions: int = 32) -> ProbeResult:
    """Sample the demo's rollouts of the model in ``model_dir`` on ``questions`` training questions
    of world ``seed`` (``settings``: a ``DemoSettings``, default the demo's) and summarise them."""
    from searchr1.learning_demo import (
        DemoSettings,
        _read_jsonl,
        build_bm25,
        build_world,
        check_settings,
        demo_trainer,
    )
    from searchr1.trainer import adapters

    settings = settings or DemoSettings()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        prompt_path = check_settings(folder, settings)
        _, files = build_world(seed, settings, folder / "world")
        train = _read_jsonl(files["train"])
        if not 0 < questions <= len(train):
            raise ValueError(f"questions must be between 1 and {len(train)}, got {questions}")
        retriever = build_bm25(files["corpus"])
        trainer = demo_trainer(settings, seed, Path(model_dir), retriever, train, train[:1], folder / "run", prompt_path)
        trajectories, groups, _ = trainer.rollout(list(range(questions)), 0)
        decode = trainer.tokenizer.decode
        rewards = [r.total for r in adapters.score(trainer.reward_fn, trajectories, decode)]
    return summarise(trajectories, rewards, groups)


def format_probe(result: ProbeResult) -> str:
    rows = [
        ("first turn begins <search>", result.first_search),
        ("first turn begins <answer>", result.first_answer),
        ("a search ran", result.searched),
        ("a search returned a passage holding the answer", result.retrieved_answer),
        ("an <answer> follows a search", result.answered_after_search),
        ("reward > 0", result.rewarded),
        ("questions whose group has a rewarded rollout", result.groups_with_signal),
    ]
    lines = [f"{result.rollouts} sampled rollouts (temperature 1) of the starting model, before RL:"]
    lines += [f"  {name:48s} {share:6.1%}" for name, share in rows]
    lines.append(f"  {'mean reward':48s} {result.mean_reward:6.3f}")
    return "\n".join(lines)
