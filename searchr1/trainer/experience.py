"""Trajectories -> padded tensors, and the split into mini- and micro-batches.

One row per trajectory, right-padded: ``input_ids = prompt + response``. Every per-token tensor is
aligned with ``input_ids`` (``logprobs[b, t] = log p(input_ids[b, t] | input_ids[b, :t])``).

* ``train_mask``: tokens the loss is computed on. The rollout's generated tokens; with
  ``trainer.mask_observations=false`` also the observation tokens (the paper's ablation).
* ``gen_mask``: the generated tokens, always (for metrics).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from searchr1.rollout.types import Role, Trajectory


@dataclass
class Experience:
    """A rollout batch as tensors (CPU), plus what the update computes on it."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    train_mask: torch.Tensor
    gen_mask: torch.Tensor
    group_ids: list[int]
    scores: torch.Tensor
    """Total reward per trajectory ``[B]``."""
    seq_lens: torch.Tensor
    """Real tokens per row ``[B]``."""
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: Sequence[int]) -> Experience:
        """The sub-batch of ``rows``, trimmed to its own longest sequence (less padding)."""
        idx = torch.as_tensor(list(rows), dtype=torch.long)
        width = int(self.seq_lens[idx].max()) if len(idx) else 1

        def cut(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[idx, :width]

        return Experience(
            input_ids=cut(self.input_ids),
            attention_mask=cut(self.attention_mask),
            train_mask=cut(self.train_mask),
            gen_mask=cut(self.gen_mask),
            group_ids=[self.group_ids[i] for i in idx.tolist()],
            scores=self.scores[idx],
            seq_lens=self.seq_lens[idx],
            old_logprobs=cut(self.old_logprobs),
            ref_logprobs=cut(self.ref_logprobs),
            values=cut(self.values),
            advantages=cut(self.advantages),
            returns=cut(self.returns),
            extras={k: v[idx] if v.dim() == 1 else v[idx, :width] for k, v in self.extras.items()},
        )

    def to(self, device: torch.device) -> Experience:
        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return Experience(
            input_ids=mv(self.input_ids),
            attention_mask=mv(self.attention_mask),
            train_mask=mv(self.train_mask),
            gen_mask=mv(self.gen_mask),
            group_ids=self.group_ids,
            scores=mv(self.scores),
            seq_lens=mv(self.seq_lens),
            old_logprobs=mv(self.old_logprobs),
            ref_logprobs=mv(self.ref_logprobs),
            values=mv(self.values),
            advantages=mv(self.advantages),
            returns=mv(self.returns),
            extras={k: mv(v) for k, v in self.extras.items()},
        )


def concat_experiences(parts: Sequence[Experience]) -> Experience:
    """Rows of several experiences in order, right-padded to the widest (pad id 0, masks 0)."""
    parts = [p for p in parts if len(p)]
    width = max(p.input_ids.shape[1] for p in parts)

    def cat(name: str) -> torch.Tensor | None:
        ts = [getattr(p, name) for p in parts]
        if any(t is None for t in ts):
            return None
        return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in ts])

    extras = {}
    for key in parts[0].extras:
        ts = [p.extras[key] for p in parts]
        extras[key] = torch.cat(
            ts if ts[0].dim() == 1 else [torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in ts]
        )
    return Experience(
        input_ids=cat("input_ids"),
        attention_mask=cat("attention_mask"),
        train_mask=cat("train_mask"),
        gen_mask=cat("gen_mask"),
        group_ids=[g for p in parts for g in p.group_ids],
        scores=torch.cat([p.scores for p in parts]),
        seq_lens=torch.cat([p.seq_lens for p in parts]),
        old_logprobs=cat("old_logprobs"),
        ref_logprobs=cat("ref_logprobs"),
        values=cat("values"),
        advantages=cat("advantages"),
        returns=cat("returns"),
        extras=extras,
    )


def gather_experience(exp: Experience, info: Any) -> Experience:
    """Every rank's experience on every rank (rank order): advantages that whiten or average over the
    batch, and mini-batches of whole groups, are then the same whatever the world size."""
    if not info.enabled:
        return exp
    from searchr1.trainer.distributed import all_gather_objects

    return concat_experiences(all_gather_objects(exp, info))


