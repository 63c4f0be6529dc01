"""Configuration of the model and of the training loop (sections ``model`` and ``trainer``).

Batch sizes count *prompts* (GRPO groups), never trajectories, so that a group is never split
across mini-batches or ranks: one step rolls out ``batch_size * rollout.n`` trajectories.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["GuidanceConfig", "ModelConfig", "ReplayConfig", "TrainerConfig", "WarmStartConfig"]


@dataclass
class ModelConfig:
    path: str = "smollm2-135m-instruct"
    """A local folder, an alias (`smollm2-135m-instruct`: the pip-installed CPU default), a .gguf file or a hub id."""
    dtype: str = "float32"
    """Parameter dtype: float32 | bfloat16 | float16."""
    tokenizer: str | None = None
    """Tokenizer hub id or folder (None = the model's)."""
    critic_path: str | None = None
    """Model the PPO critic's value head is put on (None = the policy's `path`)."""
    lora_r: int = 0
    """LoRA rank (0 = full fine-tuning). With LoRA the reference is the base model with the adapter off."""
    lora_alpha: int = 32
    """LoRA scaling numerator (scale = alpha / r)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA branch."""
    lora_targets: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names LoRA adapts."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% more compute)."""
    bf16_autocast: bool = True
    """Autocast forward passes to bfloat16 where the device has bfloat16 units (CUDA GPUs with bf16, CPUs with
    AVX512-BF16 / AMX); elsewhere float32. With LoRA the frozen base weights are then kept in bfloat16."""

    def validate(self, root: Any) -> None:
        if self.lora_r < 0:
            raise ValueError(f"model.lora_r must be >= 0, got {self.lora_r}")
        if self.lora_r > 0 and not self.lora_targets:
            raise ValueError("model.lora_targets must name at least one module when model.lora_r > 0")
        algo = getattr(root, "algorithm", None)
        if self.lora_r > 0 and getattr(algo, "ref_policy", "frozen") == "ema":
            raise ValueError(
                "algorithm.ref_policy=ema with model.lora_r > 0: with LoRA the reference is the base model "
                "with the adapter disabled (use ref_policy=frozen, or full fine-tuning for an EMA reference)"
            )


@dataclass
class TrainerConfig:
    total_steps: int = 100
    """Training steps (one step = one rollout batch and its policy update)."""
    out_dir: str = "runs/default"
    """Run folder: checkpoints, metrics.jsonl, plots, report."""
    batch_size: int = 8
    """Prompts per step (each rolled out `rollout.n` times); split across ranks by whole groups."""
    mini_batch_size: int = 8
    """Prompts per optimizer step inside a PPO epoch; must divide `batch_size`."""
    micro_batch_size: int = 8
    """Trajectories per forward/backward pass (gradient accumulation over micro-batches)."""
    micro_batch_tokens: int = 0
    """If > 0, pack micro-batches up to this many tokens (length-bucketed) instead of a fixed count."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    share_prompt_prefix: bool = True
    """Run the prompt tokens that every row of a micro-batch starts with once (a group's prompt, or an
    instruction all prompts share) and let the rows attend to them as a cache; off: every row computes them."""
    adaptive_threads: bool = True
    """On a CPU, use fewer torch threads while other processes keep cores busy (re-measured every half second
    during the rollout and the update; searchr1.threads); off: the thread count stays as set."""
    fused_update: bool = True
    """Run the policy's log-prob passes and update of Llama-family models (Llama, Qwen2, Mistral) through
    searchr1's functional decoder: merged LoRA weights, fused projections, matmul attention, and with
    `share_prompt_prefix` the prompt prefix of a whole optimizer step computed once. Off, or for other
    models: the Hugging Face modules."""
    on_policy_logprobs: bool = True
    """When the update is on-policy (one epoch, one mini-batch, no KL in the reward) take the old log-probs
    from the update's own forward pass (detached) instead of a separate pass over the batch."""
    actor_lr: float = 1e-6
    """Peak learning rate of the policy."""
    critic_lr: float = 1e-5
    """Peak learning rate of the critic (PPO / gae only)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    lr_warmup_steps: int = 0
    """Linear warm-up steps of the actor and critic learning rates."""
    lr_warmup_ratio: float = 0.0
    """Warm-up as a fraction of `total_steps` (used when `lr_warmup_steps` is 0)."""
    critic_lr_warmup_ratio: float = -1.0
    """Critic warm-up as a fraction of `total_steps` (negative = same warm-up as the actor)."""
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Decay after warm-up."""
    min_lr_ratio: float = 0.0
    """Floor of the decayed learning rate as a fraction of the peak."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 = off)."""
    critic_warmup_steps: int = 0
    """Steps during which only the critic is trained (PPO)."""
    mask_observations: bool = True
    """Train only generated tokens. False also trains on observation tokens (the paper's ablation)."""
    save_every: int = 50
    """Checkpoint every N steps (0 = only at the end and on SIGTERM / SIGINT)."""
    keep_last: int = 3
    """Complete checkpoints kept (older ones are deleted)."""
    resume: str = "auto"
    """auto (newest complete checkpoint in out_dir, if any) | never | path to a checkpoint folder."""
    val_every: int = 0
    """Validate every N steps (0 = never during training)."""
    val_before_train: bool = False
    """Validate once before the first step (with keep_best, the starting policy is then the first candidate:
    a run that only got worse ships the policy it started from)."""
    val_max_samples: int = 0
    """Validation questions at most (0 = all)."""
    keep_best: Literal["none", "val_em", "val_em_by_kind"] = "none"
    """val_em: keep the policy of the best validation EM in checkpoints/best (needs val_every > 0); val_em_by_kind: of the best mean over the kinds of question of their validation EM (single-hop and multi-hop weigh alike, however many of each the set holds); `SearchR1Trainer.save(best=True)` and `searchr1 train --export-best` take it."""
    val_balance_kinds: bool = False
    """Validate on as many single-hop as multi-hop questions (taken in file order, up to `val_max_samples` in all; a kind is read from metadata.type or the number of gold passages)."""
    log_backends: list[str] = field(default_factory=lambda: ["jsonl", "tensorboard"])
    """Metric sinks: jsonl | tensorboard | wandb (wandb honours WANDB_MODE=offline)."""
    wandb_project: str = "searchr1"
    """Weights & Biases project."""
    wandb_mode: str = "offline"
    """Weights & Biases mode: offline | online | disabled."""
    progress_bar: bool = True
    """Show a progress bar with ETA and the key metrics."""
    progress_lines: bool = False
    """With progress_bar: one plain line per step instead of a bar (log files, runs sharing a terminal)."""
    progress_label: str = "train"
    """The label of the progress bar or lines."""
    plot_every: int = 0
    """Write PNG plots every N steps (0 = only at the end)."""
    plot_at_end: bool = True
    """Write PNG plots (plots/overview.png, ...) when the run ends."""
    stop_without_signal: int = 0
    """Stop (with a checkpoint) after this many steps in a row in which every group's rewards were all equal: a policy that never earns a different reward learns nothing from more of the same (0 = never)."""
    max_nonfinite_in_a_row: int = 5
    """Stop (with a checkpoint) after this many consecutive steps with a non-finite loss or gradient."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch (seeded)."""
    device: str = "auto"
    """cpu | cuda | auto (cuda when available)."""
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """Gradient synchronisation under torchrun: ddp | fsdp (FSDP2 fully_shard)."""
    trajectory_samples: int = 4
    """Trajectories per step written to trajectories.jsonl for inspection (0 = none)."""

    def validate(self, root: Any) -> None:
        positive = ("total_steps", "batch_size", "mini_batch_size", "micro_batch_size", "ppo_epochs")
        for key in positive:
            if getattr(self, key) < 1:
                raise ValueError(f"trainer.{key} must be >= 1, got {getattr(self, key)}")
        if self.batch_size % self.mini_batch_size:
            raise ValueError(
                f"trainer.batch_size={self.batch_size} is not divisible into mini-batches of "
                f"trainer.mini_batch_size={self.mini_batch_size}"
            )
        for key in ("actor_lr", "critic_lr"):
            if getattr(self, key) < 0:
                raise ValueError(f"trainer.{key} must be >= 0")
        if self.resume not in ("auto", "never") and not self.resume:
            raise ValueError("trainer.resume must be auto | never | a checkpoint path")
        unknown = [b for b in self.log_backends if b not in ("jsonl", "tensorboard", "wandb")]
        if unknown:
            raise ValueError(
                f"trainer.log_backends: unknown backend(s) {unknown}; known: jsonl, tensorboard, wandb"
            )
        if len(self.adam_betas) != 2:
            raise ValueError("trainer.adam_betas must hold two numbers")
        if self.keep_last < 1:
            raise ValueError("trainer.keep_last must be >= 1")
        if self.stop_without_signal < 0:
            raise ValueError("trainer.stop_without_signal must be >= 0")
        if self.max_nonfinite_in_a_row < 1:
            raise ValueError("trainer.max_nonfinite_in_a_row must be >= 1")
        if self.keep_best not in ("none", "val_em", "val_em_by_kind"):
            raise ValueError(
                f"trainer.keep_best: expected none | val_em | val_em_by_kind, got {self.keep_best!r}"
            )
        if self.keep_best != "none" and not self.val_every:
            raise ValueError(
                f"trainer.keep_best={self.keep_best} needs trainer.val_every > 0 (no validation, no best)"
            )
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"trainer.device: expected auto | cpu | cuda[:N], got {self.device!r}")


