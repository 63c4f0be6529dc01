"""The policy (and critic) update of one rollout batch: PPO epochs over mini-batches, gradient
accumulation over micro-batches, gradient clipping, skipped non-finite steps.

For each epoch the groups are shuffled (seeded) and cut into mini-batches of whole groups; each
mini-batch is one optimizer step, accumulated over length-bucketed micro-batches. The loss of a
micro-batch is normalised by the *mini-batch* counts summed over ranks (``AggNorms``), times the
world size because DDP/FSDP average gradients, so the step does not depend on how the mini-batch is
split into micro-batches or ranks:

    L_actor  = agg(pg_loss_t)  +  llds_coef * LLDS  +  kl_coef * agg(KL_t)  -  entropy_coef * agg(H_t)
    L_critic = agg(0.5 * max((V - R)^2, (V_clip - R)^2))
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from searchr1 import threads
from searchr1.algorithms.aggregation import AggNorms, agg_loss, masked_mean
from searchr1.algorithms.config import AlgorithmConfig
from searchr1.algorithms.kl import kl_penalty, vocab_kl_matrix
from searchr1.algorithms.policy_losses import (
    compute_policy_loss,
    llds_loss,
    shaped_off_policy_loss,
    value_loss,
)
from searchr1.precision import autocast
from searchr1.trainer.distributed import DistInfo, all_reduce_sum, no_sync
from searchr1.trainer.experience import Experience, micro_batches, rank_share, split_groups
from searchr1.trainer.guidance import guided_masks
from searchr1.trainer.policy import PolicyLogprobs
from searchr1.trainer.replay import replay_ratio_metrics, with_behaviour_logprobs


@dataclass
class UpdateSettings:
    ppo_epochs: int
    num_mini_batches: int
    micro_batch_size: int
    micro_batch_tokens: int
    grad_clip: float
    temperature: float
    update_actor: bool
    update_critic: bool
    seed: int
    shaping_gamma: float = 0.1
    """gamma of the policy shaping of gold (off-policy) rows (``guidance.shaping_gamma``)."""


class MetricSums:
    """Token- or row-weighted sums of metrics, reduced over ranks at the end.

    Tensor values stay on their device until ``reduce`` reads them all at once (one transfer instead of one
    host sync per metric and micro-batch, which on a GPU would stall the host until the queued kernels ran);
    they are then added in the order they came, as Python floats, exactly as if read one by one."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)
        self.steps = 0
        """Optimizer steps (mini-batches) so far; the same on every rank."""
        self._pending: list[tuple[str, torch.Tensor | float, float | None]] = []

    def add_share(self, name: str, value: float | torch.Tensor) -> None:
        """A micro-batch's share of a mini-batch aggregate (shares add up over micro-batches and ranks)."""
        self._pending.append((name, _held(value), None))
        self.weights[name] = -1.0

    def add(self, name: str, value: float | torch.Tensor, weight: float) -> None:
        self._pending.append((name, _held(value), float(weight)))
        self.weights[name] += weight

    def _settle(self) -> None:
        """Add the pending values to the sums (their tensors read from the device in one transfer)."""
        by_device: dict[torch.device, list[int]] = defaultdict(list)
        for i, (_, value, _) in enumerate(self._pending):
            if isinstance(value, torch.Tensor):
                by_device[value.device].append(i)
        read: dict[int, float] = {}
        for rows in by_device.values():  # float64 holds every float32 / bfloat16 value exactly
            values = torch.stack([self._pending[i][1].double() for i in rows]).tolist()  # type: ignore[union-attr]
            read.update(zip(rows, values, strict=True))
        for i, (name, value, weight) in enumerate(self._pending):
            v = read[i] if i in read else float(value)
            self.sums[name] += v if weight is None else v * weight
        self._pending = []

    def reduce(self, info: DistInfo, device: torch.device) -> dict[str, float]:
        self._settle()
        names = sorted(self.sums)
        flat = all_reduce_sum([self.sums[n] for n in names] + [self.weights[n] for n in names], info, device)
        k = len(names)
        out = {}
        for i, n in enumerate(names):
            if self.weights[n] < 0:  # additive shares: mean over optimizer steps
                out[n] = flat[i] / max(self.steps, 1)
            else:
                out[n] = flat[i] / flat[k + i] if flat[k + i] else 0.0
        return out


def _held(value: float | torch.Tensor) -> torch.Tensor | float:
    """A metric value kept until ``MetricSums._settle``: a detached 0-d tensor, or a float."""
    if isinstance(value, torch.Tensor):
        return value.detach().reshape(()).clone()  # a copy: later in-place work cannot change it
    return float(value)


@dataclass(frozen=True)
class _Step:
    """What every optimizer step of one update shares (``actor`` / ``critic`` None: not trained)."""

    actor: torch.nn.Module | None
    actor_optimizer: torch.optim.Optimizer | None
    critic: torch.nn.Module | None
    critic_optimizer: torch.optim.Optimizer | None
    algo: AlgorithmConfig
    settings: UpdateSettings
    info: DistInfo
    device: torch.device
    bf16_autocast: bool
    reference_logits_fn: Callable[[Experience], Any] | None


