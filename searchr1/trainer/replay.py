"""Replay of what worked (ExGRPO, Zhan et al. 2025, arXiv 2510.02245: replaying successful trajectories
of partly solved questions keeps RLVR from collapsing on weak models where on-policy GRPO does).

``replay.enabled``: every fresh trajectory whose outcome reward reaches ``replay.min_reward`` is kept
per training question (``keep_per_question`` newest, with the log-probs it was sampled with). When a
later group of that question has no success, its last ``per_group`` fresh trajectories are replaced
by stored successes (newest first), at most ``max_share`` of the step's trajectories. The group's
advantages then see the success (GRPO: ``A = (R - mean_g R) / std_g R`` over the mixed group).

A replayed trajectory was sampled by an earlier policy mu, so its tokens are trained with the
importance ratio against mu, not against the current policy: its old log-probs are the stored ones
(``Trajectory.logprobs``: ``log_softmax(logits / T)`` of the sampling policy at the sampling
temperature, the same quantity the trainer recomputes), also on the on-policy fast path
(``trainer.on_policy_logprobs``, where fresh rows take the update's own detached log-probs). Per
replayed token, with the PPO clip of ``algorithm.clip_ratio_low`` / ``clip_ratio_high``:

    w_t = exp(log pi_theta(y_t) - log mu(y_t))
    l_t = max(-A_t w_t, -A_t clip(w_t, 1 - eps_low, 1 + eps_high))       (dual clip where A_t < 0)
        = -A_t min(w_t, 1 + eps_high)                                    for A_t > 0 (a replayed success)

so a success the policy has since made likelier than mu did (w > 1 + eps_high) adds no gradient, and
one it made less likely is pulled back with weight w_t. ``replay/share`` is the share of the step's
trajectories that were replayed; ``replay/ratio_mean`` and ``replay/clipfrac`` describe w_t.

    buffer = ReplayBuffer(keep_per_question=2, max_age=0)
    trajs, replayed = mix_replay(trajs, groups, totals, buffer, cfg.replay, step)
    buffer.add(question, traj, step)                     # this step's fresh successes, after mixing
"""

from __future__ import annotations

import copy
import dataclasses
from array import array
from collections.abc import Collection, Sequence
from typing import Any

import torch

from searchr1.rollout.types import Trajectory

_PACKED = {"prompt_ids": "q", "response_ids": "q", "roles": "b", "logprobs": "d"}
"""Per-token fields kept as typed arrays in the buffer (8, 8, 1 and 8 bytes a token instead of ~30 for
a Python number in a list); ``d`` keeps every stored log-prob exactly."""


def _packed(traj: Trajectory) -> Trajectory:
    return dataclasses.replace(traj, **{k: array(code, getattr(traj, k)) for k, code in _PACKED.items()})


def _unpacked(traj: Trajectory) -> Trajectory:
    return dataclasses.replace(traj, **{k: list(getattr(traj, k)) for k in _PACKED})


def question_of(traj: Trajectory) -> int:
    """The training question a trajectory answers (its position in the training data)."""
    return int(traj.meta["sample_index"])