@dataclass
class ReplayConfig:
    enabled: bool = False
    """Replay what worked (ExGRPO, arXiv 2510.02245): keep successful trajectories per training question and put them into later groups of that question whose fresh trajectories all failed, trained with the importance ratio pi_theta / mu against their sampling log-probs (searchr1.trainer.replay). Off: on-policy only."""
    min_reward: float = 1.0
    """A trajectory is a success when its outcome reward (the reward total) is at least this (1.0: a right, well-formed answer under exact_match or search_r1)."""
    per_group: int = 1
    """Fresh trajectories of a group without a success replaced by stored successes of its question (the group's last ones; at most rollout.n - 1)."""
    max_share: float = 0.25
    """At most this share of a step's trajectories are replayed (the groups first in the batch get theirs); `replay/share` logs the share used."""
    keep_per_question: int = 1
    """Successes kept per question (the newest; the newest is replayed first). The buffer holds about 25 bytes a token of each kept trajectory (ids, roles, sampling log-probs) plus its text and hits."""
    max_age: int = 0
    """A stored success older than this many steps is no longer replayed, and dropped (0 = no limit)."""

    def validate(self, root: Any) -> None:
        if not (self.min_reward > float("-inf") and self.min_reward < float("inf")):
            raise ValueError(f"replay.min_reward must be a finite number, got {self.min_reward}")
        if self.per_group < 1:
            raise ValueError(f"replay.per_group must be >= 1, got {self.per_group}")
        if not 0.0 < self.max_share <= 1.0:
            raise ValueError(f"replay.max_share must be in (0, 1], got {self.max_share}")
        if self.keep_per_question < 1:
            raise ValueError(f"replay.keep_per_question must be >= 1, got {self.keep_per_question}")
        if self.max_age < 0:
            raise ValueError(f"replay.max_age must be >= 0, got {self.max_age}")
        if not self.enabled or root is None:
            return
        n = getattr(getattr(root, "rollout", None), "n", None)
        if n is not None and self.per_group > n - 1:
            raise ValueError(
                f"replay.per_group={self.per_group} with rollout.n={n}: a replayed group keeps at least one "
                "fresh trajectory (replay needs rollout.n >= 2 and replay.per_group <= rollout.n - 1)"
            )
        loss = getattr(getattr(root, "algorithm", None), "policy_loss", "ppo")
        if loss in ("vanilla", "reinforce"):
            raise ValueError(
                f"replay.enabled with algorithm.policy_loss={loss}: that loss has no importance ratio, so "
                "replayed trajectories would be trained as if the current policy had sampled them (use ppo or gspo)"
            )


