"""Advantage estimators, registered by name (``algorithm.advantage``).

Uniform signature (see :mod:`searchr1.algorithms`)::

    fn(rewards, response_mask, *, config=None, group_ids=None, values=None, state=None)
        -> (advantages [B, T], returns [B, T])

* ``rewards``: either one outcome score per sequence ``[B]`` or token-level rewards ``[B, T]``
  (typically the score on the last generated token, minus ``kl_coef * KL`` per token when the KL is
  in the reward). Outcome estimators use the sequence score ``s_i = sum_t m_it r_it``; token-level
  estimators (gae, reinforce_plus_plus) place a ``[B]`` score on the last generated token.
* ``response_mask``: ``[B, T]``, 1 on tokens the policy generated. Prompt, padding and retrieved
  ``<information>`` tokens are 0: they are not actions, so the token-level recursions *skip* them
  (the step after the last token of one turn is the first token of the next turn) and ignore any
  reward placed on them. Both outputs are 0 on masked positions.
* ``group_ids``: one id per sample (ints, strings, any hashables, or a tensor); samples of the same
  prompt share an id. A group of one has no baseline: its advantage is its reward.
* ``values``: critic values ``[B, T]`` (gae only). ``state``: a dict the trainer keeps across steps
  (running baselines). ``config``: :class:`AlgorithmConfig` (defaults when None).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import Tensor

from searchr1.algorithms.aggregation import masked_mean, masked_whiten
from searchr1.algorithms.config import AlgorithmConfig
from searchr1.algorithms.registry import get_advantage_estimator, register_advantage

GroupIds = Tensor | Sequence[Hashable]


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def group_index(group_ids: GroupIds, device: torch.device | None = None) -> Tensor:
    """Map arbitrary group ids to a LongTensor of dense indices 0..G-1 (first-seen order)."""
    if isinstance(group_ids, Tensor):
        return torch.unique(group_ids, return_inverse=True)[1].to(device or group_ids.device)
    seen: dict[Hashable, int] = {}
    index = [seen.setdefault(g, len(seen)) for g in group_ids]
    return torch.tensor(index, dtype=torch.long, device=device)


def sequence_scores(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """Per-sequence score ``[B]``: ``rewards`` itself if 1-D, else the sum over generated tokens."""
    if rewards.dim() == 1:
        return rewards
    return torch.where(response_mask.bool(), rewards, torch.zeros_like(rewards)).sum(dim=-1)


def last_token_index(response_mask: Tensor) -> Tensor:
    """Index of the last generated token of each row (0 for rows without any)."""
    positions = torch.arange(response_mask.shape[-1], device=response_mask.device)
    return (positions * response_mask.bool()).amax(dim=-1)


def scores_to_token_rewards(scores: Tensor, response_mask: Tensor) -> Tensor:
    """Token rewards ``[B, T]`` holding each sequence score on its last generated token."""
    out = torch.zeros(response_mask.shape, dtype=scores.dtype, device=scores.device)
    has_any = response_mask.bool().any(dim=-1)
    rows = torch.arange(scores.shape[0], device=scores.device)
    out[rows, last_token_index(response_mask)] = torch.where(has_any, scores, torch.zeros_like(scores))
    return out


def token_rewards(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """``rewards`` as token-level ``[B, T]`` (a ``[B]`` score goes on the last generated token)."""
    return scores_to_token_rewards(rewards, response_mask) if rewards.dim() == 1 else rewards


def group_mean_std(scores: Tensor, index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample group mean, unbiased group std and group size (gathered back to ``[B]``).

    A group of one gets mean 0 and std 1 (no baseline, no scaling).
    """
    num_groups = int(index.max().item()) + 1 if index.numel() else 0
    counts = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, index, torch.ones_like(scores)
    )
    sums = torch.zeros_like(counts).index_add_(0, index, scores)
    mean = (sums / counts)[index]
    size = counts[index]
    sq = torch.zeros_like(counts).index_add_(0, index, (scores - mean) ** 2)
    var = (sq / (counts - 1).clamp(min=1))[index]
    single = size == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(var), var.sqrt())
    return mean, std, size


def _broadcast(per_seq: Tensor, response_mask: Tensor) -> Tensor:
    """``[B]`` -> ``[B, T]``: the per-sequence value on generated tokens, 0 elsewhere."""
    return torch.where(response_mask.bool(), per_seq.unsqueeze(-1), 0.0)


