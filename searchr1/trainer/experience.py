"""Trajectories -> padded tensors, and the split into mini- and micro-batches.

One row per trajectory, right-padded: ``input_ids = prompt + response``. Every per-token tensor is
aligned with ``input_ids`` (``logprobs[b, t] = log p(input_ids[b, t] | input_ids[b, :t])``).

* ``train_mask``: tokens the loss is computed on. The rollout's generated tokens; with
  ``trainer.mask_observations=false`` also the observation tokens (the paper's ablation).
* ``gen_mask``: the generated tokens, always (for metrics).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from searchr1.rollout.types import Role, Trajectory
from searchr1.trainer.distributed import all_gather_objects

PER_TOKEN = (
    "input_ids", "attention_mask", "train_mask", "gen_mask",
    "old_logprobs", "ref_logprobs", "values", "advantages", "returns",
)  # fmt: skip
"""``Experience`` tensors ``[B, T]`` aligned with ``input_ids`` (optional ones may be None)."""
PER_ROW = ("scores", "seq_lens")
"""``Experience`` tensors ``[B]``."""


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
            **{k: cut(getattr(self, k)) for k in PER_TOKEN},
            **{k: getattr(self, k)[idx] for k in PER_ROW},
            group_ids=[self.group_ids[i] for i in idx.tolist()],
            extras={k: v[idx] if v.dim() == 1 else v[idx, :width] for k, v in self.extras.items()},
        )

    def to(self, device: torch.device) -> Experience:
        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return replace(
            self,
            **{k: mv(getattr(self, k)) for k in PER_TOKEN + PER_ROW},
            extras={k: mv(v) for k, v in self.extras.items()},
        )


assert {f.name for f in fields(Experience)} == {*PER_TOKEN, *PER_ROW, "group_ids", "extras"}


def concat_experiences(parts: Sequence[Experience]) -> Experience:
    """Rows of several experiences in order, right-padded to the widest (pad id 0, masks 0)."""
    parts = [p for p in parts if len(p)]
    width = max(p.input_ids.shape[1] for p in parts)

    def widen(t: torch.Tensor) -> torch.Tensor:
        return t if t.dim() == 1 else torch.nn.functional.pad(t, (0, width - t.shape[1]))

    def cat(ts: list[torch.Tensor | None]) -> torch.Tensor | None:
        return None if any(t is None for t in ts) else torch.cat([widen(t) for t in ts])

    return Experience(
        **{k: cat([getattr(p, k) for p in parts]) for k in PER_TOKEN + PER_ROW},
        group_ids=[g for p in parts for g in p.group_ids],
        extras={k: cat([p.extras[k] for p in parts]) for k in parts[0].extras},
    )


def gather_experience(exp: Experience, info: Any) -> Experience:
    """Every rank's experience on every rank (rank order): advantages that whiten or average over the
    batch, and mini-batches of whole groups, are then the same whatever the world size."""
    if not info.enabled:
        return exp

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


def rows_with_signal(
    scores: Sequence[float], group_ids: Sequence[int], multiple: int = 1, signal_groups: Collection[int] = ()
) -> list[int]:
    """Rows of the groups whose rewards are not all equal (or that are in ``signal_groups``: their
    search turns' step rewards differ), in row order (DAPO's group filter).

    The count of groups kept is made a multiple of ``multiple`` (ranks x mini-batches, so whole groups
    still share out evenly) by adding the fewest groups without signal, first ones first; none kept
    when no group has signal."""
    groups: dict[int, list[int]] = {}
    for row, gid in enumerate(group_ids):
        groups.setdefault(gid, []).append(row)
    signal = [
        g
        for g, rows in groups.items()
        if g in signal_groups or max(scores[r] for r in rows) > min(scores[r] for r in rows)
    ]
    if not signal:
        return []
    flat = [g for g in groups if g not in signal]
    keep = set(signal) | set(flat[: -len(signal) % max(1, multiple)])
    return [row for g, rows in groups.items() if g in keep for row in rows]


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
    (at least one), so short sequences share a micro-batch and long ones get their own
    (``plan_buckets``); otherwise ``max_rows`` rows each.
    """
    rows = sorted(rows)  # index order = row order: equal lengths keep row order
    lengths = [int(seq_lens[r]) for r in rows]
    if max_tokens > 0:
        groups = plan_buckets(lengths, max_tokens)
    else:
        order, step = longest_first(lengths), max(1, max_rows)
        groups = [order[s : s + step] for s in range(0, len(order), step)]
    return [[rows[i] for i in g] for g in groups]


def longest_first(lengths: Sequence[int]) -> list[int]:
    """Row indices by decreasing length, ties in index order."""
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


def plan_buckets(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Groups of row indices, longest first, with ``len(group) * max_length(group) <= max_tokens``
    (a sequence longer than ``max_tokens`` is alone): little padding, any attention kernel."""
    groups: list[list[int]] = []
    for i in longest_first(lengths):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
