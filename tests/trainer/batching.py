"""Micro-batches of variable-length sequences that waste little on padding: the three ways compared.

(Test-only: the trainer cuts its micro-batches with ``searchr1.trainer.experience.micro_batches``, the
``bucket`` way below; ``pack`` and ``pad`` are kept here to test the log-prob paths of packed rows and
to compare padding.)

A mini-batch of trajectories has long-tailed lengths (a 150-token answer next to a 1,500-token
multi-search episode). Padding all of them to the longest one spends most of the forward and
backward pass on pad tokens. Three ways to cut a list of samples into micro-batches of at most
``max_tokens`` token slots (rows x columns, padding included):

- ``pad``: the naive baseline. Samples in their order, every micro-batch padded to the longest
  sequence of the whole list, ``max_tokens // longest`` rows each.
- ``bucket``: samples sorted by length (longest first) and grouped greedily while
  ``rows x longest-in-group <= max_tokens``; right padding to the group's longest. Neighbours in the
  sorted order have similar lengths, so little padding is left. Works with every attention kernel.
- ``pack``: first-fit-decreasing bin packing of whole sequences into one row of at most
  ``max_tokens`` tokens, ``position_ids`` restarting at 0 for every sequence, no padding at all.
  ``searchr1.trainer.logprobs`` keeps the sequences of a row apart (flash-attention varlen on GPU
  from the ``position_ids``; an explicit block-diagonal causal mask for sdpa / eager). On CPU the
  masked attention is computed over the whole row (cost ~ row_length^2 instead of sum of
  length^2), so ``bucket`` is usually the faster choice there; ``pack`` pays off with
  flash-attention.

Per-token results come back to the samples with ``scatter_to_samples``. Every micro-batch carries
``sample_ids`` (``[R, L]``, -1 on padding) for per-sequence reductions (sequence-level losses such
as GSPO, per-sample means) in any mode. Sequences are never split; a sequence longer than
``max_tokens`` gets a micro-batch of its own.

Loss aggregation across micro-batches is the trainer's: with a token-mean over the mini-batch,
sum each micro-batch's per-token losses and divide by the mini-batch's token count (not the
micro-batch's), so the gradient does not depend on how the samples were cut.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch

from searchr1.trainer.experience import longest_first, plan_buckets

Mode = Literal["bucket", "pack", "pad"]
MODES: tuple[str, ...] = get_args(Mode)


@dataclass(frozen=True)
class Segment:
    """Where one sample lies inside a micro-batch: ``row``, columns ``start:start + length``."""

    sample: int
    row: int
    start: int
    length: int


@dataclass
class MicroBatch:
    """Padded / packed tensors of a few samples and the map back to them."""

    input_ids: torch.Tensor
    """``[R, L]`` token ids (``pad_token_id`` on padding)."""
    attention_mask: torch.Tensor
    """``[R, L]`` 1 on real tokens, 0 on padding (2D: packing is carried by ``position_ids``)."""
    position_ids: torch.Tensor
    """``[R, L]`` positions inside each sequence; restart at 0 where a packed sequence starts."""
    sample_ids: torch.Tensor
    """``[R, L]`` index of the sample each token belongs to; -1 on padding."""
    fields: dict[str, torch.Tensor]
    """Per-token sample fields (loss mask, advantages, old log-probs, ...), ``[R, L]``, 0 on padding."""
    segments: list[Segment]
    mode: str

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens."""
        return sum(s.length for s in self.segments)

    @property
    def num_slots(self) -> int:
        """Token slots computed, padding included (``R * L``)."""
        return self.input_ids.numel()

    @property
    def samples(self) -> list[int]:
        return [s.sample for s in self.segments]

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments for ``token_logprobs`` / ``ValueModel``."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
        }

    def to(self, device: torch.device | str) -> MicroBatch:
        return MicroBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            position_ids=self.position_ids.to(device),
            sample_ids=self.sample_ids.to(device),
            fields={k: v.to(device) for k, v in self.fields.items()},
            segments=self.segments,
            mode=self.mode,
        )


@dataclass
class _Sample:
    input_ids: torch.Tensor
    fields: dict[str, torch.Tensor] = field(default_factory=dict)


