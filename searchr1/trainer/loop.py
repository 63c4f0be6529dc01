"""The training loop: rollout -> rewards -> log-probs -> advantages -> update, with checkpoints.

One step::

    prompts   = sampler.next_batch()                    batch_size prompts (this rank: its share)
    trajs     = engine.generate(prompt x n)             n trajectories per prompt, groups adjacent
    rewards   = reward(trajs)                           total + components (logged separately)
    old, ref  = logprobs(policy), logprobs(reference)   on the trained tokens only
    values    = critic(trajs)                           PPO (advantage=gae) only
    A, R      = advantage estimator (registry)           KL folded into the reward if asked
    update    = PPO epochs x mini-batches x micro-batches (searchr1.trainer.update)
    schedules, EMA reference, metrics, checkpoint

Optional signals beside the outcome reward (all off by default): a step reward per search turn
(``reward.step_gain`` / ``reward.step_redundancy``; ``searchr1.rewards.steps``, credited to the turn's
tokens by ``searchr1.algorithms.step_credit``), and, for groups that found no success, the replay of
earlier successes (``replay.enabled``; ``searchr1.trainer.replay``) and guidance from the gold path
(``guidance.*``; ``searchr1.trainer.guidance``), mixed in after the rollout (``searchr1.trainer.mixing``).

The reference policy is a frozen copy of the initial weights, an EMA of the policy
(``algorithm.ref_policy=ema``), or, with LoRA, the base model with the adapter disabled.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import yaml

from searchr1 import threads
from searchr1.algorithms.advantages import scores_to_token_rewards
from searchr1.algorithms.aggregation import masked_mean
from searchr1.algorithms.kl import AdaptiveKLController, kl_penalty
from searchr1.algorithms.reference import ema_update_
from searchr1.algorithms.step_credit import advantages_with_step_credit, step_signal_groups, step_tensors
from searchr1.data.formats import sample_kind, sample_meta, sample_prompt
from searchr1.data.prompts import describe_template, resolve_template
from searchr1.precision import autocast, fast_bf16, frozen_linears_to_bf16
from searchr1.rewards.format import is_valid_format
from searchr1.rewards.steps import step_credit, step_metrics
from searchr1.rollout.gold import GoldWriter
from searchr1.rollout.records import answer_and_scores, trajectory_record
from searchr1.rollout.registry import build_engine, check_dtype
from searchr1.rollout.sampling import SamplingParams
from searchr1.trainer import checkpoint, components
from searchr1.trainer.distributed import (
    DistInfo,
    all_gather_objects,
    all_reduce_sum,
    barrier,
    full_state_dict,
    init_distributed,
    load_optimizer_state,
    optimizer_state,
    resolve_device,
    unwrap,
    wrap_model,
)
from searchr1.trainer.engine_weights import check_weight_format, hand_weights
from searchr1.trainer.experience import (
    Experience,
    build_experience,
    gather_experience,
    micro_batches,
    rows_with_signal,
)
from searchr1.trainer.guidance import Guidance, guidance_tensors, is_guided, rollout_requests
from searchr1.trainer.health import CollapseMonitor, flat_group_share
from searchr1.trainer.mixing import MixedBatch, mix_batch, shares
from searchr1.trainer.plots import write_plots
from searchr1.trainer.policy import PolicyLogprobs
from searchr1.trainer.replay import ReplayBuffer, is_replayed, replay_tensors, with_behaviour_logprobs
from searchr1.trainer.schedule import PromptSampler, make_scheduler
from searchr1.trainer.search_health import SearchAlert, SearchFailureMonitor, first_search_error
from searchr1.trainer.tracking import MetricsLogger, ProgressBar
from searchr1.trainer.update import UpdateSettings, run_update
from searchr1.trainer.validation import validation_metrics, validation_samples


class TrainingStopped(RuntimeError):
    """The run stopped itself (too many non-finite steps in a row); a checkpoint was written."""


def _seed_for(*parts: int) -> int:
    """A 63-bit seed from a few integers (stable across runs and processes)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (int(p) & 0xFFFFFFFFFFFF)) * 1099511628211) % (2**63 - 1)
    return h


