"""What a step trains on besides its fresh rollouts: stored successes (``searchr1.trainer.replay``) and
guidance from the gold path (``searchr1.trainer.guidance``), both mixed into the groups that found no
success, in that order (a group that a replayed success already lifted is not guided). Decision groups
(``guidance.decision_groups``, ``searchr1.trainer.decision``) were chosen before the rollout and generated
in it from their gold prefix: neither replay nor guidance touches them.

    rollout (fresh groups; decision groups from their gold prefix) ──► reward ──► replay (fresh groups
    without a success take a stored one) ──► guidance (fresh groups still without one take gold
    trajectories / branched rollouts) ──► rewards of the replaced rows

The fresh trajectories' successes are stored for later replay after the mixing (never a gold, branched or
decision one: none was sampled from the prompt alone). The rollout metrics describe the fresh batch (the
decision rows have their own, ``decision/*``).

    batch = mix_batch(trajs, groups, step, score=score, replay=buffer, replay_cfg=cfg.replay,
                      guidance=guide, generate=generate, gather=gather)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from searchr1.rollout.types import Trajectory
from searchr1.trainer.decision import decision_counts, decision_metrics, is_decision
from searchr1.trainer.guidance import Guidance, second_search_counts
from searchr1.trainer.replay import ReplayBuffer, mix_replay, question_of


@dataclass
class MixedBatch:
    trajs: list[Trajectory]
    rewards: list[Any]
    fresh: list[Trajectory]
    """The rollouts from the prompt (the step's rollout without its decision rows)."""
    fresh_rewards: list[Any]
    metrics: dict[str, float] = field(default_factory=dict)
    """Replay and guidance metrics of this rank."""
    counts: dict[str, float] = field(default_factory=dict)
    """This rank's counts, to be summed over ranks (``shares``): rows, replayed, guided, multi_hop and
    second_search (and with decision groups ``decision_counts``)."""


def shares(counts: dict[str, float], replay: bool, guidance: bool) -> dict[str, float]:
    """The step's shares from the counts summed over ranks: ``replay/share``, ``guidance/share`` (of all
    rows), ``rollout/second_search_rate`` (of the multi-hop questions' fresh trajectories) and, with
    decision groups, ``decision/*`` (``searchr1.trainer.decision.decision_metrics``)."""
    out = {}
    rows = max(counts["rows"], 1.0)
    if replay:
        out["replay/share"] = counts["replayed"] / rows
    if guidance:
        out["guidance/share"] = counts["guided"] / rows
    if counts["multi_hop"]:
        out["rollout/second_search_rate"] = counts["second_search"] / counts["multi_hop"]
    if "decision_groups" in counts:
        out.update(decision_metrics(counts))
    return out


def mix_batch(
    trajs: Sequence[Trajectory],
    groups: Sequence[int],
    step: int,
    *,
    score: Callable[[list[Trajectory]], list[Any]],
    replay: ReplayBuffer | None,
    replay_cfg: Any,
    guidance: Guidance | None,
    generate: Callable[[list[list[int]], list[dict[str, Any]]], list[Trajectory]],
    gather: Callable[[Any], list[Any]] = lambda obj: [obj],
) -> MixedBatch:
    """Score the step's rollout, mix in replayed successes and guidance (never into decision groups),
    rescore the replaced rows. ``gather`` collects an object from every rank (the replay buffer stores every
    rank's successes)."""
    t0 = time.perf_counter()
    mixed = list(trajs)
    rewards = score(mixed)
    totals = [r.total for r in rewards]
    decided = {row for row, t in enumerate(mixed) if is_decision(t)}
    skip = {groups[row] for row in decided}
    fresh = [t for row, t in enumerate(mixed) if row not in decided]
    fresh_rewards = [r for row, r in enumerate(rewards) if row not in decided]
    metrics: dict[str, float] = {}
    counts: dict[str, float] = {"rows": float(len(mixed)), "replayed": 0.0, "guided": 0.0}
    counts.update(second_search_counts(fresh))
    if guidance is not None and guidance.decisions is not None:
        counts.update(decision_counts(mixed, totals))
    if replay is not None:
        successes = [
            (question_of(t), t)
            for t, r in zip(fresh, fresh_rewards, strict=True)
            if r.total >= replay_cfg.min_reward
        ]
        mixed, rows = mix_replay(mixed, groups, totals, replay, replay_cfg, step, skip)
        _rescore(mixed, rewards, rows, score)
        for part in gather(successes):
            for question, traj in part:
                replay.add(question, traj, step)
        counts["replayed"] = float(len(rows))
        metrics["replay/questions"] = float(len(replay))
    if guidance is not None and guidance.active:
        now = [r.total for r in rewards]
        mixed, rows, guide_metrics = guidance.mix(mixed, groups, now, step, generate, skip)
        _rescore(mixed, rewards, rows, score)
        counts["guided"] = float(len(rows))
        metrics.update({k: v for k, v in guide_metrics.items() if k != "guidance/share"})
    metrics["timing/reward"] = time.perf_counter() - t0
    return MixedBatch(mixed, rewards, fresh, fresh_rewards, metrics, counts)


def _rescore(batch: list[Trajectory], rewards: list[Any], rows: Sequence[int], score: Callable) -> None:
    if rows:
        for row, out in zip(rows, score([batch[r] for r in rows]), strict=True):
            rewards[row] = out