def trajectory_sample(trajectory: Any, **per_token: Sequence[float]) -> dict[str, Any]:
    """A sample dict from a ``searchr1.rollout.types.Trajectory``: the full sequence (prompt +
    response), ``loss_mask`` (1 on generated tokens) and ``old_logprobs`` (sampling log-probs,
    aligned like ``token_logprobs``: entry t is the log-prob of token t), zeros on the prompt.
    Extra ``per_token`` fields must already cover the full sequence."""
    prompt = list(trajectory.prompt_ids)
    n_prompt = len(prompt)
    sample: dict[str, Any] = {
        "input_ids": prompt + list(trajectory.response_ids),
        "loss_mask": [0] * n_prompt + list(trajectory.loss_mask),
        "old_logprobs": [0.0] * n_prompt + [float(x) for x in trajectory.logprobs],
    }
    sample.update(per_token)
    return sample


def _as_samples(samples: Sequence[Mapping[str, Any]]) -> list[_Sample]:
    out = []
    for i, raw in enumerate(samples):
        if "input_ids" not in raw:
            raise ValueError(f"sample {i}: missing 'input_ids'")
        ids = torch.as_tensor(raw["input_ids"], dtype=torch.long).reshape(-1)
        if ids.numel() == 0:
            raise ValueError(f"sample {i}: empty 'input_ids'")
        fields = {}
        for key, value in raw.items():
            if key == "input_ids":
                continue
            t = torch.as_tensor(value)
            if t.dtype.is_floating_point:
                t = t.float()
            if t.shape[:1] != ids.shape:
                raise ValueError(
                    f"sample {i}: field '{key}' has {t.shape[0] if t.dim() else 0} entries, "
                    f"input_ids has {ids.numel()} (per-token fields must match)"
                )
            fields[key] = t
        out.append(_Sample(ids, fields))
    keys = set(out[0].fields) if out else set()
    for i, s in enumerate(out):
        if set(s.fields) != keys:
            raise ValueError(f"sample {i}: fields {sorted(s.fields)} differ from sample 0's {sorted(keys)}")
    return out