def _as_float(x: Tensor) -> Tensor:
    """At least float32 (float64 stays float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _discounted_returns(rewards: Tensor, response_mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_next over generated tokens only (masked tokens are skipped)."""
    mask = response_mask.bool()
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        candidate = rewards[:, t] + gamma * running
        running = torch.where(mask[:, t], candidate, running)
        returns[:, t] = torch.where(mask[:, t], candidate, 0.0)
    return returns


def _need_groups(group_ids: GroupIds | None, name: str, scores: Tensor) -> Tensor:
    if group_ids is None:
        raise ValueError(f"advantage estimator '{name}' needs group_ids (one id per sample)")
    index = group_index(group_ids, scores.device)
    if index.shape[0] != scores.shape[0]:
        raise ValueError(f"group_ids has {index.shape[0]} entries for a batch of {scores.shape[0]} samples")
    return index


# ---------------------------------------------------------------------------------------------
# estimators
# ---------------------------------------------------------------------------------------------


@register_advantage("gae", needs_critic=True, token_level=True)
@torch.no_grad()
def gae(
    rewards: Tensor,
    response_mask: Tensor,
    *,
    config: AlgorithmConfig | None = None,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    state: dict | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, "High-Dimensional Continuous Control
    Using Generalized Advantage Estimation").

        delta_t = r_t + gamma * V_{t+1} - V_t           (V after the last generated token = 0)
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t                              (the critic's regression target)
        A_t    <- (A_t - mean(A)) / sqrt(var(A) + 1e-8)  (algorithm.gae_whiten, on by default)

    ``t`` runs over generated tokens only; observation tokens are skipped, so ``V_{t+1}`` of the last
    token of a turn is the value of the first token of the next turn. The whitening is masked: mean
    and (unbiased) variance over every generated token of the batch, as veRL's ``core_algos`` and so
    Search-R1's PPO do; the returns keep the raw advantages.
    """
    if values is None:
        raise ValueError("advantage estimator 'gae' needs values (critic values [B, T])")
    cfg = config or AlgorithmConfig()
    values = _as_float(values)
    r = token_rewards(rewards, response_mask).to(values.dtype)
    mask = response_mask.bool()
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta = r[:, t] + cfg.gamma * next_value - values[:, t]
        adv = delta + cfg.gamma * cfg.lam * next_adv
        m = mask[:, t]
        advantages[:, t] = torch.where(m, adv, 0.0)
        next_value = torch.where(m, values[:, t], next_value)
        next_adv = torch.where(m, adv, next_adv)
    returns = torch.where(mask, advantages + values, 0.0)
    if cfg.gae_whiten:
        advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


def _grpo_group_size(algorithm: Any) -> int:
    """grpo divides by the group's std: a group of one has none (Dr. GRPO, without the division, is fine)."""
    return 2 if getattr(algorithm, "norm_adv_by_std", True) else 1


@register_advantage(
    "grpo",
    min_group_size=_grpo_group_size,
    group_size_reason="with algorithm.norm_adv_by_std=true a group of one has no spread; "
    "or set algorithm.norm_adv_by_std=false",
)
@torch.no_grad()
def grpo(
    rewards: Tensor,
    response_mask: Tensor,
    *,
    config: AlgorithmConfig | None = None,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    state: dict | None = None,
) -> tuple[Tensor, Tensor]:
    """Group-relative outcome advantage (Shao et al. 2024, DeepSeekMath).

        A_i = (s_i - mean_g(s)) / (std_g(s) + eps)      broadcast over the tokens of sample i

    ``std_g`` is the unbiased std of the sample's group g. With ``norm_adv_by_std=false`` this is
    Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): ``A_i = s_i - mean_g(s)``.
    A group of one gets ``A_i = s_i`` (plain REINFORCE). Returns = advantages.
    """
    cfg = config or AlgorithmConfig()
    scores = _as_float(sequence_scores(rewards, response_mask))
    mean, std, size = group_mean_std(scores, _need_groups(group_ids, "grpo", scores))
    adv = scores - mean
    if cfg.norm_adv_by_std:
        adv = torch.where(size > 1, adv / (std + cfg.adv_eps), adv)
    out = _broadcast(adv, response_mask)
    return out, out


@register_advantage("rloo", min_group_size=2, group_size_reason="leave-one-out needs a group")
@torch.no_grad()
def rloo(
    rewards: Tensor,
    response_mask: Tensor,
    *,
    config: AlgorithmConfig | None = None,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    state: dict | None = None,
) -> tuple[Tensor, Tensor]:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics").

        A_i = s_i - (1 / (n - 1)) * sum_{j in g, j != i} s_j  =  n / (n - 1) * (s_i - mean_g(s))

    A group of one gets ``A_i = s_i``. Returns = advantages.
    """
    scores = _as_float(sequence_scores(rewards, response_mask))
    mean, _, size = group_mean_std(scores, _need_groups(group_ids, "rloo", scores))
    adv = torch.where(size > 1, size / (size - 1).clamp(min=1) * (scores - mean), scores)
    out = _broadcast(adv, response_mask)
    return out, out


@register_advantage("reinforce")
@torch.no_grad()
def reinforce(
    rewards: Tensor,
    response_mask: Tensor,
    *,
    config: AlgorithmConfig | None = None,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    state: dict | None = None,
) -> tuple[Tensor, Tensor]:
    """REINFORCE outcome advantage (Williams 1992): ``A_i = s_i - b``, broadcast over the tokens.

    ``reinforce_baseline``: ``none`` (b = 0), ``batch_mean`` (b = mean of this batch), or
    ``running_mean``: b = EMA of previous batch means, kept in ``state["reinforce_baseline"]``
    (0 before the first batch; updated after use, b <- m * b + (1 - m) * mean(s)). Returns = scores.
    """
    cfg = config or AlgorithmConfig()
    scores = _as_float(sequence_scores(rewards, response_mask))
    if cfg.reinforce_baseline == "none":
        baseline = torch.zeros((), device=scores.device)
    elif cfg.reinforce_baseline == "batch_mean":
        baseline = scores.mean()
    else:
        if state is None:
            raise ValueError(
                "algorithm.reinforce_baseline=running_mean needs a state dict kept across steps (state=...)"
            )
        baseline = torch.as_tensor(state.get("reinforce_baseline", 0.0), device=scores.device)
        m = cfg.reinforce_baseline_momentum
        state["reinforce_baseline"] = float(m * baseline + (1 - m) * scores.mean())
    return _broadcast(scores - baseline, response_mask), _broadcast(scores, response_mask)


@register_advantage("reinforce_plus_plus", "reinforce++", token_level=True)
@torch.no_grad()
def reinforce_plus_plus(
    rewards: Tensor,
    response_mask: Tensor,
    *,
    config: AlgorithmConfig | None = None,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    state: dict | None = None,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025): token-level discounted return, whitened over the batch.

        G_t = r_t + gamma * G_{t+1}        r_t = score on the last token - kl_coef * KL_t (KL in reward)
        A_t = (G_t - mean_batch(G)) / std_batch(G)    over all generated tokens of the batch

    Returns = G.
    """
    cfg = config or AlgorithmConfig()
    r = _as_float(token_rewards(rewards, response_mask))
    returns = _discounted_returns(r, response_mask, cfg.gamma)
    return masked_whiten(returns, response_mask), returns


@register_advantage("reinforce_plus_plus_baseline", "reinforce++_baseline")
@torch.no_grad()
def reinforce_plus_plus_baseline(
    rewards: Tensor,
    response_mask: Tensor,
    *,
    config: AlgorithmConfig | None = None,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    state: dict | None = None,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with a group-mean baseline (Hu 2025, "REINFORCE++-baseline").

        A'_i = s_i - mean_g(s)     broadcast over tokens, then whitened over all generated tokens
                                   of the batch: A_it = (A'_i - mean(A')) / std(A')

    Groups of one keep ``A'_i = s_i``. Returns = the broadcast scores.
    """
    scores = _as_float(sequence_scores(rewards, response_mask))
    mean, _, _ = group_mean_std(scores, _need_groups(group_ids, "reinforce_plus_plus_baseline", scores))
    centred = _broadcast(scores - mean, response_mask)
    return masked_whiten(centred, response_mask), _broadcast(scores, response_mask)


def compute_advantages(
    rewards: Tensor,
    response_mask: Tensor,
    config: AlgorithmConfig,
    *,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    state: dict | None = None,
) -> tuple[Tensor, Tensor]:
    """Run the estimator named by ``config.advantage``."""
    fn = get_advantage_estimator(config.advantage)
    return fn(rewards, response_mask, config=config, group_ids=group_ids, values=values, state=state)


def advantage_metrics(advantages: Tensor, returns: Tensor, response_mask: Tensor) -> dict[str, Tensor]:
    """Diagnostics: mean / max / min of advantages and returns over generated tokens."""
    mask = response_mask.bool()
    out = {"adv_mean": masked_mean(advantages, mask), "ret_mean": masked_mean(returns, mask)}
    if mask.any():
        out["adv_max"], out["adv_min"] = advantages[mask].max(), advantages[mask].min()
    return out