@dataclass
class GuidanceConfig:
    off_policy: int = 0
    """Gold trajectories put into each group without a success (LUFFY, arXiv 2504.14945): the question's gold path (its gold titles searched in turn, real observations of the run's search backend, the gold answer) in the run's format, trained with policy shaping pi / (pi + shaping_gamma) instead of the PPO ratio; observations masked (searchr1.trainer.guidance). 0 = none."""
    branched: int = 0
    """Rollouts of each group without a success that continue the model's own generation from the gold prefix ending after the first <information> (BREAD, arXiv 2506.17211): the model writes the rest itself and only its tokens are trained. 0 = none."""
    share: float = 0.25
    """The guided share of a step's trajectories at step 0 (the groups first in the batch get theirs); the schedule lowers it to 0 by `decay_until`."""
    decay_until: float = 0.75
    """Fraction of trainer.total_steps at which the guided share reaches 0, linearly from `share`: the steps after it are unguided, so the policy kept at the end stands alone."""
    shaping_gamma: float = 0.1
    """gamma of the policy shaping f(pi) = pi / (pi + gamma) on gold tokens: a token the policy finds unlikely keeps a larger share of its gradient than under pi itself."""
    min_reward: float = 1.0
    """A group has a success when one of its trajectories' outcome reward reaches this (then it is not guided)."""
    min_hops: int = 1
    """Only questions whose gold path searches at least this many titles are guided (2: multi-hop questions only); branched rollouts need a path of at least one search."""
    decision_groups: int = 0
    """Decision groups per step and rank (searchr1.trainer.decision; SLATE arXiv 2602.23440, Tree-GRPO arXiv 2509.21240): groups whose rollout.n rollouts all continue, sampled by the current policy, from the question's gold prefix ending after the first <information> (the prefix is observation tokens, never trained), so the n continuations compare search-again with answer-now at the same point. Chosen among the groups whose question has a gold path of at least one search, alternating single-hop and multi-hop, whatever their success, before replay and guidance (which then leave them alone); generated in the step's rollout instead of those groups' fresh rollouts; every step, no decay. At most trainer.batch_size - 1 (and a rank's groups - 1): some groups always roll out from the prompt alone. 0 = none."""

    @property
    def enabled(self) -> bool:
        """Guidance of any kind is on (gold trajectories, branched rollouts or decision groups): the trainer
        builds the gold writer."""
        return self.off_policy > 0 or self.branched > 0 or self.decision_groups > 0

    def validate(self, root: Any) -> None:
        for key in ("off_policy", "branched"):
            if getattr(self, key) < 0:
                raise ValueError(f"guidance.{key} must be >= 0, got {getattr(self, key)}")
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"guidance.share must be in [0, 1], got {self.share}")
        if not 0.0 < self.decay_until <= 1.0:
            raise ValueError(f"guidance.decay_until must be in (0, 1], got {self.decay_until}")
        if self.shaping_gamma <= 0:
            raise ValueError(f"guidance.shaping_gamma must be > 0, got {self.shaping_gamma}")
        if self.min_hops < 1:
            raise ValueError(f"guidance.min_hops must be >= 1, got {self.min_hops}")
        if self.decision_groups < 0:
            raise ValueError(f"guidance.decision_groups must be >= 0, got {self.decision_groups}")
        if not self.enabled or root is None:
            return
        if self.decision_groups:
            self._validate_decisions(root)
        n = getattr(getattr(root, "rollout", None), "n", None)
        if n is not None and self.off_policy + self.branched > n - 1:
            raise ValueError(
                f"guidance.off_policy + guidance.branched = {self.off_policy + self.branched} with rollout.n={n}: "
                "a guided group keeps at least one trajectory of its own (at most rollout.n - 1 guided)"
            )
        advantage = getattr(getattr(root, "algorithm", None), "advantage", "grpo")
        if advantage == "gae":
            raise ValueError(
                "guidance with algorithm.advantage=gae: a gold trajectory's advantage needs a group baseline "
                "(use grpo, rloo or another group estimator)"
            )

    def _validate_decisions(self, root: Any) -> None:
        batch = getattr(getattr(root, "trainer", None), "batch_size", None)
        if batch is not None and self.decision_groups >= batch:
            raise ValueError(
                f"guidance.decision_groups={self.decision_groups} with trainer.batch_size={batch}: at least one "
                f"group of a step rolls out from the prompt alone (at most trainer.batch_size - 1 = {batch - 1})"
            )
        n = getattr(getattr(root, "rollout", None), "n", None)
        if n is not None and n < 2:
            raise ValueError(
                f"guidance.decision_groups={self.decision_groups} with rollout.n={n}: a decision group compares "
                "its continuations with each other (needs rollout.n >= 2)"
            )
        if getattr(getattr(root, "algorithm", None), "advantage", "grpo") == "gae":
            raise ValueError(
                f"guidance.decision_groups={self.decision_groups} with algorithm.advantage=gae: a decision "
                "group's continuations are compared with each other (use grpo, rloo or another group estimator)"
            )


