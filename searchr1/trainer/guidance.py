"""Guidance from the gold path: groups that found no success get the way to one.

On-policy GRPO cannot reinforce what it never samples: a 135M policy rarely writes a second search whose
query is the name the first passage gave, so a group of a two-hop question almost never holds a success
and its advantages are all 0. Where the question's gold path is known (``searchr1.rollout.gold``: the
synthetic world's hops, HotpotQA / 2Wiki supporting facts, MuSiQue's supporting paragraphs), guidance puts
it into such groups, in two forms (both off by default; ``guidance.*``):

* off-policy (LUFFY, Yan et al. 2025, arXiv 2504.14945): ``guidance.off_policy`` gold trajectories (the
  gold titles searched in turn with the run's own search backend, the gold answer, in the run's format)
  take the places of the group's last fresh trajectories. Their tokens were never sampled, so they are
  trained with policy shaping instead of the PPO ratio (``algorithms.policy_losses.shaped_off_policy_loss``:
  l_t = -A_t pi_t / (pi_t + gamma)); their observations are masked as always.
* branched (BREAD, Zhang et al. 2025, arXiv 2506.17211): ``guidance.branched`` rollouts continue from the
  gold prefix that ends after the first ``<information>``: the model writes the next search itself (the
  prefix joins the trajectory as observation tokens: not trained) and its own tokens are trained on-policy.

The group's advantages are computed over the mixed group (GRPO: ``A = (R - mean_g R) / std_g R``), so the
gold or branched success lifts itself and pushes the failures down. How many: at step s the guided
trajectories are at most

    share(s) = guidance.share * max(0, 1 - s / (guidance.decay_until * trainer.total_steps))

of the step's trajectories (``round(share(s) * B)``), given to the groups without a success first in the
batch, ``off_policy + branched`` each, whole groups only; from ``decay_until`` on nothing is guided, so the
policy that ends the run (and any policy kept after that point) stands alone. Groups of questions whose gold
path searches fewer than ``guidance.min_hops`` titles are not guided. Evaluation never sees any of it: it is
built only inside the training step. Decision groups (``guidance.decision_groups``: whole groups continued
from the gold prefix, ``searchr1.trainer.decision``) are chosen before the rollout; guidance leaves them alone.

Metrics: ``guidance/share`` (guided trajectories / trajectories), ``guidance/scheduled_share``,
``guidance/gold`` and ``guidance/branched`` (counts), ``timing/guidance`` (the branched rollouts), ``guidance/cut`` (gold trajectories cut at a turn
boundary to fit ``max_turns`` / ``max_response_tokens``), ``guidance/shaping_weight`` (mean of
w_t = gamma pi_t / (pi_t + gamma)^2 over gold tokens, from the update), and for every run
``rollout/second_search_rate``: the share of fresh trajectories of multi-hop questions (two gold passages
or more) that searched at least twice.

    guide = Guidance(cfg.guidance, cfg.trainer.total_steps, train_samples, writer, log=print)
    plan = rollout_requests(guide, prompt_ids, metas, groups)     # decision groups' prefixes in place
    mixed, rows, metrics = guide.mix(trajs, groups, totals, step, generate, skip=decision_group_ids)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch

from searchr1.rollout.gold import GOLD_PATH_KEYS, GoldPath, GoldWriter, gold_path, prefix_meta, splice
from searchr1.rollout.types import Trajectory
from searchr1.trainer.decision import DecisionGroups, DecisionPlan

GOLD = "gold"
BRANCHED = "branched"


def is_gold(traj: Trajectory) -> bool:
    """A gold (off-policy) trajectory of guidance."""
    return (traj.meta or {}).get("guided") == GOLD


def is_guided(traj: Trajectory) -> bool:
    return bool((traj.meta or {}).get("guided"))


def scheduled_share(cfg: Any, step: int, total_steps: int) -> float:
    """``share(s)`` of the module docstring."""
    horizon = cfg.decay_until * total_steps
    if horizon <= 0:
        return 0.0
    return cfg.share * max(0.0, 1.0 - step / horizon)


def multi_hop(traj: Trajectory) -> bool:
    """The question names two gold passages or more (a bridge or comparison question)."""
    meta = traj.meta or {}
    return len(meta.get("supporting_ids") or meta.get("supporting_titles") or []) >= 2


def second_search_counts(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """The trajectories of multi-hop questions and those of them that searched at least twice
    (``rollout/second_search_rate`` is their ratio, over every rank)."""
    rows = [t for t in trajs if multi_hop(t)]
    return {"multi_hop": float(len(rows)), "second_search": float(sum(t.searches >= 2 for t in rows))}


def guidance_tensors(trajs: Sequence[Trajectory]) -> dict[str, torch.Tensor]:
    """``Experience.extras["gold"]``: ``[B]`` bool, the gold rows (trained with policy shaping)."""
    return {"gold": torch.tensor([is_gold(t) for t in trajs], dtype=torch.bool)}


def guided_masks(exp: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(on-policy mask, gold mask)``: the batch's train mask split by row (gold mask None: no gold row)."""
    gold = exp.extras.get("gold")
    if gold is None or not bool(gold.any()):
        return exp.train_mask, None
    rows = gold.to(exp.train_mask.device)[:, None]
    return exp.train_mask & ~rows, exp.train_mask & rows


