"""How a search turn's step reward reaches its tokens (StepSearch, arXiv 2505.15107: token-level
credit for each search beside the global outcome reward).

The step rewards ``s_ik`` of trajectory i's search turns k come from ``searchr1.rewards.steps``;
``c`` is ``algorithm.step_credit_coef``; ``T_ik`` the turn's generated tokens (its query and the
reasoning before it), ``t_ik`` its last one.

Outcome estimators (grpo, rloo, reinforce, ..., registered without ``token_level``): a step
advantage beside the group's outcome advantage ``A_i`` (GRPO: ``(R_i - mean_g R) / (std_g R + eps)``),
with the step rewards normalised over the scored search turns of the group g (every turn of every
trajectory of the same prompt):

    Â_ik = (s_ik - mean_{(j,l) in g} s_jl) / (std_{(j,l) in g} s_jl + eps)   (std: unbiased;
           without the division when algorithm.norm_adv_by_std=false; 0 in a group of one turn)
    A_it = A_i + c * Â_ik     for t in T_ik
    A_it = A_i                 for the trajectory's other generated tokens

Token-level estimators (gae, reinforce_plus_plus: ``register_advantage(..., token_level=True)``):
per-token rewards, the step reward on the turn's last generated token, the outcome on the last one
of the response, so GAE carries each to the tokens before it:

    r_t = R_i * [t = last generated token]  +  c * sum_k s_ik * [t = t_ik]  (- beta * KL_t if in reward)
    delta_t = r_t + gamma * V_{t+1} - V_t,   A_t = delta_t + gamma * lam * A_{t+1}     (as ``gae``)

    rewards, turns = step_tensors(credits, prompt_lens, input_ids.shape)   # -> Experience.extras
    adv, ret = advantages_with_step_credit(scores, mask, cfg.algorithm, group_ids=groups,
                                           step_rewards=rewards, step_turns=turns)
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import Tensor

from searchr1.algorithms.advantages import compute_advantages, token_rewards
from searchr1.algorithms.config import AlgorithmConfig
from searchr1.algorithms.registry import advantage_traits


def step_tensors(
    credits: Sequence[Any], prompt_lens: Sequence[int], shape: tuple[int, int]
) -> tuple[Tensor, Tensor]:
    """``(rewards, turns)``, both ``[B, T]`` aligned with ``input_ids`` (prompt then response):
    ``rewards`` holds s_ik on every token of turn k, ``turns`` holds k + 1 there (0 elsewhere). Turns
    of an unscored trajectory, or whose tokens are unknown, are left out (0)."""
    rewards = torch.zeros(shape, dtype=torch.float32)
    turns = torch.zeros(shape, dtype=torch.long)
    for row, (credit, p) in enumerate(zip(credits, prompt_lens, strict=True)):
        if credit is None or not credit.scored:
            continue
        for k, turn in enumerate(credit.turns):
            if turn.span is None:
                continue
            start, end = p + turn.span[0], min(p + turn.span[1], shape[1])
            if end <= start:
                continue
            rewards[row, start:end] = turn.reward
            turns[row, start:end] = k + 1
    return rewards, turns


def _turn_values(rewards: Tensor, turns: Tensor, row: int) -> list[tuple[int, float]]:
    """``[(k + 1, s_ik), ...]`` of one row's scored turns."""
    ids = turns[row]
    out = []
    for k in torch.unique(ids[ids > 0]).tolist():
        first = int(torch.nonzero(ids == k)[0, 0])
        out.append((int(k), float(rewards[row, first])))
    return out


@torch.no_grad()
def group_step_advantages(
    rewards: Tensor,
    turns: Tensor,
    group_ids: Sequence[Hashable],
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """``Â_ik`` on the tokens of turn k, 0 elsewhere ``[B, T]`` (see the module docstring)."""
    out = torch.zeros(rewards.shape, dtype=torch.float32)
    by_group: dict[Hashable, list[tuple[int, int, float]]] = {}
    for row, gid in enumerate(group_ids):
        for k, s in _turn_values(rewards, turns, row):
            by_group.setdefault(gid, []).append((row, k, s))
    for items in by_group.values():
        if len(items) < 2:
            continue
        values = torch.tensor([s for _, _, s in items], dtype=torch.float64)
        centred = values - values.mean()
        if norm_by_std:
            centred = centred / (values.std(unbiased=True) + eps)
        for (row, k, _), adv in zip(items, centred.tolist(), strict=True):
            out[row][turns[row] == k] = float(adv)
    return out


@torch.no_grad()
def step_token_rewards(rewards: Tensor, turns: Tensor) -> Tensor:
    """s_ik on the last token of turn k, 0 elsewhere ``[B, T]``."""
    out = torch.zeros(rewards.shape, dtype=torch.float32)
    for row in range(rewards.shape[0]):
        for k, s in _turn_values(rewards, turns, row):
            last = int(torch.nonzero(turns[row] == k)[-1, 0])
            out[row, last] = s
    return out


def advantages_with_step_credit(
    rewards: Tensor,
    response_mask: Tensor,
    config: AlgorithmConfig,
    *,
    group_ids: Sequence[Hashable] | None = None,
    values: Tensor | None = None,
    state: dict | None = None,
    step_rewards: Tensor | None = None,
    step_turns: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``compute_advantages`` with the step credit of the search turns (``step_rewards`` /
    ``step_turns`` from ``step_tensors``; None: the outcome advantage alone): token rewards for a
    ``token_level`` estimator, else a step advantage added on the turns' tokens (module docstring)."""
    if step_rewards is None or step_turns is None:
        return compute_advantages(
            rewards, response_mask, config, group_ids=group_ids, values=values, state=state
        )
    coef = config.step_credit_coef
    mask = response_mask.to(torch.float32)
    if advantage_traits(config.advantage).token_level:
        per_token = token_rewards(rewards, response_mask).to(torch.float32)
        per_token = per_token + coef * step_token_rewards(step_rewards, step_turns) * mask
        return compute_advantages(
            per_token, response_mask, config, group_ids=group_ids, values=values, state=state
        )
    advantages, returns = compute_advantages(
        rewards, response_mask, config, group_ids=group_ids, values=values, state=state
    )
    if group_ids is None:
        raise ValueError("step credit with an outcome estimator needs group_ids (one id per sample)")
    step_adv = group_step_advantages(
        step_rewards, step_turns, group_ids, norm_by_std=config.norm_adv_by_std, eps=config.adv_eps
    )
    return advantages + coef * step_adv.to(advantages.dtype) * mask.to(advantages.dtype), returns