class RLTrainer:
    """Trains a policy with the algorithm of ``cfg.algorithm`` (PPO/GAE, GRPO, RLOO, REINFORCE(++)).

    Components may be injected (a model, a retriever, a reward with ``score_trajectories(trajs, decode)``
    such as ``searchr1.rewards.CompositeReward``, samples, a rollout engine); anything not given is built
    from the configuration.
    """

    def __init__(
        self,
        cfg: Any,
        *,
        model: Any = None,
        tokenizer: Any = None,
        retriever: Any = None,
        reward_fn: Any = None,
        train_samples: list[Any] | None = None,
        val_samples: list[Any] | None = None,
        engine: Any = None,
    ) -> None:
        self.cfg = cfg
        self.tcfg = cfg.trainer
        self.algo = cfg.algorithm
        self.out_dir = Path(self.tcfg.out_dir)
        self.device = resolve_device(self.tcfg.device)
        self.dist: DistInfo = init_distributed(self.device)
        self._check_world()
        self.step = 0
        self.nonfinite_in_a_row = 0
        self.nonfinite_total = 0
        self.algo_state: dict[str, Any] = {}
        self.search_monitor = SearchFailureMonitor(
            cfg.rollout.max_search_failure_rate, cfg.rollout.search_failure_window
        )
        self.health = CollapseMonitor()
        self.steps_without_signal = 0
        """Consecutive steps in which every group's rewards were all equal (``trainer.stop_without_signal``)."""
        self.updates = 0
        """Steps whose policy update ran (the policy can only have changed if this is > 0)."""
        self.best_val: dict[str, float] | None = None
        """``{"step", "em"}`` of the best validation so far (``trainer.keep_best``)."""
        self._best_params: dict[str, torch.Tensor] | None = None
        """The trainable parameters of the best policy this process validated, for ``restore_best``."""
        rcfg = cfg.replay
        self.replay = ReplayBuffer(rcfg.keep_per_question, rcfg.max_age) if rcfg.enabled else None
        """Successful trajectories per training question (``replay.enabled``; checkpointed)."""
        self.guidance: Guidance | None = None
        """Gold trajectories, branched rollouts and decision groups (``guidance.*``; set up)."""
        self._stop_signal: int | None = None
        self._injected = dict(
            model=model,
            tokenizer=tokenizer,
            retriever=retriever,
            reward_fn=reward_fn,
            train_samples=train_samples,
            val_samples=val_samples,
            engine=engine,
        )
        self._setup_done = False

    # ------------------------------------------------------------------------------------------
    # setup

    def _check_world(self) -> None:
        w = self.dist.world_size
        for key in ("batch_size", "mini_batch_size"):
            if getattr(self.tcfg, key) % w:
                raise ValueError(
                    f"trainer.{key}={getattr(self.tcfg, key)} is not divisible by the world size {w} "
                    "(each rank rolls out whole groups)"
                )

    def setup(self) -> None:
        """Build (or take) every component, then resume from a checkpoint if one is found."""
        if self._setup_done:
            return

        if (
            self._injected["engine"] is None
        ):  # before any model loads: the engine can generate in rollout.dtype
            check_dtype(self.cfg, self.device.type)
        torch.manual_seed(self.cfg.seed)
        threads.configure(self.tcfg.adaptive_threads and self.device.type == "cpu")
        if self.dist.is_main:  # the world and the converted model are written once, by rank 0
            components.prepare_files(
                self.cfg,
                world=self._injected["train_samples"] is None,
                model=self._injected["model"] is None,
            )
        barrier(self.dist)
        resume_from = checkpoint.resolve_resume(self.tcfg.resume, self.out_dir)
        built = components.build(self.cfg, self._injected, resume_from=resume_from)
        self.tokenizer = built.tokenizer
        asked = self.cfg.data.template  # auto: the tokenizer's chat template, else base (recorded resolved)
        self.cfg.data.template = resolve_template(asked, self.tokenizer)
        if self.dist.is_main:
            print(f"template: {describe_template(asked, self.cfg.data.template)}", file=sys.stderr)
        self.policy = built.policy.to(self.device)
        self.reference = built.reference.to(self.device) if built.reference is not None else None
        self.critic = built.critic.to(self.device) if built.critic is not None else None
        self.retriever = built.retriever
        self.reward_fn = built.reward_fn
        self.train_samples = built.train_samples
        if self.cfg.data.max_train_samples:
            self.train_samples = self.train_samples[: self.cfg.data.max_train_samples]
        self.val_samples = built.val_samples
        self.engine = built.engine or build_engine(self.cfg, self.policy, self.tokenizer, self.retriever)
        if self.cfg.guidance.enabled:
            writer = GoldWriter(self.tokenizer, self.cfg.rollout, self.retriever, self.cfg.retrieval.topk)
            log = (lambda line: print(line, file=sys.stderr)) if self.dist.is_main else (lambda line: None)
            self.guidance = Guidance(
                self.cfg.guidance, self.tcfg.total_steps, self.train_samples, writer, log
            )
        self.lora = built.lora
        self.base_model_path = built.model_path
        if self.lora and self.cfg.model.bf16_autocast and fast_bf16(self.device):
            frozen_linears_to_bf16(self.policy)
        self.actor = wrap_model(
            PolicyLogprobs(
                self.policy, share_prefix=self.tcfg.share_prompt_prefix, fused=self.tcfg.fused_update
            ),
            self.dist,
            self.tcfg.strategy,
            self.device,
        )
        trainable = [p for p in self.policy.parameters() if p.requires_grad]  # before any forward
        betas = tuple(self.tcfg.adam_betas)
        self.actor_optimizer = torch.optim.AdamW(
            trainable, lr=self.tcfg.actor_lr, weight_decay=self.tcfg.weight_decay, betas=betas
        )
        self.actor_scheduler = make_scheduler(self.actor_optimizer, self.tcfg)
        self.critic_module = None
        self.critic_optimizer = None
        self.critic_scheduler = None
        if self.critic is not None:
            self.critic_module = wrap_model(self.critic, self.dist, self.tcfg.strategy, self.device)
            self.critic_optimizer = torch.optim.AdamW(
                [p for p in self.critic.parameters() if p.requires_grad],
                lr=self.tcfg.critic_lr,
                weight_decay=self.tcfg.weight_decay,
                betas=betas,
            )
            self.critic_scheduler = make_scheduler(self.critic_optimizer, self.tcfg, critic=True)
        if self.dist.enabled and self.tcfg.strategy == "fsdp":
            self._fsdp_lazy_init()  # after the optimizers hold the sharded parameters
        self.sampler = PromptSampler(
            len(self.train_samples), self.tcfg.batch_size, self.cfg.seed, self.tcfg.shuffle
        )
        self.prompt_cache: dict[int, list[int]] = {}
        if resume_from is not None:
            self._load_state(resume_from)
        check_weight_format(self.engine, self.lora)
        self._hand_weights(self.step)  # the engine starts from the policy as set up (a resumed one included)
        self._setup_done = True

    def _hand_weights(self, step: int) -> None:
        """The rollout engine receives the policy's weights after ``step`` updates, in the form it takes."""
        hand_weights(
            self.engine, self.policy, step=step, tokenizer=self.tokenizer, lora=self.lora,
            dist=self.dist, out_dir=self.out_dir,
        )  # fmt: skip

    def close(self) -> None:
        """Release the rollout engine this trainer built (its threads; a vLLM engine's server is stopped).
        An engine passed in (``engine=``) belongs to the caller and is left open."""
        engine = getattr(self, "engine", None)
        if engine is not None and self._injected["engine"] is None and hasattr(engine, "close"):
            engine.close()

    @torch.no_grad()
    def _fsdp_lazy_init(self) -> None:
        """A tiny no-grad forward through the FSDP2 root: sets FSDP up before the rollout's first
        direct call to an inner module."""
        ids = torch.full((1, 2), int(self.tokenizer.pad_token_id or 0), dtype=torch.long, device=self.device)
        self.actor(ids, torch.ones_like(ids))

    def _load_state(self, path: Path) -> None:
        state = checkpoint.load_trainer_state(path)
        load_optimizer_state(self.actor, self.actor_optimizer, state["actor_optimizer"], self.dist)
        self.actor_scheduler.load_state_dict(state["actor_scheduler"])
        if self.critic_optimizer is not None and state.get("critic_optimizer") is not None:
            load_optimizer_state(
                self.critic_module, self.critic_optimizer, state["critic_optimizer"], self.dist
            )
            self.critic_scheduler.load_state_dict(state["critic_scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        self.step = int(state["step"])
        self.nonfinite_in_a_row = int(state.get("nonfinite_in_a_row", 0))
        self.nonfinite_total = int(state.get("nonfinite_total", 0))
        self.algo_state = dict(state.get("algo_state", {}))
        self.health.load_state_dict(state.get("health", {}))
        self.steps_without_signal = int(state.get("steps_without_signal", 0))
        self.updates = int(state.get("updates", self.step))
        self.best_val = checkpoint.resumed_best(self.out_dir, state.get("best_val"))
        if self.replay is not None and state.get("replay") is not None:
            self.replay.load_state_dict(state["replay"])
        rng = state["rng"]
        checkpoint.set_rng_state(
            rng[self.dist.rank] if isinstance(rng, list) and len(rng) > self.dist.rank else rng
        )
        if self.dist.is_main:
            print(f"resumed from {path} at step {self.step}", file=sys.stderr)

    # ------------------------------------------------------------------------------------------
    # one step

    def _prompt_ids(self, index: int) -> list[int]:
        if index not in self.prompt_cache:
            text = sample_prompt(self.train_samples[index], self.cfg.data.template, self.tokenizer)
            self.prompt_cache[index] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self.prompt_cache[index]

    def rollout(self, indices: list[int], step: int) -> tuple[list[Any], list[int], float]:
        """This rank's share of ``indices`` rolled out ``n`` times each; groups stay adjacent."""
        n = self.cfg.rollout.n
        share = len(indices) // self.dist.world_size
        mine = indices[self.dist.rank * share : (self.dist.rank + 1) * share]
        prompt_ids, metas, groups = [], [], []
        for slot, idx in enumerate(mine):
            gid = self.dist.rank * share + slot
            for k in range(n):
                prompt_ids.append(self._prompt_ids(idx))
                meta = sample_meta(self.train_samples[idx], idx)
                metas.append({**meta, "group_id": gid, "sample_in_group": k})
                groups.append(gid)
        t0 = time.perf_counter()
        plan = rollout_requests(self.guidance, prompt_ids, metas, groups)  # decision groups: gold prefix
        trajs = self._generate(plan.prompt_ids, plan.metas, _seed_for(self.cfg.seed, step, self.dist.rank))
        return plan.splice(trajs), groups, time.perf_counter() - t0

    def _generate(self, prompt_ids: list[list[int]], metas: list[dict[str, Any]], seed: int) -> list[Any]:
        """Sampled rollouts of the current policy (the rollout's sampling settings)."""
        self.policy.eval()
        with torch.no_grad(), self._autocast():
            return self.engine.generate(
                prompt_ids, metas, sampling=SamplingParams.from_config(self.cfg.rollout), seed=seed
            )

    def _autocast(self) -> torch.autocast:
        return autocast(self.device, self.cfg.model.bf16_autocast)

    @torch.no_grad()
    def _per_token(self, module: Any, exp: Experience, kind: str) -> torch.Tensor:
        """Log-probs (``kind='logprobs'``) or values over ``exp`` in micro-batches, ``[B, T]`` on CPU."""
        out = torch.zeros(exp.input_ids.shape, dtype=torch.float32)

        for rows in micro_batches(
            list(range(len(exp))), exp.seq_lens, self.tcfg.micro_batch_size, self.tcfg.micro_batch_tokens
        ):
            mb = exp.select(rows).to(self.device)
            with self._autocast():
                if kind == "logprobs":
                    lp, _ = module(
                        mb.input_ids,
                        mb.attention_mask,
                        target_mask=mb.train_mask,
                        temperature=self.cfg.rollout.temperature,
                    )
                else:
                    lp = module(mb.input_ids, mb.attention_mask, target_mask=mb.train_mask)
            width = mb.input_ids.shape[1]
            out[torch.tensor(rows)[:, None], torch.arange(width)[None, :]] = lp.float().cpu()
        return out

    def _reference_context(self):
        """With LoRA the reference is the base model: the policy with its adapter disabled."""
        inner = unwrap(self.policy)
        if self.lora and hasattr(inner, "disable_adapter"):
            return inner.disable_adapter()
        return contextlib.nullcontext()

    @torch.no_grad()
    def _reference_logits(self, mb: Experience) -> torch.Tensor:
        """``[N, V]`` reference logits at the trained positions of a micro-batch (vocabulary KL)."""
        model = self.policy if self.lora else self.reference
        with self._reference_context():
            _, _, logits, _ = PolicyLogprobs(model)(
                mb.input_ids,
                mb.attention_mask,
                target_mask=mb.train_mask,
                temperature=self.cfg.rollout.temperature,
                return_logits=True,
            )
        return logits

    def _reference_logprobs(self, exp: Experience) -> torch.Tensor:
        model = self.policy if self.lora else self.reference
        with self._reference_context():
            share = self.tcfg.share_prompt_prefix
            module = PolicyLogprobs(model, share_prefix=share, fused=self.tcfg.fused_update)
            return self._per_token(module, exp, "logprobs")

    def make_experience(
        self,
        trajs: list[Any],
        groups: list[int],
        rewards: list[Any] | None = None,
        fresh: tuple[list[Any], list[Any]] | None = None,
    ) -> tuple[Experience, dict[str, float]]:
        """Rewards (unless given), step rewards, old / reference log-probs, values and advantages of a
        rollout batch. ``fresh``: the step's own rollouts and rewards before any replay, which the
        rollout metrics describe (default: ``trajs``)."""
        t0 = time.perf_counter()
        if rewards is None:
            rewards = self.reward_fn.score_trajectories(trajs, self._decode)
        t_reward = time.perf_counter() - t0
        exp = build_experience(
            trajs,
            [r.total for r in rewards],
            groups,
            pad_token_id=self.tokenizer.pad_token_id,
            mask_observations=self.tcfg.mask_observations,
        )
        step_sums = self._step_credit(trajs, exp)
        if self.replay is not None:
            exp.extras.update(replay_tensors(trajs, tuple(exp.input_ids.shape)))
        if self.guidance is not None:
            exp.extras.update(guidance_tensors(trajs))
        t0 = time.perf_counter()
        self.policy.eval()
        if not self.on_policy:
            exp.old_logprobs = with_behaviour_logprobs(exp, self._per_token(self.actor, exp, "logprobs"))
        if self.algo.uses_reference:
            exp.ref_logprobs = self._reference_logprobs(exp)
        if self.critic_module is not None:
            self.critic.eval()
            exp.values = self._per_token(self.critic_module, exp, "values")
        t_logprob = time.perf_counter() - t0
        exp = gather_experience(exp, self.dist)
        token_rewards = None
        kl_metric = None
        if exp.ref_logprobs is not None and exp.old_logprobs is not None:
            kl_mat = kl_penalty(exp.old_logprobs, exp.ref_logprobs, self.algo.kl_estimator)
            kl_metric = float(masked_mean(kl_mat, exp.train_mask))
            if self.algo.use_kl_in_reward:
                token_rewards = (
                    scores_to_token_rewards(exp.scores, exp.train_mask)
                    - self._kl_coef() * kl_mat * exp.train_mask
                )
        adv_in = token_rewards if token_rewards is not None else exp.scores
        exp.advantages, exp.returns = advantages_with_step_credit(  # step credit: algorithms.step_credit
            adv_in,
            exp.train_mask,
            self.algo,
            group_ids=exp.group_ids,
            values=exp.values,
            state=self.algo_state,
            step_rewards=exp.extras.get("step_rewards"),
            step_turns=exp.extras.get("step_turns"),
        )
        metrics = self._rollout_metrics(*(fresh or (trajs, rewards)), exp)
        metrics.update(self._step_metrics(step_sums))
        if kl_metric is not None:
            metrics["rollout/ref_kl"] = kl_metric
        metrics["timing/reward"] = t_reward
        metrics["timing/logprobs"] = t_logprob
        return exp, metrics

    def _step_credit(self, trajs: list[Any], exp: Experience) -> dict[str, float] | None:
        """With step rewards on (``reward.step_gain`` / ``step_redundancy``): each search turn's step
        reward into ``exp.extras`` (``step_rewards``, ``step_turns``); returns the sums of the step
        metrics over this rank's fresh trajectories (None: off)."""
        if not self.cfg.reward.step_rewards:
            return None
        credits = [step_credit(t, self.cfg.reward, self._decode) for t in trajs]
        prompt_lens = [len(t.prompt_ids) for t in trajs]
        rewards, turns = step_tensors(credits, prompt_lens, tuple(exp.input_ids.shape))
        exp.extras["step_rewards"], exp.extras["step_turns"] = rewards, turns
        return step_metrics([c for c, t in zip(credits, trajs, strict=True) if not is_replayed(t)])

    def _step_metrics(self, sums: dict[str, float] | None) -> dict[str, float]:
        """``step/reward_mean`` (over scored search turns), ``step/new_gold_share``,
        ``step/redundant_share`` and ``step/scored_share`` (of all search turns), reduced over ranks."""
        if sums is None:
            return {}
        names = sorted(sums)
        total = dict(
            zip(names, all_reduce_sum([sums[k] for k in names], self.dist, self.device), strict=True)
        )
        scored = max(total["scored_turns"], 1.0)
        return {
            "step/reward_mean": total["reward_sum"] / scored,
            "step/new_gold_share": total["new_gold_turns"] / scored,
            "step/redundant_share": total["redundant_turns"] / scored,
            "step/scored_share": total["scored_turns"] / max(total["search_turns"], 1.0),
        }

    def _mix(self, trajs: list[Any], groups: list[int], step: int) -> MixedBatch:
        """The step's fresh rollouts scored, with replayed successes and guidance mixed into the groups
        without a success (``searchr1.trainer.mixing``); shares reduced over ranks."""
        batch = mix_batch(
            trajs, groups, step,
            score=lambda batch: self.reward_fn.score_trajectories(batch, self._decode),
            replay=self.replay, replay_cfg=self.cfg.replay, guidance=self.guidance,
            generate=lambda prompts, metas: self._generate(prompts, metas, _seed_for(self.cfg.seed, step, self.dist.rank, 1)),
            gather=lambda obj: all_gather_objects(obj, self.dist),
        )  # fmt: skip
        names = sorted(batch.counts)
        total = dict(
            zip(names, all_reduce_sum([batch.counts[k] for k in names], self.dist, self.device), strict=True)
        )
        guided = self.guidance is not None and self.guidance.active
        batch.metrics.update(shares(total, self.replay is not None, guided))
        return batch

    def _rollout_metrics(self, trajs: list[Any], rewards: list[Any], exp: Experience) -> dict[str, float]:
        """Sums over this rank's trajectories, reduced over ranks, then averaged."""
        sums: dict[str, float] = {}

        def add(key: str, value: float) -> None:
            sums[key] = sums.get(key, 0.0) + float(value)

        for traj, rew in zip(trajs, rewards, strict=True):
            add("reward/mean", rew.total)
            for name, value in rew.components.items():
                add(f"reward/{name}", value)
            add("reward/em", self._answer_scores(traj, traj.meta.get("golden_answers", []))["em"])
            add("rollout/valid_format", float(is_valid_format(self._decode(traj.response_ids))))
            add("rollout/searches", traj.searches)
            add("rollout/turns", traj.turns)
            add("rollout/invalid_actions", traj.invalid_actions)
            add("rollout/search_failures", traj.search_failures)
            add("rollout/obs_truncations", traj.obs_truncations)
            add("rollout/truncated", float(traj.truncated))
            add("rollout/response_length", len(traj.response_ids))
            add("rollout/generated_tokens", traj.num_generated)
            add("rollout/answered", float(traj.finish_reason == "answer"))
            add("timing/search", float(traj.timing.get("search_wait_s", 0.0)))  # per trajectory
            add("_reward_sq", rew.total**2)
            add("_count", 1.0)
        names = sorted(sums)
        reduced = dict(
            zip(names, all_reduce_sum([sums[k] for k in names], self.dist, self.device), strict=True)
        )
        count = max(reduced.pop("_count"), 1.0)
        out = {k: v / count for k, v in reduced.items() if not k.startswith("_")}
        out["reward/std"] = math.sqrt(max(reduced["_reward_sq"] / count - out["reward/mean"] ** 2, 0.0))
        out["rollout/trajectories"] = count
        out["rollout/search_failures_total"] = reduced["rollout/search_failures"]
        out["rollout/search_failure_rate"] = reduced["rollout/search_failures"] / max(
            reduced["rollout/searches"], 1.0
        )
        adv = masked_mean(exp.advantages, exp.train_mask)
        out["actor/advantage_mean"] = float(adv)
        return out

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _answer_scores(self, traj: Any, golden: list[str]) -> dict[str, float]:
        """EM / subEM / F1 of a trajectory's answer, read as the evaluation and the reward read it."""
        decode_text = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        return answer_and_scores(traj, decode_text, list(golden), self.cfg.reward.normalization)[2]

    def _filter_groups(self, exp: Experience, metrics: dict[str, float]) -> Experience | None:
        """``algorithm.filter_groups``: the batch without its groups of equal rewards (None: none left)."""
        scores = exp.scores.tolist()
        stepped = self._step_signal_groups(exp)
        metrics["rollout/flat_groups"] = flat_group_share(scores, exp.group_ids, signal=stepped)
        if not self.algo.filter_groups:
            return exp
        multiple = self.dist.world_size * (self.tcfg.batch_size // self.tcfg.mini_batch_size)
        rows = rows_with_signal(scores, exp.group_ids, multiple, signal_groups=stepped)
        metrics["actor/trained_share"] = len(rows) / max(1, len(exp))
        return exp.select(rows) if rows else None

    @staticmethod
    def _step_signal_groups(exp: Experience) -> set[int]:
        """Groups with a step advantage (``step_credit.step_signal_groups``); none without step rewards."""
        if "step_turns" not in exp.extras:
            return set()
        return step_signal_groups(exp.extras["step_rewards"], exp.extras["step_turns"], exp.group_ids)

    def train_step(self) -> dict[str, float]:
        step = self.step
        t_step = time.perf_counter()
        indices = self.sampler.next_batch()
        trajs, groups, t_rollout = self.rollout(indices, step)
        batch = self._mix(trajs, groups, step)  # replay and guidance into groups without a success
        trajs = batch.trajs
        exp, metrics = self.make_experience(
            trajs, groups, batch.rewards, fresh=(batch.fresh, batch.fresh_rewards)
        )
        metrics.update(batch.metrics)
        exp = self._filter_groups(exp, metrics)
        t0 = time.perf_counter()
        if exp is None:  # every group scored alike: no advantage anywhere, nothing to update
            return self._finish_step(step, metrics, t_step, t_rollout, t0, update_actor=False, trajs=trajs)
        update_actor = step >= self.tcfg.critic_warmup_steps or self.critic is None
        self.policy.train()
        if self.critic is not None:
            self.critic.train()
        settings = UpdateSettings(
            ppo_epochs=self.tcfg.ppo_epochs,
            num_mini_batches=self.tcfg.batch_size // self.tcfg.mini_batch_size,
            micro_batch_size=self.tcfg.micro_batch_size,
            micro_batch_tokens=self.tcfg.micro_batch_tokens,
            grad_clip=self.tcfg.grad_clip,
            temperature=self.cfg.rollout.temperature,
            update_actor=update_actor,
            update_critic=self.critic is not None,
            seed=_seed_for(self.cfg.seed, step, 7),
            shaping_gamma=self.cfg.guidance.shaping_gamma,
        )
        upd_metrics, skipped = run_update(
            exp,
            actor=self.actor,
            actor_optimizer=self.actor_optimizer,
            critic=self.critic_module,
            critic_optimizer=self.critic_optimizer,
            algo=self.algo,
            settings=settings,
            info=self.dist,
            device=self.device,
            bf16_autocast=self.cfg.model.bf16_autocast,
            reference_logits_fn=self._reference_logits if self.algo.kl_loss_type != "token" else None,
        )
        t_weights = time.perf_counter()
        self._hand_weights(step + 1)
        metrics["timing/weights"] = time.perf_counter() - t_weights
        metrics.update(upd_metrics)
        if skipped:
            self.nonfinite_in_a_row += 1
            self.nonfinite_total += skipped
        else:
            self.nonfinite_in_a_row = 0
        return self._finish_step(step, metrics, t_step, t_rollout, t0, update_actor=update_actor, trajs=trajs)

    def _finish_step(
        self,
        step: int,
        metrics: dict[str, float],
        t_step: float,
        t_rollout: float,
        t_update_start: float,
        *,
        update_actor: bool,
        trajs: list[Any],
    ) -> dict[str, float]:
        """Schedulers, the EMA reference, and the step's bookkeeping metrics."""
        t_update = time.perf_counter() - t_update_start
        if update_actor:
            metrics.setdefault("actor/clipfrac", 0.0)  # losses without a ratio clip nothing
        with warnings.catch_warnings():  # a skipped (non-finite) optimizer step is not a bug here
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
            self.actor_scheduler.step()
            if self.critic_scheduler is not None:
                self.critic_scheduler.step()
        self._after_update(step, metrics)
        metrics["train/nonfinite_skipped"] = float(self.nonfinite_total)
        metrics["actor/lr"] = self.actor_scheduler.get_last_lr()[0]
        if self.critic_scheduler is not None:
            metrics["critic/lr"] = self.critic_scheduler.get_last_lr()[0]
        metrics["actor/kl"] = metrics.get("rollout/ref_kl", 0.0)
        metrics["actor/updated"] = float(update_actor)
        self.updates += int(update_actor)
        no_signal = metrics.get("rollout/flat_groups", 0.0) >= 1.0
        self.steps_without_signal = self.steps_without_signal + 1 if no_signal else 0
        metrics["timing/rollout"] = t_rollout
        metrics["timing/update"] = t_update
        metrics["timing/step"] = time.perf_counter() - t_step
        metrics["train/epoch"] = float(self.sampler.epoch)
        self.step = step + 1
        self._last_trajs = trajs
        return metrics

    @property
    def on_policy(self) -> bool:
        """One PPO epoch over one mini-batch with no KL in the reward: the policy that is updated is the
        one that sampled, so the old log-probs are the update's own (detached) and need no pass of their own."""
        return (
            self.tcfg.on_policy_logprobs
            and self.tcfg.ppo_epochs == 1
            and self.tcfg.mini_batch_size == self.tcfg.batch_size
            and not self.algo.use_kl_in_reward
        )

    def _kl_coef(self) -> float:
        """The coefficient of the KL in the reward: ``algorithm.kl_coef``, as adapted so far."""
        return float(self.algo_state.get("kl_coef", self.algo.kl_coef))

    def _after_update(self, step: int, metrics: dict[str, float]) -> None:
        """Adaptive KL coefficient and the EMA reference update."""
        if self.algo.use_kl_in_reward and self.algo.kl_ctrl == "adaptive" and "rollout/ref_kl" in metrics:
            # the coefficient lives in algo_state (checkpointed); the controller only updates it
            ctrl = AdaptiveKLController(self._kl_coef(), self.algo.kl_target, self.algo.kl_horizon)
            ctrl.update(
                metrics["rollout/ref_kl"] * metrics.get("rollout/generated_tokens", 1.0),  # ~ KL per sequence
                metrics.get("rollout/trajectories", 1.0),
            )
            self.algo_state["kl_coef"] = metrics["actor/kl_coef"] = ctrl.value
        if (
            self.reference is not None
            and self.algo.ref_policy == "ema"
            and (step + 1) % self.algo.ref_policy_ema_update_period == 0
        ):
            source = unwrap(self.policy)
            if self.dist.enabled and self.tcfg.strategy == "fsdp":  # sharded policy: gather first
                source = copy.deepcopy(self.reference)
                source.load_state_dict(
                    full_state_dict(self.policy, self.dist, all_ranks=True) or {}, strict=False
                )
            ema_update_(self.reference, source, self.algo.ref_policy_ema_tau, only_trainable=False)
            metrics["actor/ref_ema_updated"] = 1.0

    # ------------------------------------------------------------------------------------------
    # validation

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Greedy rollouts over the validation set (``searchr1.trainer.validation``: EM / F1 per data source
        and per kind of question, searches and turns)."""
        samples = self._validation_samples()
        if not samples:
            return {}
        share = math.ceil(len(samples) / self.dist.world_size)
        mine = list(range(self.dist.rank * share, min(len(samples), (self.dist.rank + 1) * share)))
        self.policy.eval()
        rows: list[dict[str, Any]] = []
        bs = max(1, self.tcfg.batch_size * self.cfg.rollout.n)
        for start in range(0, len(mine), bs):
            chunk = mine[start : start + bs]
            metas = [sample_meta(samples[i], i) for i in chunk]
            prompts = [
                self.tokenizer(
                    sample_prompt(samples[i], self.cfg.data.template, self.tokenizer),
                    add_special_tokens=False,
                )["input_ids"]
                for i in chunk
            ]
            with self._autocast():
                trajs = self.engine.generate(
                    prompts, metas, sampling=SamplingParams.greedy_eval(self.cfg.rollout), seed=self.cfg.seed
                )
            for traj, meta in zip(trajs, metas, strict=True):
                m = self._answer_scores(traj, meta["golden_answers"])
                rows.append(
                    {"source": meta["data_source"], "kind": sample_kind(samples[meta["sample_index"]]), **m,
                     "searches": traj.searches, "turns": traj.turns}
                )  # fmt: skip
        all_rows = [r for part in all_gather_objects(rows, self.dist) for r in part]
        return validation_metrics(all_rows)

    def _validation_samples(self) -> list[Any]:
        """The validation questions (``trainer.validation.validation_samples``)."""
        t = self.tcfg
        return validation_samples(self.val_samples or [], t.val_max_samples, t.val_balance_kinds)

    # ------------------------------------------------------------------------------------------
    # checkpoints

    def save(self) -> Path | None:
        """Write a checkpoint of the current step (every rank calls: gathers are collective;
        rank 0 writes)."""

        rng = all_gather_objects(checkpoint.rng_state(), self.dist)
        actor_opt = optimizer_state(self.actor, self.actor_optimizer, self.dist)
        critic_opt = (
            optimizer_state(self.critic_module, self.critic_optimizer, self.dist)
            if self.critic_optimizer
            else None
        )
        policy_sd = full_state_dict(self.policy, self.dist) if self.dist.enabled and not self.lora else None
        critic_sd = full_state_dict(self.critic, self.dist) if self.critic is not None else None
        path = None
        if self.dist.is_main:
            state = {
                "step": self.step,
                "actor_optimizer": actor_opt,
                "actor_scheduler": self.actor_scheduler.state_dict(),
                "critic_optimizer": critic_opt,
                "critic_scheduler": self.critic_scheduler.state_dict() if self.critic_scheduler else None,
                "sampler": self.sampler.state_dict(),
                "rng": rng,
                "nonfinite_in_a_row": self.nonfinite_in_a_row,
                "nonfinite_total": self.nonfinite_total,
                "algo_state": self.algo_state,
                "world_size": self.dist.world_size,
                "health": self.health.state_dict(),
                "steps_without_signal": self.steps_without_signal,
                "updates": self.updates,
                "best_val": self.best_val,
                "replay": self.replay.state_dict() if self.replay is not None else None,
            }

            def write(folder: Path) -> None:
                components.save_policy(
                    self.policy, self.tokenizer, folder, lora=self.lora, state_dict=policy_sd
                )
                if self.reference is not None and self.algo.ref_policy == "ema":
                    components.save_plain(self.reference, folder / "reference", self.dist)
                if self.critic is not None:
                    components.save_critic(self.critic, folder / "critic", critic_sd)

            path = checkpoint.save_checkpoint(
                self.out_dir,
                self.step,
                write,
                state,
                yaml.safe_dump(dataclasses.asdict(self.cfg), sort_keys=False),
                keep_last=self.tcfg.keep_last,
            )
        barrier(self.dist)
        return path

    # ------------------------------------------------------------------------------------------
    # the run

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stop_signal = signum

    def train(self) -> dict[str, Any]:
        """Run until ``trainer.total_steps``; returns a summary (last metrics, validation, paths)."""
        self.setup()
        is_main = self.dist.is_main

        logger = MetricsLogger(
            self.out_dir,
            self.tcfg.log_backends,
            enabled=is_main,
            run_config=dataclasses.asdict(self.cfg),
            wandb_project=self.tcfg.wandb_project,
            wandb_mode=self.tcfg.wandb_mode,
            resume_step=self.step,
        )
        if is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / "config.yaml").write_text(
                yaml.safe_dump(dataclasses.asdict(self.cfg), sort_keys=False)
            )
        old_handlers = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not in the main thread
                old_handlers[sig] = signal.signal(sig, self._on_signal)
        bar = ProgressBar(
            self.tcfg.total_steps,
            initial=self.step,
            enabled=is_main and self.tcfg.progress_bar,
            lines=self.tcfg.progress_lines,
            label=self.tcfg.progress_label,
        )
        summary: dict[str, Any] = {"out_dir": str(self.out_dir)}
        last: dict[str, float] = {}
        first_val: dict[str, float] = {}
        try:
            if self.tcfg.val_before_train and self.step == 0:
                first_val = self.validate()
                if first_val:
                    self._keep_if_best(first_val)  # the starting policy is the first candidate
                    logger.log(0, first_val)
            while self.step < self.tcfg.total_steps:
                metrics = self.train_step()
                if self.tcfg.val_every and self.step % self.tcfg.val_every == 0:
                    metrics.update(self.validate())
                    self._keep_if_best(metrics)
                for alert in self.health.observe(self.step, metrics):
                    if is_main:
                        bar.write(alert.message)
                logger.log(self.step, metrics)
                if is_main:
                    self._write_trajectories(metrics)
                bar.update(metrics)
                last = metrics
                search_alert = self._search_alert(metrics)
                if search_alert.warning and is_main:
                    bar.write(search_alert.warning)
                if search_alert.stop:
                    self.save()
                    raise TrainingStopped(
                        f"{search_alert.stop} Checkpoint written to {checkpoint.checkpoint_dir(self.out_dir)}."
                    )
                stop = self._stop_requested()
                if self.nonfinite_in_a_row >= self.tcfg.max_nonfinite_in_a_row:
                    self.save()
                    raise TrainingStopped(
                        f"stopping at step {self.step}: {self.nonfinite_in_a_row} steps in a row had a non-finite "
                        f"loss or gradient (trainer.max_nonfinite_in_a_row={self.tcfg.max_nonfinite_in_a_row}); "
                        f"checkpoint written to {checkpoint.checkpoint_dir(self.out_dir)}. Lower the learning rate "
                        "or check the data."
                    )
                if stop:
                    path = self.save()
                    bar.write(f"signal received: checkpoint written at step {self.step} ({path}); stopping")
                    summary["interrupted"] = True
                    break
                quiet = self.tcfg.stop_without_signal
                if quiet and self.steps_without_signal >= quiet:
                    self.save()
                    bar.write(
                        f"stopping at step {self.step}: in {quiet} steps in a row every group's rewards were all "
                        "equal, so there was nothing to learn from (trainer.stop_without_signal)"
                    )
                    summary["stopped_without_signal"] = self.step
                    break
                if self.tcfg.save_every and self.step % self.tcfg.save_every == 0:
                    self.save()
                if is_main and self.tcfg.plot_every and self.step % self.tcfg.plot_every == 0:
                    self._plots()
            else:
                if (
                    not checkpoint.list_checkpoints(self.out_dir)
                    or checkpoint.list_checkpoints(self.out_dir)[-1][0] != self.step
                ):
                    self.save()
        finally:
            bar.close()
            logger.close()
            for sig, handler in old_handlers.items():
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(sig, handler)
        if is_main and self.tcfg.plot_at_end:
            summary["plots"] = [str(p) for p in self._plots()]
        summary.update(step=self.step, last=last, first_val=first_val, updates=self.updates)
        summary["health"] = [a.__dict__ for a in self.health.alerts]
        summary["best"] = self.best_val
        latest = checkpoint.latest_checkpoint(self.out_dir)
        summary["checkpoint"] = str(latest) if latest else None
        return summary

    def _keep_if_best(self, metrics: dict[str, float]) -> None:
        """``trainer.keep_best``: a validation EM (``val_em``; ``val_em_by_kind``: the mean over kinds of
        question) above every earlier one (ties keep the earlier)
        writes the policy to ``checkpoints/best`` (``checkpoint.best_dir``), with its step and EM."""
        key = {"val_em": "val/em", "val_em_by_kind": "val/em_by_kind"}.get(self.tcfg.keep_best)
        if key is None or key not in metrics:
            return
        em = float(metrics[key])
        if self.best_val is not None and em <= self.best_val["em"]:
            return
        self.best_val = {"step": self.step, "em": em}
        metrics["val/best_em"] = em
        self._best_params = {
            n: p.detach().clone() for n, p in self.policy.named_parameters() if p.requires_grad
        }
        policy_sd = full_state_dict(self.policy, self.dist) if self.dist.enabled and not self.lora else None
        if self.dist.is_main:
            checkpoint.save_best(
                self.out_dir,
                lambda folder: components.save_policy(
                    self.policy, self.tokenizer, folder, lora=self.lora, state_dict=policy_sd
                ),
                self.best_val,
            )
        barrier(self.dist)

    @torch.no_grad()
    def restore_best(self) -> dict[str, float] | None:
        """Put the policy the run ships as its best (``checkpoints/best``) back into the policy, in place (the
        engine follows): kept in memory, else (a resumed run) read from there; its ``{"step", "em"}`` or None."""
        if self.best_val is None or self.tcfg.keep_best == "none":
            return None
        if self._best_params is not None:
            checkpoint.copy_params(dict(self.policy.named_parameters()), self._best_params)
        elif (kept := checkpoint.load_best(self.policy, self.out_dir, lora=self.lora)) is not None:
            self.best_val = kept
        else:
            return None
        self._hand_weights(self.step)
        return dict(self.best_val)

    def _search_alert(self, metrics: dict[str, float]) -> SearchAlert:
        """This step's failed / attempted searches (all ranks) through the search-failure monitor."""
        count = metrics.get("rollout/trajectories", 0.0)

        def cause() -> str | None:  # every rank gets here alike (the counts are reduced)
            mine = first_search_error(getattr(self, "_last_trajs", None) or [])
            return next((c for c in all_gather_objects(mine, self.dist) if c), None)

        return self.search_monitor.observe(
            self.step,
            round(metrics.get("rollout/search_failures", 0.0) * count),
            round(metrics.get("rollout/searches", 0.0) * count),
            cause,
        )

    def _stop_requested(self) -> bool:
        (flag,) = all_reduce_sum([1.0 if self._stop_signal is not None else 0.0], self.dist, self.device)
        return flag > 0

    def _plots(self) -> list[Path]:
        try:
            return write_plots(self.out_dir)
        except Exception as exc:  # plots never end a run
            print(f"warning: could not write plots: {exc}", file=sys.stderr)
            return []

    def _write_trajectories(self, metrics: dict[str, float]) -> None:
        """A few of this step's rollouts, in the layout of ``searchr1 eval`` (per-token role segments,
        queries, hits, scores), so the report shows what was trained and what was masked."""
        k = self.tcfg.trajectory_samples
        if not k or not getattr(self, "_last_trajs", None):
            return
        import json

        with (self.out_dir / "trajectories.jsonl").open("a") as fh:
            for traj in self._last_trajs[:k]:
                sample = {
                    "id": traj.meta.get("id"),
                    "question": traj.meta.get("question"),
                    "golden_answers": list(traj.meta.get("golden_answers") or []),
                    "data_source": traj.meta.get("data_source"),
                }
                record = trajectory_record(traj, sample, self.tokenizer, mode="train")
                record.update(step=self.step, id=f"step {self.step}: {sample['id']}")
                if is_replayed(traj):  # a stored success of an earlier step (replay.enabled)
                    record.update(replayed=True, replayed_from_step=traj.meta.get("replayed_from_step"))
                if is_guided(traj):  # guidance: a gold trajectory or a rollout branched from a gold prefix
                    record.update(guided=traj.meta.get("guided"))
                fh.write(json.dumps(record, default=str) + "\n")