def run_update(
    exp: Experience,
    *,
    actor: torch.nn.Module | None,
    actor_optimizer: torch.optim.Optimizer | None,
    critic: torch.nn.Module | None,
    critic_optimizer: torch.optim.Optimizer | None,
    algo: AlgorithmConfig,
    settings: UpdateSettings,
    info: DistInfo,
    device: torch.device,
    bf16_autocast: bool = False,
    reference_logits_fn: Callable[[Experience], Any] | None = None,
) -> tuple[dict[str, float], int]:
    """Optimise on the global batch ``exp`` (each rank trains on its share of every mini-batch).

    Returns (metrics, number of skipped optimizer steps)."""
    step = _Step(
        actor=actor if settings.update_actor else None,
        actor_optimizer=actor_optimizer,
        critic=critic if settings.update_critic else None,
        critic_optimizer=critic_optimizer,
        algo=algo,
        settings=settings,
        info=info,
        device=device,
        bf16_autocast=bf16_autocast,
        reference_logits_fn=reference_logits_fn,
    )
    sums = MetricSums()
    skipped = 0
    num_groups = len(dict.fromkeys(exp.group_ids))
    if num_groups % settings.num_mini_batches:
        raise ValueError(f"{num_groups} groups cannot be split into {settings.num_mini_batches} mini-batches")
    for epoch in range(settings.ppo_epochs):
        gen = torch.Generator().manual_seed((settings.seed + 7919 * epoch) % (2**62))
        order = torch.randperm(num_groups, generator=gen).tolist()
        for rows in split_groups(exp.group_ids, settings.num_mini_batches, order):
            mini = exp.select(rank_share(rows, exp.group_ids, info.rank, info.world_size))
            skipped += 0 if _optimizer_step(mini, step, sums) else 1
    return sums.reduce(info, device), skipped


