"""KL regularisation: per-token estimators, vocabulary KL, top-k KL, KL controllers.

Per-token estimators (registered, ``algorithm.kl_estimator``) take the log-probs of the *sampled*
tokens under the policy and the reference, ``fn(log_prob, ref_log_prob) -> [B, T]``, and estimate
KL(pi || ref) with samples y ~ pi (Schulman 2020, "Approximating KL Divergence"), with
``d = log pi(y) - log ref(y)``:

* ``kl`` / ``k1``:          d                              unbiased, high variance, can be < 0
* ``abs``:                  |d|
* ``mse`` / ``k2``:         d^2 / 2                        low variance, biased; gradient = grad of KL
* ``low_var_kl`` / ``k3``:  exp(-d) - 1 + d  (>= 0)        unbiased, low variance; clamped to [-10, 10]
* ``k3+`` / ``low_var_kl+``: value of k3, gradient of k2 (straight-through)

Vocabulary KL from logits (``kl_loss_type=full_reverse | full_forward``): exact, or restricted to
the top-k tokens plus a sampled tail (EMA-PG, Zhang & Ba 2026, "EMA Policy Gradient").
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from searchr1.algorithms.config import AlgorithmConfig
from searchr1.algorithms.logits import chunked_over_sequence, log_probs_from_logits, topk_log_probs, upcast
from searchr1.algorithms.registry import get_kl_estimator, register_kl_estimator

Direction = Literal["reverse", "forward"]
LOG_RATIO_CLAMP = 20.0


# ---------------------------------------------------------------------------------------------
# per-token estimators on sampled tokens
# ---------------------------------------------------------------------------------------------


@register_kl_estimator("kl", "k1")
def kl_k1(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k1 = log pi(y) - log ref(y)."""
    return log_prob - ref_log_prob


