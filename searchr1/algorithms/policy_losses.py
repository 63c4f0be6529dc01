"""Policy losses (registered by name, ``algorithm.policy_loss``) and the PPO value loss.

Uniform signature (see :mod:`searchr1.algorithms`)::

    fn(log_prob, old_log_prob, advantages, response_mask, *, config=None, loss_agg=None, norms=None)
        -> (loss: scalar Tensor, metrics: dict[str, Tensor])

``log_prob`` ``[B, T]`` carries the gradient (log pi_theta of the sampled tokens), ``old_log_prob``
is the behaviour policy's (no gradient), ``advantages`` ``[B, T]`` (no gradient). The per-token loss
is reduced with :func:`agg_loss` (mode ``loss_agg`` or ``config.loss_agg``, mini-batch ``norms`` for
gradient accumulation). Metrics are detached 0-d tensors, masked means over generated tokens of the
call's batch; the trainer prefixes them (``actor/pg_clipfrac``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from searchr1.algorithms.aggregation import AggNorms, agg_loss, masked_mean, masked_var
from searchr1.algorithms.config import AlgorithmConfig
from searchr1.algorithms.registry import get_policy_loss, register_policy_loss

LOG_RATIO_CLAMP = 20.0
"""|log pi/pi_old| is clamped here before exp (a far off-policy token must not overflow)."""


def _zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` with masked positions set to 0 (so padding garbage, even inf, cannot reach a gradient)."""
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _ratio_metrics(log_ratio: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """ppo_kl = mean(-log r) (k1 of KL(old||new)); approx_kl = mean((r - 1) - log r) (k3)."""
    lr = log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(lr)
    return {
        "ppo_kl": masked_mean(-lr, mask),
        "approx_kl": masked_mean((ratio - 1) - lr, mask),
        "ratio_mean": masked_mean(ratio, mask),
    }


def _clipped_surrogate(
    ratio: Tensor, advantages: Tensor, mask: Tensor, cfg: AlgorithmConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """max(-A r, -A clip(r, 1-eps_low, 1+eps_high)), then min(., -c A) where A < 0 (dual clip)."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    loss_mat = torch.maximum(unclipped, clipped)
    metrics = {"pg_clipfrac": masked_mean((clipped > unclipped).to(ratio.dtype).detach(), mask)}
    if cfg.clip_ratio_c > 0:
        bound = -advantages * cfg.clip_ratio_c
        negative = advantages < 0
        lower_clipped = negative & (loss_mat > bound)
        loss_mat = torch.where(negative, torch.minimum(loss_mat, bound), loss_mat)
        metrics["pg_clipfrac_lower"] = masked_mean(lower_clipped.to(ratio.dtype), mask)
    return loss_mat, metrics


@register_policy_loss("ppo")
def ppo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    config: AlgorithmConfig | None = None,
    loss_agg: str | None = None,
    norms: AggNorms | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017) with clip-higher and dual clip.

        r_t  = exp(log pi(y_t) - log pi_old(y_t))
        l_t  = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))
        l_t  = min(l_t, -c A_t)   where A_t < 0            (dual clip, Ye et al. 2020, c > 1)

    ``eps_high > eps_low`` is DAPO's clip-higher (Yu et al. 2025). Metrics: pg_clipfrac (tokens
    where the clipped branch is active), pg_clipfrac_lower (dual clip active), ppo_kl, approx_kl.
    """
    cfg = config or AlgorithmConfig()
    mask = response_mask.bool()
    advantages = _zero_masked(advantages, mask)
    log_ratio = _zero_masked(log_prob - old_log_prob, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    loss_mat, metrics = _clipped_surrogate(torch.exp(log_ratio), advantages, mask, cfg)
    loss = agg_loss(loss_mat, mask, loss_agg or cfg.loss_agg, norms=norms)
    return loss, {**metrics, **_ratio_metrics(log_ratio, mask)}


@register_policy_loss("gspo")
def gspo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    config: AlgorithmConfig | None = None,
    loss_agg: str | None = None,
    norms: AggNorms | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: group sequence policy optimisation (Zheng et al. 2025), sequence-level ratio.

        log s_i  = (1 / |y_i|) sum_t (log pi(y_it) - log pi_old(y_it))      (length-normalised)
        s_it     = sg(s_i) * pi(y_it) / sg(pi(y_it))    (value s_i, gradient s_i * grad log pi(y_it))
        l_it     = max(-A_i s_it, -A_i clip(s_it, 1 - eps_low, 1 + eps_high))

    The paper clips with eps_low = 3e-4, eps_high = 4e-4 and averages with seq-mean-token-mean;
    both come from the config here. The dual clip does not apply.
    """
    cfg = config or AlgorithmConfig()
    mask = response_mask.bool()
    advantages = _zero_masked(advantages, mask)
    log_prob = _zero_masked(log_prob, mask)
    token_log_ratio = _zero_masked(log_prob - old_log_prob, mask)
    seq_log_ratio = token_log_ratio.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    log_s = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(log_s.clamp(max=10.0))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    loss_mat = torch.maximum(unclipped, clipped)
    loss = agg_loss(loss_mat, mask, loss_agg or cfg.loss_agg, norms=norms)
    metrics = {"pg_clipfrac": masked_mean((clipped > unclipped).to(ratio.dtype).detach(), mask)}
    return loss, {**metrics, **_ratio_metrics(token_log_ratio, mask)}


@register_policy_loss("vanilla", "reinforce")
def vanilla_pg_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    config: AlgorithmConfig | None = None,
    loss_agg: str | None = None,
    norms: AggNorms | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Vanilla policy gradient, no ratio (Williams 1992): l_t = -A_t log pi(y_t).

    Correct only on-policy (one update per rollout batch, old = current policy); ``old_log_prob``
    is used for the diagnostics only.
    """
    cfg = config or AlgorithmConfig()
    mask = response_mask.bool()
    loss_mat = -_zero_masked(advantages, mask) * _zero_masked(log_prob, mask)
    loss = agg_loss(loss_mat, mask, loss_agg or cfg.loss_agg, norms=norms)
    log_ratio = _zero_masked(log_prob - old_log_prob, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return loss, _ratio_metrics(log_ratio, mask)


def llds_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    config: AlgorithmConfig | None = None,
    loss_agg: str | None = None,
    norms: AggNorms | None = None,
) -> Tensor:
    """LLDS, the likelihood-preserving regulariser of Deng et al. 2025 ("On GRPO Collapse in Search-R1:
    the Lazy Likelihood-Displacement Death Spiral", arXiv 2512.04220), as read from the paper:

        d_it = log pi_old(y_it) - log pi(y_it)           how far token t's likelihood fell
        D_i  = sum_t m_it d_it                           the response's log-likelihood drop
        g_i  = [D_i > tau] * [A_i > 0 if positive_only]  act only on responses whose likelihood fell
        l_it = g_i * max(d_it, 0)                        and only on the tokens that fell
        L    = agg(l)                                    (loss_agg, like the policy loss)

    (tau = ``llds_threshold``; A_i the response's advantage, its mean over generated tokens.) It is
    zero while pi = pi_old, so it acts from the second optimizer step on one rollout batch
    (``ppo_epochs > 1`` or several mini-batches), never in a one-step on-policy update.
    """
    cfg = config or AlgorithmConfig()
    mask = response_mask.bool()
    drop = _zero_masked(old_log_prob - log_prob, mask)
    gate = drop.detach().sum(dim=-1) > cfg.llds_threshold
    if cfg.llds_positive_only:
        adv = _zero_masked(advantages, mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
        gate &= adv > 0
    loss_mat = drop.clamp(min=0.0) * gate.unsqueeze(-1).to(drop.dtype)
    return agg_loss(loss_mat, mask, loss_agg or cfg.loss_agg, norms=norms)


def shaped_off_policy_loss(
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    gamma: float,
    loss_agg: str,
    norms: AggNorms | None = None,
) -> tuple[Tensor, Tensor]:
    """Policy shaping for off-policy tokens (LUFFY, Yan et al. 2025, arXiv 2504.14945): tokens the policy
    did not sample (a gold trajectory) are trained without a ratio to a behaviour policy and without
    clipping, through f(pi) = pi / (pi + gamma):

        pi_t = exp(log pi_theta(y_t))
        l_t  = -A_t * pi_t / (pi_t + gamma)
        dl_t / d log pi_t = -A_t * w_t,   w_t = gamma * pi_t / (pi_t + gamma)^2

    Compared with importance sampling against a behaviour policy of 1 (l_t = -A_t pi_t, weight pi_t), the
    weight of a token the policy finds unlikely (pi << gamma) is about pi / gamma: gamma times larger, so
    the rare actions of the guide are not lost. Returns the aggregated loss (``loss_agg``, mini-batch
    ``norms``) and w_t ``[B, T]`` (detached; 0 outside the mask) for the ``guidance/shaping_weight``
    metric."""
    mask = response_mask.bool()
    prob = torch.exp(_zero_masked(log_prob, mask).clamp(max=0.0))
    shaped = prob / (prob + gamma)
    loss_mat = -_zero_masked(advantages, mask) * shaped
    weight = _zero_masked((gamma * prob / (prob + gamma) ** 2).detach(), mask)
    return agg_loss(loss_mat, mask, loss_agg, norms=norms), weight


def compute_policy_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    config: AlgorithmConfig,
    *,
    norms: AggNorms | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Run the policy loss named by ``config.policy_loss``."""
    fn = get_policy_loss(config.policy_loss)
    return fn(log_prob, old_log_prob, advantages, response_mask, config=config, norms=norms)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    *,
    config: AlgorithmConfig | None = None,
    loss_agg: str | None = None,
    norms: AggNorms | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped PPO value loss (Schulman et al. 2017; the clipping of OpenAI baselines ppo2).

        V_clip = V_old + clip(V - V_old, -c, c)
        l_t    = 0.5 * max((V - R)^2, (V_clip - R)^2)          (c = value_clip; 0 = no clipping)

    Metrics: vf_clipfrac (tokens where the clipped error is the larger), vpred_mean,
    vf_explained_var (1 - Var(R - V) / Var(R)).
    """
    cfg = config or AlgorithmConfig()
    mask = response_mask.bool()
    values, old_values, returns = (_zero_masked(x, mask) for x in (values, old_values, returns))
    err = (values - returns) ** 2
    if cfg.value_clip > 0:
        clipped = old_values + (values - old_values).clamp(-cfg.value_clip, cfg.value_clip)
        err_clipped = (clipped - returns) ** 2
        loss_mat = 0.5 * torch.maximum(err, err_clipped)
        clipfrac = masked_mean((err_clipped > err).to(values.dtype).detach(), mask)
    else:
        loss_mat = 0.5 * err
        clipfrac = torch.zeros((), device=values.device)
    loss = agg_loss(loss_mat, mask, loss_agg or cfg.loss_agg, norms=norms)
    metrics = {
        "vf_clipfrac": clipfrac,
        "vpred_mean": masked_mean(values.detach(), mask),
        "vf_explained_var": explained_variance(values.detach(), returns, mask),
    }
    return loss, metrics


def explained_variance(values: Tensor, returns: Tensor, response_mask: Tensor) -> Tensor:
    """1 - Var(R - V) / Var(R) over generated tokens (1 = perfect critic, <= 0 = useless)."""

    var_r = masked_var(returns, response_mask)
    return 1.0 - masked_var(returns - values, response_mask) / var_r.clamp(min=1e-8)
