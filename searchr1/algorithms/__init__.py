"""searchr1.algorithms: advantage estimators, policy losses, KL, loss aggregation, reference policy.

Pure-torch functions on padded ``[B, T]`` tensors with a ``response_mask`` (1 = token the policy
generated; 0 = prompt, padding and retrieved ``<information>`` tokens). Masked positions never
influence a value or a gradient. Every name below is selected by a config string through a registry,
and a user adds one with a decorator, without touching the trainer.

Contracts
---------
Advantage estimator (``algorithm.advantage``; ``register_advantage``)::

    fn(rewards, response_mask, *, config=None, group_ids=None, values=None, state=None)
        -> (advantages [B, T], returns [B, T])

    rewards: [B] outcome scores or [B, T] token rewards; group_ids: one hashable id per sample (or a
    tensor); values: critic [B, T] (gae); state: dict kept by the trainer across steps.
    Built-ins: gae, grpo (norm_adv_by_std=false: Dr. GRPO), rloo, reinforce,
    reinforce_plus_plus, reinforce_plus_plus_baseline.
    What the trainer must know is registered with it (``AdvantageTraits``; ``advantage_traits(name)``):
    ``register_advantage("gae", needs_critic=True)`` (a critic is built and trained),
    ``register_advantage("rloo", min_group_size=2)`` (the config requires ``rollout.n >= 2``).

Presets (``presets.py``): ``ALGORITHM_PRESETS`` maps ``SearchR1Trainer(rl_algorithm=...)`` names
(ppo, grpo, rloo, reinforce, reinforce_plus_plus) to dotted config overrides; ``KNOWN_ALGORITHMS``.

Policy loss (``algorithm.policy_loss``; ``register_policy_loss``)::

    fn(log_prob, old_log_prob, advantages, response_mask, *, config=None, loss_agg=None, norms=None)
        -> (loss scalar, metrics dict[str, 0-d Tensor])     metrics: pg_clipfrac, ppo_kl, approx_kl...

    Built-ins: ppo (clip-higher, dual clip), gspo, vanilla. Critic: ``value_loss`` (same shape).

KL estimator (``algorithm.kl_estimator``; ``register_kl_estimator``)::

    fn(log_prob, ref_log_prob) -> kl [B, T]        kl|k1, mse|k2, low_var_kl|k3, abs, k3+|low_var_kl+

Loss aggregation (``algorithm.loss_agg``; ``register_loss_agg``)::

    fn(loss_mat [B, T], mask [B, T] bool, norms: AggNorms | None) -> scalar
    agg_loss(loss_mat, mask, mode, norms=AggNorms.of(minibatch_mask))    # micro-batch safe

Actor step, per micro-batch (``norms = AggNorms.of(mini_batch_mask)`` shared by all micro-batches)::

    loss, m = compute_policy_loss(logp, old_logp, adv, mask, cfg, norms=norms)
    if cfg.use_kl_loss:   loss += kl_coef * agg_loss(kl_loss_matrix(cfg, log_prob=logp, ref_log_prob=ref_logp), mask, cfg.loss_agg, norms=norms)
    if cfg.entropy_coef:  loss -= cfg.entropy_coef * agg_loss(entropy_from_logits(logits), mask, cfg.loss_agg, norms=norms)
    loss.backward()

KL in the reward: ``token_rewards = apply_kl_penalty(scores_to_token_rewards(scores, mask),
kl_penalty(old_logp, ref_logp, cfg.kl_estimator), mask, ctrl.value)`` then ``ctrl.update(...)``
with ``ctrl = build_kl_controller(cfg)``. Reference: ``ref = make_reference(policy, cfg)``;
``ref.step(policy)`` after each optimiser step (EMA every ``ref_policy_ema_update_period`` steps).

Names are re-exported lazily here (importing ``searchr1.algorithms.config`` must not import torch).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # registries
    "ADVANTAGE_ESTIMATORS": "registry",
    "POLICY_LOSSES": "registry",
    "KL_ESTIMATORS": "registry",
    "LOSS_AGGREGATIONS": "registry",
    "register_advantage": "registry",
    "register_policy_loss": "registry",
    "register_kl_estimator": "registry",
    "register_loss_agg": "registry",
    "get_advantage_estimator": "registry",
    "get_policy_loss": "registry",
    "get_kl_estimator": "registry",
    "get_loss_agg": "registry",
    "AdvantageTraits": "registry",
    "advantage_traits": "registry",
    # presets (what SearchR1Trainer(rl_algorithm=...) selects)
    "ALGORITHM_PRESETS": "presets",
    "KNOWN_ALGORITHMS": "presets",
    # config
    "AlgorithmConfig": "config",
    # aggregation
    "AggNorms": "aggregation",
    "agg_loss": "aggregation",
    "masked_mean": "aggregation",
    "masked_var": "aggregation",
    "masked_whiten": "aggregation",
    # advantages
    "compute_advantages": "advantages",
    "advantage_metrics": "advantages",
    "group_index": "advantages",
    "scores_to_token_rewards": "advantages",
    "sequence_scores": "advantages",
    "gae": "advantages",
    "grpo": "advantages",
    "rloo": "advantages",
    "reinforce": "advantages",
    "reinforce_plus_plus": "advantages",
    "reinforce_plus_plus_baseline": "advantages",
    # policy losses
    "compute_policy_loss": "policy_losses",
    "ppo_loss": "policy_losses",
    "gspo_loss": "policy_losses",
    "vanilla_pg_loss": "policy_losses",
    "value_loss": "policy_losses",
    "explained_variance": "policy_losses",
    # logits
    "log_probs_from_logits": "logits",
    "entropy_from_logits": "logits",
    "topk_log_probs": "logits",
    "topk_log_probs_from_hidden": "logits",
    # kl
    "kl_penalty": "kl",
    "full_kl_from_logits": "kl",
    "topk_kl": "kl",
    "vocab_kl": "kl",
    "kl_loss_matrix": "kl",
    "apply_kl_penalty": "kl",
    "FixedKLController": "kl",
    "AdaptiveKLController": "kl",
    "build_kl_controller": "kl",
    # reference
    "ema_update_": "reference",
    "FrozenReference": "reference",
    "EMAReference": "reference",
    "make_reference": "reference",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'searchr1.algorithms' has no attribute '{name}'")
    value = getattr(importlib.import_module(f"searchr1.algorithms.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
