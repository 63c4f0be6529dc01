"""How a search turn's step reward reaches its tokens (StepSearch, arXiv 2505.15107: token-level
credit for each search beside the global outcome reward), compared per search position.

The step rewards ``s_ik`` of trajectory i's search turns k = 1..n_i come from ``searchr1.rewards.steps``;
``c`` is ``algorithm.step_credit_coef``; ``T_ik`` the turn's generated tokens (its query and the
reasoning before it), ``t_ik`` its last one; ``S_i`` the tokens of what i did instead of search n_i + 1
(its answer turn: ``StepCredit.stop_span``).

Outcome estimators (grpo, rloo, reinforce, ..., registered without ``token_level``): a step
advantage beside the group's outcome advantage ``A_i`` (GRPO: ``(R_i - mean_g R) / (std_g R + eps)``).
Turn k of a trajectory is compared with the k-th decisions of the other trajectories of its group g
(the same prompt), a trajectory without a k-th search counting 0 there:

    v_ik  = s_ik  if k <= n_i,  else 0                              k = 1..K_g, K_g = max_{j in g} n_j
    Â_ik  = (v_ik - mean_{j in g} v_jk) / (std_{j in g} v_jk + eps)  (std: unbiased; without the division
                                                                    when algorithm.norm_adv_by_std=false)
    A_it  = A_i + c * Â_ik         for t in T_ik   (k <= n_i: the k-th search)
    A_it  = A_i + c * Â_i,n_i+1    for t in S_i    (n_i < K_g: stopping where another trajectory searched)
    A_it  = A_i                    for the trajectory's other generated tokens

Why per position: pooled over all turns of a group, a second search that finds the second hop earns the
same step reward as every first search that found the first, so its advantage is about 0, while a second
search that fails is below the pool's mean: trying hop 2 is punished in expectation and stopping after one
search costs nothing. Compared with the k-th decisions alone, with gain g for a new gold passage and
redundancy penalty r: a k-th search that finds new gold (v = g) ranks above stopping (v = 0), which ranks
with a k-th search that finds nothing new (v = 0) and above a redundant repeat (v = -r); stopping where
others found gold is pushed down by the same comparison. At the first position all trajectories that
searched once for the same question compare their first searches, as before.

Token-level estimators (gae, reinforce_plus_plus: ``register_advantage(..., token_level=True)``):
per-token rewards, the step reward on the turn's last generated token, the outcome on the last one
of the response, so GAE carries each to the tokens before it (the critic is the baseline):

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
    ``rewards`` holds s_ik on every token of search turn k and ``turns`` holds k there; the tokens of the
    stop span (``StepCredit.stop_span``: what the trajectory did instead of search n_i + 1) hold
    ``-(n_i + 1)`` in ``turns`` and 0 in ``rewards``. Turns of an unscored trajectory are left out (0);
    a turn whose tokens are unknown holds no token, and then neither does the stop span (its position
    would be wrong)."""
    rewards = torch.zeros(shape, dtype=torch.float32)
    turns = torch.zeros(shape, dtype=torch.long)
    for row, (credit, p) in enumerate(zip(credits, prompt_lens, strict=True)):
        if credit is None or not credit.scored:
            continue
        known = True
        for k, turn in enumerate(credit.turns):
            if turn.span is None:
                known = False
                continue
            start, end = p + turn.span[0], min(p + turn.span[1], shape[1])
            if end <= start:
                continue
            rewards[row, start:end] = turn.reward
            turns[row, start:end] = k + 1
        stop = getattr(credit, "stop_span", None)
        if known and stop is not None:
            start, end = p + stop[0], min(p + stop[1], shape[1])
            if end > start:
                turns[row, start:end] = -(len(credit.turns) + 1)
    return rewards, turns


def _turn_values(rewards: Tensor, turns: Tensor, row: int) -> list[tuple[int, float]]:
    """``[(k, s_ik), ...]`` of one row's scored search turns."""
    ids = turns[row]
    out = []
    for k in torch.unique(ids[ids > 0]).tolist():
        first = int(torch.nonzero(ids == k)[0, 0])
        out.append((int(k), float(rewards[row, first])))
    return out


def _search_counts(rewards: Tensor, turns: Tensor, row: int) -> tuple[dict[int, float], bool]:
    """``({k: s_ik}, scored)`` of one row: its search turns' step rewards by position, and whether the
    row takes part in the comparison at all (a labelled search turn or stop span)."""
    values = dict(_turn_values(rewards, turns, row))
    scored = bool(values) or bool((turns[row] < 0).any())
    return values, scored


@torch.no_grad()
def group_step_advantages(
    rewards: Tensor,
    turns: Tensor,
    group_ids: Sequence[Hashable],
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """``Â_ik`` on the tokens of search turn k and ``Â_i,n_i+1`` on the stop span, 0 elsewhere
    ``[B, T]`` (per search position; see the module docstring)."""
    out = torch.zeros(rewards.shape, dtype=torch.float32)
    by_group: dict[Hashable, list[tuple[int, dict[int, float]]]] = {}
    for row, gid in enumerate(group_ids):
        values, scored = _search_counts(rewards, turns, row)
        if scored:
            by_group.setdefault(gid, []).append((row, values))
    for members in by_group.values():
        if len(members) < 2:
            continue
        deepest = max((max(v, default=0) for _, v in members), default=0)
        for k in range(1, deepest + 1):
            column = torch.tensor([v.get(k, 0.0) for _, v in members], dtype=torch.float64)
            centred = column - column.mean()
            if norm_by_std:
                centred = centred / (column.std(unbiased=True) + eps)
            for (row, values), adv in zip(members, centred.tolist(), strict=True):
                label = k if k in values else -k
                out[row][turns[row] == label] = float(adv)
    return out


def step_signal_groups(rewards: Tensor, turns: Tensor, group_ids: Sequence[Hashable]) -> set[Hashable]:
    """Groups with a step advantage somewhere (their k-th decisions differ at some search position): they
    carry a signal even when their outcome rewards are all equal (``algorithm.filter_groups`` keeps them)."""
    adv = group_step_advantages(rewards, turns, group_ids, norm_by_std=False)
    return {g for row, g in enumerate(group_ids) if float(adv[row].abs().max()) > 1e-9}


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