@dataclass
class WarmStartConfig:
    epochs: float = 0.0
    """Passes over the training questions' gold trajectories before RL (supervised LoRA, observations masked; searchr1.trainer.warmstart); 0 = no warm start. A fraction runs that share of one pass."""
    lr: float = 1.0e-3
    """Learning rate of the warm start's LoRA (AdamW, constant after `warmup_steps`)."""
    warmup_steps: int = 2
    """Optimizer steps of linear learning-rate warm-up."""
    batch_size: int = 16
    """Gold trajectories per optimizer step."""
    micro_batch_size: int = 8
    """Trajectories per forward/backward pass (gradients accumulate over the step)."""
    max_examples: int = 0
    """Training questions used at most (the first N with a gold path; 0 = all)."""
    save_every: int = 10
    """Optimizer steps between checkpoints of the warm start (also written at the end); 0 = only at the end."""
    decision_weight: float = 1.0
    """Weight in the loss of the tokens where a gold trajectory decides after its first passage (the turn after it, from the end of its quoted evidence: `I should search ...` or `</think> <answer> ...`); 1 = every generated token alike."""
    holdout: int = 0
    """Training questions held out of the warm start (half single-, half multi-hop, seeded) on which its decision is checked, teacher-forced (searchr1.trainer.warmstart_check); 0 = no check."""
    check_every: int = 10
    """Optimizer steps between checks on the held-out slice (also at the end); the adapter of the best check is kept."""
    stop_at: float = 1.0
    """Stop the warm start once the held-out decision accuracy reaches this (1.0 = run every pass)."""
    out_dir: str = ""
    """Folder of the warm start (checkpoint, model/, warmstart.json); empty = <trainer.out_dir>/warmstart."""
    lora_layers: int = 0
    """The warm start's adapter on the top N decoder layers only (0 = every layer, as `model.lora_*`): the layers below stay the base model's, so the backward pass stops above them. RL adapts every layer as before."""

    @property
    def enabled(self) -> bool:
        return self.epochs > 0

    def validate(self, root: Any) -> None:
        if self.epochs < 0:
            raise ValueError(f"warmstart.epochs must be >= 0, got {self.epochs}")
        if not self.lr > 0:
            raise ValueError(f"warmstart.lr must be > 0, got {self.lr}")
        for key in ("batch_size", "micro_batch_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"warmstart.{key} must be >= 1, got {getattr(self, key)}")
        if not self.decision_weight >= 1.0:
            raise ValueError(f"warmstart.decision_weight must be >= 1, got {self.decision_weight}")
        if not 0.5 < self.stop_at <= 1.0:
            raise ValueError(f"warmstart.stop_at must be in (0.5, 1], got {self.stop_at}")
        if self.check_every < 1:
            raise ValueError(f"warmstart.check_every must be >= 1, got {self.check_every}")
        for key in ("warmup_steps", "max_examples", "save_every", "holdout", "lora_layers"):
            if getattr(self, key) < 0:
                raise ValueError(f"warmstart.{key} must be >= 0, got {getattr(self, key)}")
        if self.enabled and root is not None and getattr(getattr(root, "model", None), "lora_r", 0) <= 0:
            raise ValueError(
                "warmstart.epochs > 0 needs LoRA (model.lora_r > 0): the warm start trains an adapter"
            )