def plan_packs(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """First-fit-decreasing bin packing: rows of whole sequences with at most ``max_tokens`` tokens
    (a sequence longer than ``max_tokens`` is alone in its row)."""
    bins: list[list[int]] = []
    free: list[int] = []
    for i in longest_first(lengths):
        n = lengths[i]
        for b, room in enumerate(free):
            if n <= room:
                bins[b].append(i)
                free[b] -= n
                break
        else:
            bins.append([i])
            free.append(max_tokens - n)
    return bins


def plan_padded(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """The naive plan: samples in order, ``max(1, max_tokens // longest)`` per micro-batch."""
    rows = max(1, max_tokens // max(lengths))
    return [list(range(s, min(s + rows, len(lengths)))) for s in range(0, len(lengths), rows)]


def make_micro_batches(
    samples: Sequence[Mapping[str, Any]],
    max_tokens_per_micro_batch: int,
    mode: Mode | str = "bucket",
    *,
    pad_token_id: int = 0,
) -> list[MicroBatch]:
    """Cut ``samples`` into micro-batches (see the module docstring for the modes).

    Each sample is a mapping with ``input_ids`` (a sequence of ints) and any number of per-token
    fields of the same length (``loss_mask``, ``advantages``, ``old_logprobs``, ``ref_logprobs``,
    ``values``, ``returns``, ...), which come back as ``[R, L]`` tensors in ``MicroBatch.fields``
    (floats as float32, zeros on padding).
    """
    if mode not in MODES:
        raise ValueError(f"batching mode must be one of {MODES}, got {mode!r}")
    if max_tokens_per_micro_batch < 1:
        raise ValueError(f"max_tokens_per_micro_batch must be >= 1, got {max_tokens_per_micro_batch}")
    parsed = _as_samples(samples)
    if not parsed:
        return []
    lengths = [s.input_ids.numel() for s in parsed]
    if mode == "pack":
        return [
            _packed_row(parsed, group, pad_token_id)
            for group in plan_packs(lengths, max_tokens_per_micro_batch)
        ]
    if mode == "bucket":
        groups = plan_buckets(lengths, max_tokens_per_micro_batch)
        return [_padded_rows(parsed, g, max(lengths[i] for i in g), pad_token_id, mode) for g in groups]
    longest = max(lengths)
    groups = plan_padded(lengths, max_tokens_per_micro_batch)
    return [_padded_rows(parsed, g, longest, pad_token_id, mode) for g in groups]


def _empty_fields(parsed: list[_Sample], shape: tuple[int, int]) -> dict[str, torch.Tensor]:
    first = parsed[0].fields
    return {k: torch.zeros(shape + tuple(v.shape[1:]), dtype=v.dtype) for k, v in first.items()}


def _padded_rows(parsed: list[_Sample], group: list[int], width: int, pad_id: int, mode: str) -> MicroBatch:
    shape = (len(group), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    attention_mask = torch.zeros(shape, dtype=torch.long)
    sample_ids = torch.full(shape, -1, dtype=torch.long)
    fields = _empty_fields(parsed, shape)
    segments = []
    for row, i in enumerate(group):
        s = parsed[i]
        n = s.input_ids.numel()
        input_ids[row, :n] = s.input_ids
        attention_mask[row, :n] = 1
        sample_ids[row, :n] = i
        for k, v in s.fields.items():
            fields[k][row, :n] = v
        segments.append(Segment(sample=i, row=row, start=0, length=n))
    position_ids = torch.arange(width, dtype=torch.long).expand(shape).clone()
    return MicroBatch(input_ids, attention_mask, position_ids, sample_ids, fields, segments, mode)


def _packed_row(parsed: list[_Sample], group: list[int], pad_id: int) -> MicroBatch:
    width = sum(parsed[i].input_ids.numel() for i in group)
    shape = (1, width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    sample_ids = torch.full(shape, -1, dtype=torch.long)
    fields = _empty_fields(parsed, shape)
    segments = []
    start = 0
    for i in group:
        s = parsed[i]
        n = s.input_ids.numel()
        input_ids[0, start : start + n] = s.input_ids
        position_ids[0, start : start + n] = torch.arange(n)
        sample_ids[0, start : start + n] = i
        for k, v in s.fields.items():
            fields[k][0, start : start + n] = v
        segments.append(Segment(sample=i, row=0, start=start, length=n))
        start += n
    attention_mask = torch.ones(shape, dtype=torch.long)
    return MicroBatch(input_ids, attention_mask, position_ids, sample_ids, fields, segments, "pack")


def scatter_to_samples(
    micro_batches: Sequence[MicroBatch], values: Sequence[torch.Tensor], num_samples: int | None = None
) -> list[torch.Tensor]:
    """Per-sample tensors (``[len_i, ...]``, in the original sample order) from per-micro-batch
    results ``values[j]`` shaped like ``micro_batches[j].input_ids`` (``[R, L, ...]``)."""
    if len(values) != len(micro_batches):
        raise ValueError(f"got {len(values)} result tensors for {len(micro_batches)} micro-batches")
    n = num_samples if num_samples is not None else sum(len(mb.segments) for mb in micro_batches)
    out: list[torch.Tensor | None] = [None] * n
    for j, (mb, v) in enumerate(zip(micro_batches, values, strict=True)):
        if tuple(v.shape[:2]) != tuple(mb.input_ids.shape):
            raise ValueError(
                f"result {j} has shape {tuple(v.shape)}, micro-batch is {tuple(mb.input_ids.shape)}"
            )
        for seg in mb.segments:
            out[seg.sample] = v[seg.row, seg.start : seg.start + seg.length]
    missing = [i for i, t in enumerate(out) if t is None]
    if missing:
        raise ValueError(f"no result for samples {missing[:10]}")
    return out  # type: ignore[return-value]


def padding_stats(micro_batches: Sequence[MicroBatch]) -> dict[str, float]:
    """``tokens``, ``slots`` (padding included), ``padding_fraction`` and ``micro_batches``."""
    tokens = sum(mb.num_tokens for mb in micro_batches)
    slots = sum(mb.num_slots for mb in micro_batches)
    return {
        "tokens": float(tokens),
        "slots": float(slots),
        "padding_fraction": 1.0 - tokens / slots if slots else 0.0,
        "micro_batches": float(len(micro_batches)),
    }