@register_kl_estimator("abs")
def kl_abs(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """|log pi(y) - log ref(y)|."""
    return (log_prob - ref_log_prob).abs()


@register_kl_estimator("mse", "k2")
def kl_k2(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k2 = (log pi(y) - log ref(y))^2 / 2."""
    return 0.5 * (log_prob - ref_log_prob).square()


@register_kl_estimator("low_var_kl", "k3")
def kl_k3(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k3 = ref/pi - 1 - log(ref/pi) >= 0, with log(ref/pi) clamped to +-20 and k3 to [-10, 10]."""
    log_r = (ref_log_prob - log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(log_r) - log_r - 1.0).clamp(-10.0, 10.0)


@register_kl_estimator("k3+", "low_var_kl+")
def kl_k3_straight_through(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """Straight-through: the value of k3 with the (unbiased-gradient) k2 gradient."""
    k2 = kl_k2(log_prob, ref_log_prob)
    return kl_k3(log_prob, ref_log_prob).detach() + k2 - k2.detach()


def kl_penalty(log_prob: Tensor, ref_log_prob: Tensor, estimator: str = "low_var_kl") -> Tensor:
    """Per-token KL ``[B, T]`` with the registered estimator ``estimator``."""
    return get_kl_estimator(estimator)(log_prob, ref_log_prob)


# ---------------------------------------------------------------------------------------------
# vocabulary KL from logits
# ---------------------------------------------------------------------------------------------


def full_kl_from_logits(
    logits: Tensor, ref_logits: Tensor, direction: Direction = "reverse", chunk_size: int | None = None
) -> Tensor:
    """Exact KL per position over the vocabulary, ``[B, T]``.

    reverse: KL(pi || ref) = sum_v pi_v (log pi_v - log ref_v)
    forward: KL(ref || pi) = sum_v ref_v (log ref_v - log pi_v)
    """

    def kl(x: Tensor, y: Tensor) -> Tensor:
        lp, lr = torch.log_softmax(upcast(x), dim=-1), torch.log_softmax(upcast(y), dim=-1)
        if direction == "reverse":
            return (lp.exp() * (lp - lr)).sum(dim=-1)
        return (lr.exp() * (lr - lp)).sum(dim=-1)

    _check_direction(direction)
    return chunked_over_sequence(kl, logits, ref_logits, chunk_size=chunk_size)


def topk_kl(
    topk_log_prob: Tensor,
    topk_ref_log_prob: Tensor,
    *,
    direction: Direction = "reverse",
    log_prob: Tensor | None = None,
    ref_log_prob: Tensor | None = None,
    old_log_prob: Tensor | None = None,
    sampled_in_topk: Tensor | None = None,
    tail: bool = True,
    use_iw: bool = False,
) -> Tensor:
    """Top-k KL (EMA-PG, Zhang & Ba 2026) from log-probs gathered at a top-k set S per position.

    S is the top-k of the distribution the expectation is under (the policy for reverse KL, the
    reference for forward KL), fixed before the gradient. ``topk_*`` are ``[B, T, k]`` full-vocabulary
    log-probs at S. With y the sampled token (drawn from the behaviour policy pi_old):

        reverse:  sum_{v in S} pi_v (log pi_v - log ref_v)   +  1[y not in S] w (log pi_y - log ref_y)
        forward:  sum_{v in S} ref_v (log ref_v - log pi_v)  +  1[y not in S] w (log ref_y - log pi_y)

    The head is exact; the tail term corrects for the mass outside S. ``use_iw``: w = pi_y/pi_old_y
    (reverse, with gradient through pi_y) or ref_y/pi_old_y (forward): unbiased values and gradients
    for any pi_old. Without it, reverse uses w = pi_y / sg(pi_y) (value 1, score-function gradient;
    unbiased on-policy) and forward w = 1. ``tail=False`` gives the truncated KL. k = |V| is exact KL.
    ``log_prob``, ``ref_log_prob``, ``old_log_prob`` ``[B, T]`` are the sampled token's log-probs
    and ``sampled_in_topk`` ``[B, T]`` says whether y is in S (all needed only for the tail).
    """
    _check_direction(direction)
    p, r = upcast(topk_log_prob), upcast(topk_ref_log_prob)
    if direction == "reverse":
        head = (p.exp() * (p - r)).sum(dim=-1)
    else:
        head = (r.exp() * (r - p)).sum(dim=-1)
    if not tail:
        return head
    if log_prob is None or ref_log_prob is None or sampled_in_topk is None:
        raise ValueError("topk_kl with tail=True needs log_prob, ref_log_prob and sampled_in_topk")
    if old_log_prob is None:
        old_log_prob = log_prob.detach()
    if direction == "reverse":
        log_w = log_prob - (old_log_prob if use_iw else log_prob.detach())
        sampled = log_prob - ref_log_prob
    else:
        log_w = (ref_log_prob - old_log_prob) if use_iw else torch.zeros_like(log_prob)
        sampled = ref_log_prob - log_prob
    weight = torch.exp(log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    tail_term = torch.where(sampled_in_topk.bool(), 0.0, weight * sampled)
    return head + tail_term


def vocab_kl(
    logits: Tensor,
    ref_logits: Tensor,
    tokens: Tensor,
    *,
    direction: Direction = "reverse",
    topk: int = 0,
    tail: bool = True,
    use_iw: bool = False,
    old_log_prob: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """Per-token vocabulary KL ``[B, T]`` from both models' logits: exact (``topk=0``) or top-k.

    Convenience for when both ``[B, T, V]`` logits are at hand (small models). At scale, gather the
    top-k log-probs inside each model's forward with :func:`topk_log_probs` and call :func:`topk_kl`,
    so no ``[B, T, V]`` tensor of the reference is ever stored.
    """
    _check_direction(direction)
    if topk <= 0:
        return full_kl_from_logits(logits, ref_logits, direction, chunk_size)
    source = logits if direction == "reverse" else ref_logits
    _, indices = topk_log_probs(source.detach(), topk, chunk_size=chunk_size)
    p_s, _ = topk_log_probs(logits, indices=indices, chunk_size=chunk_size)
    r_s, _ = topk_log_probs(ref_logits, indices=indices, chunk_size=chunk_size)
    log_prob = log_probs_from_logits(logits, tokens, chunk_size)
    ref_log_prob = log_probs_from_logits(ref_logits, tokens, chunk_size)
    in_topk = (indices == tokens.unsqueeze(-1)).any(dim=-1)
    return topk_kl(
        p_s,
        r_s,
        direction=direction,
        log_prob=log_prob,
        ref_log_prob=ref_log_prob,
        old_log_prob=old_log_prob,
        sampled_in_topk=in_topk,
        tail=tail,
        use_iw=use_iw,
    )


def kl_loss_matrix(
    config: AlgorithmConfig,
    *,
    log_prob: Tensor,
    ref_log_prob: Tensor,
    old_log_prob: Tensor | None = None,
    logits: Tensor | None = None,
    ref_logits: Tensor | None = None,
    tokens: Tensor | None = None,
) -> Tensor:
    """Per-token KL ``[B, T]`` for the KL loss as the config asks (``kl_loss_type``).

    ``token`` needs only the sampled tokens' log-probs; ``full_*`` also the logits of both models
    and the sampled ``tokens`` (``kl_topk_tokens``, ``kl_topk_tail``, ``use_kl_iw``, ``kl_chunk_size``).
    Aggregate it with :func:`agg_loss` and add ``kl_coef *`` it to the loss.
    """
    if config.kl_loss_type == "token":
        return kl_penalty(log_prob, ref_log_prob, config.kl_estimator)
    if logits is None or ref_logits is None or tokens is None:
        raise ValueError(f"algorithm.kl_loss_type={config.kl_loss_type} needs logits, ref_logits and tokens")
    direction: Direction = "reverse" if config.kl_loss_type == "full_reverse" else "forward"
    return vocab_kl(
        logits,
        ref_logits,
        tokens,
        direction=direction,
        topk=config.kl_topk_tokens,
        tail=config.kl_topk_tail,
        use_iw=config.use_kl_iw,
        old_log_prob=old_log_prob,
        chunk_size=config.kl_chunk_size,
    )


def _check_direction(direction: str) -> None:
    if direction not in ("reverse", "forward"):
        raise ValueError(f"KL direction must be 'reverse' or 'forward', got {direction!r}")


# ---------------------------------------------------------------------------------------------
# KL in the reward
# ---------------------------------------------------------------------------------------------


def apply_kl_penalty(token_rewards: Tensor, kl: Tensor, response_mask: Tensor, kl_coef: float) -> Tensor:
    """r'_t = r_t - kl_coef * KL_t on generated tokens (PPO/RLHF style, Ziegler et al. 2019)."""
    return token_rewards - kl_coef * torch.where(response_mask.bool(), kl.detach(), 0.0)


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: float) -> None:
        """No-op."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, "Fine-Tuning Language Models from Human
    Preferences"): a proportional controller driving the observed KL towards ``target``.

        e = clip(KL / target - 1, -0.2, 0.2);    beta <- beta * (1 + e * n_steps / horizon)
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int) -> None:
        self.value = init_kl_coef
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: float) -> None:
        """Adapt after observing ``current_kl`` (mean per-sequence KL) on ``n_steps`` samples."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def build_kl_controller(config: AlgorithmConfig) -> FixedKLController | AdaptiveKLController:
    """The controller named by ``config.kl_ctrl``."""
    if config.kl_ctrl == "adaptive":
        return AdaptiveKLController(config.kl_coef, config.kl_target, config.kl_horizon)
    return FixedKLController(config.kl_coef)


def vocab_kl_matrix(
    algo: Any,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    logits: torch.Tensor,
    ref_logits: torch.Tensor,
    input_ids: torch.Tensor,
    valid: torch.Tensor,
) -> torch.Tensor:
    """``[B, T]`` KL over the vocabulary (full or top-k, ``algorithm.kl_loss_type``) at the ``valid``
    positions, from the ``[N, V]`` logits of policy and reference there (``kl_loss_matrix`` on one row of
    the N valid positions, scattered back; zero elsewhere)."""
    tokens = input_ids[valid]
    kl_rows = kl_loss_matrix(
        algo,
        log_prob=logprobs[valid][None],
        ref_log_prob=ref_logprobs[valid][None],
        old_log_prob=old_logprobs[valid][None],
        logits=logits[None],
        ref_logits=ref_logits[None],
        tokens=tokens[None],
    )[0]
    return kl_rows.new_zeros(valid.shape).masked_scatter(valid, kl_rows)