class Guidance:
    """Gold trajectories and branched rollouts for the groups of a step that found no success."""

    def __init__(
        self,
        cfg: Any,
        total_steps: int,
        samples: Sequence[Any],
        writer: GoldWriter,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.cfg = cfg
        self.total_steps = total_steps
        self.writer = writer
        self.paths: list[GoldPath | None] = [gold_path(s) for s in samples]
        self.decisions = (
            DecisionGroups(cfg.decision_groups, self.paths, writer, log) if cfg.decision_groups > 0 else None
        )
        """Decision groups (``guidance.decision_groups``), planned before the rollout; None: off."""
        mixes = cfg.off_policy + cfg.branched > 0
        with_path = sum(p is not None and len(p.queries) >= cfg.min_hops for p in self.paths)
        self.active = mixes and with_path > 0
        """Gold trajectories or branched rollouts can be mixed in (decision groups alone: False)."""
        if mixes and not self.active:
            log(
                "guidance: no training question has a gold path of at least "
                f"{cfg.min_hops} search(es) (read from {GOLD_PATH_KEYS}); guidance is off for this run"
            )
        elif mixes and with_path < len(self.paths):
            log(
                f"guidance: {with_path} of {len(self.paths)} training questions have a gold path; only they are guided"
            )

    def path_of(self, traj: Trajectory) -> GoldPath | None:
        index = (traj.meta or {}).get("sample_index")
        path = self.paths[int(index)] if index is not None and 0 <= int(index) < len(self.paths) else None
        return path if path is not None and len(path.queries) >= self.cfg.min_hops else None

    def plan(
        self,
        trajs: Sequence[Trajectory],
        groups: Sequence[int],
        totals: Sequence[float],
        step: int,
        skip: Collection[int] = (),
    ) -> list[tuple[list[int], GoldPath]]:
        """The groups to guide this step, in batch order: ``(rows to replace, gold path)``; the rows are
        each group's last ``off_policy + branched`` ones. Groups in ``skip`` (decision groups) are not guided."""
        per_group = self.cfg.off_policy + self.cfg.branched
        if not self.active or per_group == 0:
            return []
        budget = round(scheduled_share(self.cfg, step, self.total_steps) * len(trajs))
        rows_of: dict[int, list[int]] = {}
        for row, gid in enumerate(groups):
            rows_of.setdefault(gid, []).append(row)
        plan = []
        for gid, rows in rows_of.items():
            if budget < per_group:
                break
            if gid in skip or len(rows) <= per_group or any(totals[r] >= self.cfg.min_reward for r in rows):
                continue
            path = self.path_of(trajs[rows[0]])
            if path is None:
                continue
            plan.append((rows[len(rows) - per_group :], path))
            budget -= per_group
        return plan

    def mix(
        self,
        trajs: Sequence[Trajectory],
        groups: Sequence[int],
        totals: Sequence[float],
        step: int,
        generate: Callable[[list[list[int]], list[dict[str, Any]]], list[Trajectory]],
        skip: Collection[int] = (),
    ) -> tuple[list[Trajectory], list[int], dict[str, float]]:
        """The batch with guided trajectories in place (``generate(prompt_ids, metas)`` rolls out the
        branched continuations with the current policy; ``skip``: groups left alone); returns it, the rows
        replaced and the metrics."""
        out = list(trajs)
        plan = self.plan(trajs, groups, totals, step, skip)
        cut = 0
        gold_rows: list[int] = []
        branch_jobs: list[tuple[int, Any]] = []
        for rows, path in plan:
            for i, row in enumerate(rows):
                slot = out[row]
                meta = _slot_meta(slot)
                if i < self.cfg.off_policy:
                    gold = self.writer.trajectory(slot.prompt_ids, path, meta)
                    out[row] = gold.trajectory
                    cut += int(gold.cut)
                    gold_rows.append(row)
                else:
                    branch_jobs.append((row, self.writer.prefix(path)))
        t0 = time.perf_counter()
        if branch_jobs:
            prompts = [list(out[row].prompt_ids) + p.turn_ids + p.obs_ids for row, p in branch_jobs]
            metas = [prefix_meta(_slot_meta(out[row]), p) for row, p in branch_jobs]
            continued = generate(prompts, metas)
            for (row, prefix), cont in zip(branch_jobs, continued, strict=True):
                out[row] = splice(prefix, cont, out[row].prompt_ids, self.writer.tokenizer)
        replaced = sorted(gold_rows + [row for row, _ in branch_jobs])
        metrics = {
            "guidance/scheduled_share": scheduled_share(self.cfg, step, self.total_steps),
            "guidance/share": len(replaced) / max(1, len(out)),
            "guidance/gold": float(len(gold_rows)),
            "guidance/branched": float(len(branch_jobs)),
            "guidance/cut": float(cut),
            "timing/guidance": time.perf_counter() - t0,
        }
        return out, replaced, metrics


def rollout_requests(
    guidance: Guidance | None,
    prompt_ids: Sequence[Sequence[int]],
    metas: Sequence[Mapping[str, Any]],
    groups: Sequence[int],
) -> DecisionPlan:
    """What the step's rollout generates: its prompts and metas as they are, or, with decision groups
    (``guidance.decision_groups``), those groups' rows continuing from their gold prefix
    (``searchr1.trainer.decision``); ``plan.splice(generated)`` gives the step's trajectories."""
    if guidance is None or guidance.decisions is None:
        return DecisionPlan([list(p) for p in prompt_ids], [dict(m) for m in metas])
    return guidance.decisions.plan(prompt_ids, metas, groups)


def _slot_meta(traj: Trajectory) -> dict[str, Any]:
    """The meta a guided trajectory takes from the fresh one it replaces (its question, group, place)."""
    drop = ("replayed", "replayed_from_step", "guided", "guided_prefix_tokens", "search_errors")
    return {k: v for k, v in (traj.meta or {}).items() if k not in drop}
