"""Configuration of the RL algorithm (section ``algorithm``).

Every string naming an estimator, loss, KL estimator or aggregation is a name in one of the registries
of :mod:`searchr1.algorithms.registry` (a user-registered name too); the assembled config checks the
names (``searchr1.plugins``), ``validate`` the numeric ranges, each error naming the dotted key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass
class AlgorithmConfig:
    # -- advantage estimation ---------------------------------------------------------------------
    advantage: str = "grpo"
    """Advantage estimator by registered name (`--list-keys` lists them; a plugin adds its own)."""
    gamma: float = 1.0
    """Discount factor over generated tokens (gae, reinforce_plus_plus)."""
    lam: float = 1.0
    """GAE lambda (bias/variance trade-off of gae; 1 = Monte-Carlo return minus value)."""
    gae_whiten: bool = True
    """gae: whiten the advantages over the batch's generated tokens, (A - mean) / std, as veRL and Search-R1's PPO do (false: raw GAE)."""
    norm_adv_by_std: bool = True
    """grpo: divide by the group std (false = Dr. GRPO, Liu et al. 2025: reward minus group mean only)."""
    adv_eps: float = 1e-6
    """Epsilon added to the group std in grpo (avoids division by zero)."""
    step_credit_coef: float = 1.0
    """Weight c of the step rewards (reward.step_gain / reward.step_redundancy, off by default): outcome estimators (grpo, ...) add c x the step advantage (the step rewards normalised over the group's search turns) to each search turn's tokens; token-level ones (gae, reinforce_plus_plus) add c x the step reward to the token rewards at the turn's last token (searchr1.algorithms.step_credit)."""
    reinforce_baseline: Literal["none", "batch_mean", "running_mean"] = "none"
    """reinforce: baseline subtracted from the reward (running_mean = EMA over previous batches)."""
    reinforce_baseline_momentum: float = 0.9
    """reinforce running_mean baseline: b <- m * b + (1 - m) * batch mean reward."""
    # -- policy loss ------------------------------------------------------------------------------
    policy_loss: str = "ppo"
    """Policy loss by registered name: ppo (clip-higher, dual clip), gspo, vanilla, or a plugin's."""
    loss_agg: str = "token-mean"
    """Loss aggregation by registered name (token-mean, seq-mean-token-sum, ...)."""
    loss_agg_norm_len: int = 0
    """seq-mean-token-sum-norm: constant token budget dividing each sequence sum (0 = padded response length)."""
    clip_ratio_low: float = 0.2
    """PPO/GSPO lower clip: ratio is clipped at 1 - clip_ratio_low (GSPO paper: 3e-4)."""
    clip_ratio_high: float = 0.2
    """PPO/GSPO upper clip: ratio is clipped at 1 + clip_ratio_high (DAPO clip-higher: 0.28; GSPO: 4e-4)."""
    clip_ratio_c: float = 3.0
    """Dual-clip constant c > 1 bounding the loss of negative advantages at -c*A (Ye et al. 2020); 0 disables."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (loss -= entropy_coef * entropy)."""
    value_clip: float = 0.5
    """PPO critic: new values are clipped to old_values +- value_clip (0 disables)."""
    llds_coef: float = 0.0
    """Weight of the LLDS likelihood-preserving term (Deng et al. 2025); 0 = off. It acts only where a token's log-prob fell below the rollout policy's: after the first optimizer step of a batch (ppo_epochs > 1 or several mini-batches)."""
    llds_threshold: float = 0.0
    """LLDS: a response is regularised only when its summed log-likelihood fell by more than this."""
    llds_positive_only: bool = True
    """LLDS: regularise only responses with a positive advantage (the displaced likelihood of good answers)."""
    filter_groups: bool = False
    """Drop groups whose rewards are all equal from the update (DAPO's dynamic sampling without the refill, Yu et al. 2025): under group baselines they carry no advantage, so the gradient's direction is unchanged and the update is cheaper; a step with no such group makes no update."""
    # -- KL regularisation ------------------------------------------------------------------------
    use_kl_loss: bool = True
    """Add kl_coef * KL(policy || reference) to the actor loss (GRPO style)."""
    use_kl_in_reward: bool = False
    """Subtract kl_coef * per-token KL from the token rewards before advantages (PPO/RLHF style)."""
    kl_coef: float = 0.001
    """KL weight (the initial value when kl_ctrl=adaptive)."""
    kl_estimator: str = "low_var_kl"
    """Per-token KL estimator on sampled tokens by registered name: kl (k1), mse (k2), low_var_kl (k3), abs, k3+ (k3 value, k2 gradient)."""
    kl_loss_type: Literal["token", "full_reverse", "full_forward"] = "token"
    """KL in the loss: token (kl_estimator on the sampled token) | full_reverse KL(pi||ref) | full_forward KL(ref||pi) over the vocabulary."""
    kl_topk_tokens: int = 0
    """full_*: restrict the exact sum to the top-k tokens plus a sampled tail correction (EMA-PG: 32); 0 = whole vocabulary."""
    kl_topk_tail: bool = True
    """Top-k KL: add the sampled-token tail correction that makes the estimate unbiased (false = truncated KL)."""
    use_kl_iw: bool = False
    """Top-k KL: importance-weight the sampled tail term by target/sampling probability ratio (EMA-PG: true)."""
    kl_chunk_size: int = 512
    """Sequence positions per chunk when computing vocabulary KL / entropy from logits (bounds memory)."""
    kl_ctrl: Literal["fixed", "adaptive"] = "fixed"
    """KL coefficient controller (in-reward KL): fixed | adaptive (Ziegler et al. 2019)."""
    kl_target: float = 0.1
    """Adaptive KL controller: target KL per sequence."""
    kl_horizon: int = 10000
    """Adaptive KL controller: horizon (samples) over which the coefficient adapts."""
    # -- reference policy -------------------------------------------------------------------------
    ref_policy: Literal["frozen", "ema"] = "frozen"
    """Reference (anchor) policy of the KL: frozen initial weights | ema of the policy (EMA-PG)."""
    ref_policy_ema_tau: float = 0.9
    """EMA reference: ref <- tau * ref + (1 - tau) * policy (EMA-PG: 0.9)."""
    ref_policy_ema_update_period: int = 10
    """EMA reference: apply the EMA update every N training steps (EMA-PG: 10)."""

    def validate(self, root: Any = None) -> None:
        """Check the numeric ranges and combinations; errors name the dotted key. (The names are checked
        against the registries where the config is assembled: ``searchr1.plugins.check_names``.)"""
        checks = [
            ("gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]"),
            ("lam", 0.0 <= self.lam <= 1.0, "must be in [0, 1]"),
            ("adv_eps", self.adv_eps >= 0.0, "must be >= 0"),
            ("step_credit_coef", 0.0 <= self.step_credit_coef < float("inf"), "must be a finite number >= 0"),
            (
                "reinforce_baseline_momentum",
                0.0 <= self.reinforce_baseline_momentum < 1.0,
                "must be in [0, 1)",
            ),
            ("loss_agg_norm_len", self.loss_agg_norm_len >= 0, "must be >= 0"),
            ("clip_ratio_low", 0.0 <= self.clip_ratio_low < 1.0, "must be in [0, 1)"),
            ("clip_ratio_high", self.clip_ratio_high >= 0.0, "must be >= 0"),
            ("clip_ratio_c", self.clip_ratio_c == 0.0 or self.clip_ratio_c > 1.0, "must be 0 (off) or > 1"),
            ("value_clip", self.value_clip >= 0.0, "must be >= 0"),
            ("llds_coef", self.llds_coef >= 0.0, "must be >= 0"),
            ("llds_threshold", self.llds_threshold >= 0.0, "must be >= 0"),
            ("kl_coef", self.kl_coef >= 0.0, "must be >= 0"),
            ("kl_topk_tokens", self.kl_topk_tokens >= 0, "must be >= 0"),
            ("kl_chunk_size", self.kl_chunk_size >= 1, "must be >= 1"),
            ("kl_target", self.kl_target > 0.0, "must be > 0"),
            ("kl_horizon", self.kl_horizon >= 1, "must be >= 1"),
            ("ref_policy_ema_tau", 0.0 <= self.ref_policy_ema_tau <= 1.0, "must be in [0, 1]"),
            ("ref_policy_ema_update_period", self.ref_policy_ema_update_period >= 1, "must be >= 1"),
        ]
        for key, ok, why in checks:
            if not ok:
                raise ValueError(f"algorithm.{key}: {why}, got {getattr(self, key)!r}")
        if self.use_kl_loss and self.use_kl_in_reward:
            raise ValueError(
                "algorithm.use_kl_loss and algorithm.use_kl_in_reward are both true: choose one place "
                "for the KL penalty (loss = GRPO style, reward = PPO style)"
            )
        if self.kl_topk_tokens > 0 and self.kl_loss_type == "token":
            raise ValueError(
                "algorithm.kl_topk_tokens > 0 needs algorithm.kl_loss_type=full_reverse or full_forward"
            )

    @property
    def uses_reference(self) -> bool:
        """Whether a reference policy is needed at all (KL in the loss or the reward, with kl_coef > 0)."""
        return (self.use_kl_loss or self.use_kl_in_reward) and self.kl_coef > 0.0