class ReplayBuffer:
    """Successful trajectories per training question, newest last, with the step that sampled them."""

    def __init__(self, keep_per_question: int = 2, max_age: int = 0) -> None:
        self.keep = keep_per_question
        self.max_age = max_age
        self.store: dict[int, list[tuple[int, Trajectory]]] = {}

    def __len__(self) -> int:
        """Questions with at least one stored success."""
        return len(self.store)

    def add(self, question: int, traj: Trajectory, step: int) -> None:
        """Keep ``traj`` (a fresh success of ``step``) for ``question``; the oldest ones beyond
        ``keep_per_question`` are dropped."""
        kept = _packed(copy.deepcopy(traj))
        kept.timing = {}
        kept.meta = {k: v for k, v in kept.meta.items() if k not in ("replayed", "replayed_from_step")}
        entries = self.store.setdefault(question, [])
        entries.append((int(step), kept))
        del entries[: max(0, len(entries) - self.keep)]

    def expire(self, step: int) -> None:
        """Drop successes older than ``max_age`` steps (0: none)."""
        if not self.max_age:
            return
        for q in list(self.store):
            self.store[q] = [(s, t) for s, t in self.store[q] if step - s <= self.max_age]
            if not self.store[q]:
                del self.store[q]

    def take(self, question: int, k: int) -> list[tuple[int, Trajectory]]:
        """Up to ``k`` stored successes of ``question``, newest first, as new ``Trajectory`` objects
        (they stay stored)."""
        return [(s, _unpacked(copy.deepcopy(t))) for s, t in reversed(self.store.get(question, []))][:k]

    def state_dict(self) -> dict[str, Any]:
        return {
            "questions": [
                [q, [[s, dataclasses.asdict(t)] for s, t in entries]] for q, entries in self.store.items()
            ]
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.store = {
            int(q): [(int(s), Trajectory(**t)) for s, t in entries]
            for q, entries in state.get("questions", [])
        }


def mix_replay(
    trajs: Sequence[Trajectory],
    groups: Sequence[int],
    totals: Sequence[float],
    buffer: ReplayBuffer,
    cfg: Any,
    step: int,
    skip: Collection[int] = (),
) -> tuple[list[Trajectory], list[int]]:
    """The batch with stored successes in place of the last fresh trajectories of the groups that have
    none (``cfg``: the ``replay`` section; groups in ``skip``, decision groups, are left alone); returns it
    and the rows now replayed."""
    out = list(trajs)
    budget = int(cfg.max_share * len(out) + 1e-9)
    rows_of: dict[int, list[int]] = {}
    for row, gid in enumerate(groups):
        rows_of.setdefault(gid, []).append(row)
    replayed: list[int] = []
    buffer.expire(step)
    for gid, rows in rows_of.items():
        if budget <= 0:
            break
        if gid in skip or any(totals[r] >= cfg.min_reward for r in rows):
            continue
        stored = buffer.take(question_of(out[rows[0]]), min(cfg.per_group, len(rows) - 1, budget))
        for row, (from_step, copy_) in zip(rows[len(rows) - len(stored) :], stored, strict=True):
            slot = out[row].meta
            copy_.meta = {
                **copy_.meta,
                "group_id": slot.get("group_id"),
                "sample_in_group": slot.get("sample_in_group"),
                "replayed": True,
                "replayed_from_step": from_step,
            }
            out[row] = copy_
            replayed.append(row)
        budget -= len(stored)
    return out, replayed


def is_replayed(traj: Trajectory) -> bool:
    return bool((traj.meta or {}).get("replayed"))


def replay_tensors(trajs: Sequence[Trajectory], shape: tuple[int, int]) -> dict[str, torch.Tensor]:
    """``Experience.extras`` of a batch: ``replayed`` ``[B]`` bool, and ``behaviour_logprobs``
    ``[B, T]`` (aligned with ``input_ids``: a replayed row's stored sampling log-probs on its
    response, 0 elsewhere)."""
    replayed = torch.zeros(shape[0], dtype=torch.bool)
    behaviour = torch.zeros(shape, dtype=torch.float32)
    for row, traj in enumerate(trajs):
        if not is_replayed(traj):
            continue
        replayed[row] = True
        p = len(traj.prompt_ids)
        behaviour[row, p : p + len(traj.logprobs)] = torch.tensor(traj.logprobs, dtype=torch.float32)
    return {"replayed": replayed, "behaviour_logprobs": behaviour}


def with_behaviour_logprobs(exp: Any, old_logprobs: torch.Tensor) -> torch.Tensor:
    """``old_logprobs`` with the replayed rows' stored sampling log-probs in place (mu of the ratio)."""
    replayed = exp.extras.get("replayed")
    if replayed is None or not bool(replayed.any()):
        return old_logprobs
    behaviour = exp.extras["behaviour_logprobs"].to(device=old_logprobs.device, dtype=old_logprobs.dtype)
    return torch.where(replayed.to(old_logprobs.device)[:, None], behaviour, old_logprobs)


def replay_ratio_metrics(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, exp: Any, clip_low: float, clip_high: float
) -> tuple[float, float, float]:
    """``(ratio_mean, clipfrac, tokens)`` of w_t over the replayed rows' trained tokens of a
    micro-batch (clipfrac: w outside [1 - clip_low, 1 + clip_high])."""
    replayed = exp.extras.get("replayed")
    if replayed is None:
        return 0.0, 0.0, 0.0
    mask = exp.train_mask.bool() & replayed.to(exp.train_mask.device)[:, None]
    tokens = float(mask.sum())
    if not tokens:
        return 0.0, 0.0, 0.0
    ratio = torch.exp((logprobs.detach() - old_logprobs.detach()).float().clamp(-20.0, 20.0))[mask]
    clipped = (ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)
    return float(ratio.mean()), float(clipped.float().mean()), tokens
