"""Learning-rate schedules and the resumable prompt sampler.

The schedule multiplies the peak learning rate by::

    warm-up   (s < w):      (s + 1) / w
    constant  (s >= w):     1
    linear    (s >= w):     floor + (1 - floor) * (1 - p),            p = (s - w) / (T - w)
    cosine    (s >= w):     floor + (1 - floor) * 0.5 * (1 + cos(pi * p))

with s the training step, T = total_steps, floor = min_lr_ratio.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def lr_multiplier(step: int, total_steps: int, warmup_steps: int, kind: str, min_ratio: float) -> float:
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if kind == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, max(0.0, (step - warmup_steps) / span))
    if kind == "linear":
        decay = 1.0 - progress
    elif kind == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"trainer.lr_schedule: unknown schedule {kind!r}")
    return min_ratio + (1.0 - min_ratio) * decay


def make_scheduler(optimizer: Any, trainer_cfg: Any, critic: bool = False) -> Any:
    """A LambdaLR stepped once per training step (the critic may have its own warm-up ratio)."""
    import torch

    warmup = trainer_cfg.lr_warmup_steps or round(trainer_cfg.lr_warmup_ratio * trainer_cfg.total_steps)
    if critic and trainer_cfg.critic_lr_warmup_ratio >= 0:
        warmup = round(trainer_cfg.critic_lr_warmup_ratio * trainer_cfg.total_steps)

    def fn(step: int) -> float:
        return lr_multiplier(
            step, trainer_cfg.total_steps, warmup, trainer_cfg.lr_schedule, trainer_cfg.min_lr_ratio
        )

    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


class PromptSampler:
    """Yields batches of sample indices, epoch after epoch, reshuffled with a seeded permutation.

    Its state (epoch, position) is saved in checkpoints, so a resumed run sees the same prompts.
    """

    def __init__(self, num_samples: int, batch_size: int, seed: int, shuffle: bool = True) -> None:
        if num_samples < batch_size:
            raise ValueError(
                f"trainer.batch_size={batch_size} is larger than the training set ({num_samples} prompts)"
            )
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_samples)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)

    def next_batch(self) -> list[int]:
        """The next ``batch_size`` indices; an epoch's incomplete tail is dropped."""
        if self.position + self.batch_size > self.num_samples:
            self.epoch += 1
            self.position = 0
            self._order = self._permutation(self.epoch)
        batch = self._order[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return [int(i) for i in batch]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "num_samples": self.num_samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("num_samples", self.num_samples) != self.num_samples:
            raise ValueError(
                f"the checkpoint was trained on {state['num_samples']} prompts but the data now has "
                f"{self.num_samples}: resume needs the same training data"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._permutation(self.epoch)