def rank_share(rows: Sequence[int], group_ids: Sequence[int], rank: int, world: int) -> list[int]:
    """This rank's part of a mini-batch: an equal number of whole groups per rank."""
    groups: dict[int, list[int]] = {}
    for r in rows:
        groups.setdefault(group_ids[r], []).append(r)
    keys = list(groups)
    if len(keys) % world:
        raise ValueError(f"a mini-batch of {len(keys)} groups cannot be shared by {world} ranks")
    per = len(keys) // world
    return [r for g in keys[rank * per : (rank + 1) * per] for r in groups[g]]


def build_experience(
    trajectories: Sequence[Trajectory],
    scores: Sequence[float],
    group_ids: Sequence[int],
    pad_token_id: int,
    mask_observations: bool = True,
) -> Experience:
    """Pad trajectories into one batch (right padding)."""
    if not trajectories:
        raise ValueError("build_experience: no trajectories")
    lens = [len(t.prompt_ids) + len(t.response_ids) for t in trajectories]
    width = max(lens)
    b = len(trajectories)
    input_ids = torch.full((b, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((b, width), dtype=torch.long)
    train_mask = torch.zeros((b, width), dtype=torch.bool)
    gen_mask = torch.zeros((b, width), dtype=torch.bool)
    trainable = {int(Role.GENERATED)} if mask_observations else {int(Role.GENERATED), int(Role.OBSERVATION)}
    for i, traj in enumerate(trajectories):
        if len(traj.roles) != len(traj.response_ids):
            raise ValueError(
                f"trajectory {i}: {len(traj.roles)} roles for {len(traj.response_ids)} response tokens"
            )
        p = len(traj.prompt_ids)
        ids = list(traj.prompt_ids) + list(traj.response_ids)
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
        roles = torch.tensor([int(r) for r in traj.roles], dtype=torch.long)
        if len(roles):
            gen_mask[i, p : p + len(roles)] = roles == int(Role.GENERATED)
            train_mask[i, p : p + len(roles)] = torch.isin(roles, torch.tensor(sorted(trainable)))
    return Experience(
        input_ids=input_ids,
        attention_mask=attention_mask,
        train_mask=train_mask,
        gen_mask=gen_mask,
        group_ids=list(group_ids),
        scores=torch.tensor(list(scores), dtype=torch.float32),
        seq_lens=torch.tensor(lens, dtype=torch.long),
    )


def split_groups(
    group_ids: Sequence[int], num_chunks: int, order: Sequence[int] | None = None
) -> list[list[int]]:
    """Row indices split into ``num_chunks`` chunks of whole groups (groups visited in ``order``)."""
    groups: dict[int, list[int]] = {}
    for row, g in enumerate(group_ids):
        groups.setdefault(g, []).append(row)
    keys = list(groups)
    if order is not None:
        keys = [keys[i] for i in order]
    if len(keys) % num_chunks:
        raise ValueError(f"{len(keys)} groups cannot be split into {num_chunks} equal mini-batches")
    per = len(keys) // num_chunks
    return [[r for g in keys[c * per : (c + 1) * per] for r in groups[g]] for c in range(num_chunks)]


def micro_batches(
    rows: Sequence[int], seq_lens: torch.Tensor, max_rows: int, max_tokens: int = 0
) -> list[list[int]]:
    """Length-bucketed micro-batches: rows sorted by length, cut by count or by a padded-token budget.

    With ``max_tokens > 0`` a micro-batch holds as many rows as fit ``rows * longest <= max_tokens``
    (at least one), so short sequences share a micro-batch and long ones get their own.
    """
    ordered = sorted(rows, key=lambda r: (-int(seq_lens[r]), r))
    out: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for r in ordered:
        length = int(seq_lens[r])
        new_longest = max(longest, length)
        too_many = (
            len(current) >= max_rows if max_tokens <= 0 else new_longest * (len(current) + 1) > max_tokens
        )
        if current and too_many:
            out.append(current)
            current, new_longest = [], length
        current.append(r)
        longest = new_longest
    if current:
        out.append(current)
    return out