def _optimizer_step(mini: Experience, s: _Step, sums: MetricSums) -> bool:
    """One mini-batch: accumulate gradients over micro-batches, clip, step. False if skipped."""
    mask = mini.train_mask
    local_tokens = float(mask.sum())
    local_seqs = float(mask.any(dim=-1).sum())
    resp_len = float((mini.seq_lens - mini.train_mask.int().argmax(dim=-1)).max()) if len(mini) else 1.0
    tokens, seqs = all_reduce_sum([local_tokens, local_seqs], s.info, s.device)
    norms = AggNorms(num_tokens=tokens, num_seqs=seqs, seq_len=float(s.algo.loss_agg_norm_len or resp_len))
    world = float(s.info.world_size)
    mbs = micro_batches(
        list(range(len(mini))), mini.seq_lens, s.settings.micro_batch_size, s.settings.micro_batch_tokens
    )
    trained = [
        (name, model, opt, loss_fn)
        for name, model, opt, loss_fn in (
            ("actor", s.actor, s.actor_optimizer, _actor_loss),
            ("critic", s.critic, s.critic_optimizer, _critic_loss),
        )
        if model is not None
    ]
    optimizers = [opt for opt in (s.actor_optimizer, s.critic_optimizer) if opt is not None]
    nonfinite_loss = torch.zeros((), dtype=torch.bool, device=s.device)  # read once, after the micro-batches
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    prefix_owner = _begin_shared_prefix(mini, s)
    try:
        for i, rows in enumerate(mbs):
            threads.adapt()  # fewer torch threads while other processes keep cores busy (searchr1.threads)
            mb = mini.select(rows).to(s.device)
            last = i == len(mbs) - 1
            for _, model, _, loss_fn in trained:
                with no_sync(model, skip_sync=not last), autocast(s.device, s.bf16_autocast):
                    loss = loss_fn(model, mb, s, norms, sums)
                    nonfinite_loss |= ~torch.isfinite(loss.detach())
                    (loss * world).backward()
        if prefix_owner is not None:
            prefix_owner.end_step()  # the shared prefix's backward, once for the whole step
    finally:
        if prefix_owner is not None:
            prefix_owner.end_step(backward=False)
    sums.steps += 1
    ok = True
    (flag,) = all_reduce_sum([1.0 if bool(nonfinite_loss) else 0.0], s.info, s.device)
    stepped = [(name, model, opt) for name, model, opt, _ in trained if opt is not None]
    for name, model, _ in stepped:
        params = [p for p in model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(
            params, s.settings.grad_clip if s.settings.grad_clip > 0 else math.inf
        )
        norm_value = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if flag > 0 or not math.isfinite(norm_value):
            ok = False
        else:
            sums.add(f"{name}/grad_norm", norm_value, 1.0)
    if ok:
        for _, _, opt in stepped:
            opt.step()
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    return ok


def _begin_shared_prefix(mini: Experience, s: _Step) -> PolicyLogprobs | None:
    """Start the optimizer step's shared prompt prefix on the actor (computed once, attended by every
    micro-batch; ``PolicyLogprobs.begin_step``). Single process only: under DDP / FSDP the prefix's
    backward would run after the gradients were reduced."""
    actor = s.actor
    if not isinstance(actor, PolicyLogprobs) or s.info.enabled or len(mini) < 2:
        return None
    with autocast(s.device, s.bf16_autocast):
        started = actor.begin_step(
            mini.input_ids.to(s.device), mini.attention_mask.to(s.device), mini.train_mask.to(s.device)
        )
    return actor if started is not None else None


def _actor_loss(
    actor: torch.nn.Module, mb: Experience, s: _Step, norms: AggNorms, sums: MetricSums
) -> torch.Tensor:
    """The policy loss of a micro-batch (policy gradient, entropy bonus, KL loss); records its metrics."""
    algo = s.algo
    vocab_kl = algo.use_kl_loss and algo.kl_loss_type != "token" and s.reference_logits_fn is not None
    if vocab_kl:
        logprobs, entropy, logits, valid = actor(
            mb.input_ids,
            mb.attention_mask,
            target_mask=mb.train_mask,
            temperature=s.settings.temperature,
            return_logits=True,
        )
    else:
        logprobs, entropy = actor(
            mb.input_ids,
            mb.attention_mask,
            target_mask=mb.train_mask,
            temperature=s.settings.temperature,
            return_entropy=True,
        )
    # on-policy (see RLTrainer.on_policy): the old log-probs are this pass's own values, detached;
    # replayed rows (searchr1.trainer.replay) always take their stored sampling log-probs
    old_logprobs = mb.old_logprobs if mb.old_logprobs is not None else logprobs.detach()
    old_logprobs = with_behaviour_logprobs(mb, old_logprobs)
    if "replayed" in mb.extras:
        ratio_mean, clipfrac, tokens = replay_ratio_metrics(
            logprobs, old_logprobs, mb, algo.clip_ratio_low, algo.clip_ratio_high
        )
        if tokens:  # logged for the steps that trained replayed tokens
            sums.add("replay/ratio_mean", ratio_mean, tokens)
            sums.add("replay/clipfrac", clipfrac, tokens)
    on_policy_mask, gold_mask = guided_masks(mb)  # gold rows of guidance: policy shaping, no ratio
    pg_loss, pg_metrics = compute_policy_loss(
        logprobs, old_logprobs, mb.advantages, on_policy_mask, algo, norms=norms
    )
    if gold_mask is not None:
        shaped, weight = shaped_off_policy_loss(
            logprobs,
            mb.advantages,
            gold_mask,
            gamma=s.settings.shaping_gamma,
            loss_agg=algo.loss_agg,
            norms=norms,
        )
        pg_loss = pg_loss + shaped
        sums.add("guidance/shaping_weight", masked_mean(weight, gold_mask), float(gold_mask.sum()))
    loss = pg_loss
    if algo.llds_coef > 0:
        llds = llds_loss(logprobs, old_logprobs, mb.advantages, mb.train_mask, config=algo, norms=norms)
        loss = loss + algo.llds_coef * llds
        sums.add_share("actor/llds_loss", llds)
    ent = agg_loss(entropy, mb.train_mask, algo.loss_agg, norms=norms)
    if algo.entropy_coef:
        loss = loss - algo.entropy_coef * ent
    if algo.use_kl_loss and algo.kl_coef > 0 and mb.ref_logprobs is not None:
        if vocab_kl:
            kl_mat = vocab_kl_matrix(
                algo,
                logprobs,
                mb.ref_logprobs,
                old_logprobs,
                logits,
                s.reference_logits_fn(mb),
                mb.input_ids,
                valid,
            )
        else:
            kl_mat = kl_penalty(logprobs, mb.ref_logprobs, algo.kl_estimator)
        kl = agg_loss(kl_mat, mb.train_mask, algo.loss_agg, norms=norms)
        loss = loss + algo.kl_coef * kl
        sums.add_share("actor/kl_loss", kl)
    sums.add_share("actor/pg_loss", pg_loss)
    sums.add_share("actor/entropy", ent)
    sums.add_share("actor/loss", loss)
    mb_tokens = float(on_policy_mask.sum())
    for name, value in pg_metrics.items():
        sums.add(f"actor/{name.removeprefix('pg_')}", value, mb_tokens)
    return loss


def _critic_loss(
    critic: torch.nn.Module, mb: Experience, s: _Step, norms: AggNorms, sums: MetricSums
) -> torch.Tensor:
    """The clipped value loss of a micro-batch; records its metrics."""
    values = critic(mb.input_ids, mb.attention_mask, target_mask=mb.train_mask)
    vf_loss, vf_metrics = value_loss(
        values.float(), mb.values, mb.returns, mb.train_mask, config=s.algo, norms=norms
    )
    sums.add_share("critic/vf_loss", vf_loss)
    mb_tokens = float(mb.train_mask.sum())
    for name, value in vf_metrics.items():
        sums.add(f"critic/{name.removeprefix('vf_')}", value, mb_tokens)
    return vf_loss
