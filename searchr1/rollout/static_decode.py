"""Decode steps of fixed shapes for the slot decoder (``SlotBatch``), replayable as CUDA graphs.

A decode step (one new token for some slots, nothing else) runs ~10 small kernels per layer. On a GPU, at
batch 64 of a 135M-parameter model each of them takes microseconds, so the step is bound by the host
launching them (30 layers x ~10 kernels, plus the indexing around them), not by the card. A CUDA graph
(``torch.cuda.CUDAGraph``) records the kernels of one step once and replays them with a single launch; it
needs every shape and every address fixed, so the step is laid out as follows:

* **Rows in buckets.** A step over slots ``0 .. w - 1`` (the fed ones and those waiting between them) runs
  over the smallest bucket ``B >= w`` of ``BUCKETS`` rows (``searchr1.rollout.decode_modes``); rows that are
  not fed are computed and dropped. The slot buffers hold at least ``B`` rows and keep them through
  compaction (``SlotBatch.fixed_rows``). A step wider than the largest bucket runs eagerly (one line says
  so, once per batch).
* **Fixed columns.** Attention reads every column of the slot buffers (``capacity``), masked past each row's
  length, as the eager step does; the engine reserves each slot's columns up front (``columns=``), and a
  buffer that must grow anyway drops the captured graphs (they are captured again on the new buffers).
* **Inputs in one static tensor.** Per bucket, ``[4, B]`` integers: the token, the column its key goes to,
  whether the row is fed, and the keys the row's query sees; filled on the host and copied to the device in
  one transfer per step.
* **No writes that depend on the schedule.** Every row writes its new key and value at its column, and a row
  that is not fed writes back what the column held (``where(fed, k, old)``), so waiting slots keep their
  columns; the rotary table covers ``prefix + capacity`` positions up front (no host read of the largest
  position during the step).

Everything but the capture and replay is plain PyTorch on any device: on a CPU the static step
(``SlotBatch(decode="static")``) gives the eager step's greedy tokens in float32
(``tests/rollout/test_static_decode.py``). Capture and replay are CUDA only (``decode="graphs"``); asking for
them elsewhere is refused with one line. Graphs live as long as their ``SlotBatch`` (one ``generate`` call):
each bucket the call uses is captured once, after two warm-up runs, and shares one memory pool.

Sampling stays outside the graph, on the device (``searchr1.rollout.sampling``); the sampled ids come back to
the host once per step, since each row's episode (``searchr1.rollout.episode``) reads its tokens there.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch

from searchr1.rollout.decode_modes import BUCKETS, bucket_for, check_graphs_device

WARMUP_RUNS = 2
"""Runs of a bucket's step on a side stream before its capture (PyTorch's recipe: lazy initialisations)."""


class SlotBuffers(Protocol):
    """What the fixed-shape steps read and call on their batch: the members of ``SlotBatch``
    (``searchr1.rollout.slots``, which owns a ``StaticDecode`` and imports this module) that they use."""

    device: torch.device
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: list[int]
    prefix_len: int
    heads: int
    kv_heads: int
    group: int
    head_dim: int
    fed_tokens: int
    forward_calls: int
    w: Any
    """The decode weights (``slots.DecodeWeights``): ``embedding``, ``head``, ``final_norm``."""
    _turns: torch.Tensor

    @property
    def capacity(self) -> int: ...

    def _reserve(self, columns: int) -> None: ...

    def _turn_table(self, need: int) -> torch.Tensor: ...

    def _norm(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor: ...

    def _layers(
        self,
        h: torch.Tensor,
        turns: tuple[torch.Tensor, torch.Tensor],
        attend: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor: ...

    def _attention(
        self, i: int, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, hidden: torch.Tensor
    ) -> torch.Tensor: ...


class StaticDecode:
    """The fixed-shape decode steps of one ``SlotBatch``; see the module docstring."""

    def __init__(self, batch: SlotBuffers, graphs: bool, buckets: tuple[int, ...] = BUCKETS) -> None:
        if graphs:
            check_graphs_device(batch.device)
        self.batch: SlotBuffers = weakref.proxy(batch)  # no reference cycle: the buffers go with their batch
        self.graphs = graphs
        self.buckets = buckets
        self.inputs: dict[int, torch.Tensor] = {}
        """Per bucket ``[4, B]`` long on the device: token, column, fed (0/1), visible keys."""
        self.outputs: dict[int, torch.Tensor] = {}
        """Per captured bucket: the logits ``[B, vocab]`` its graph writes."""
        self.captured: dict[int, Any] = {}
        self.pool: Any = None
        self.layout: tuple[int, ...] = ()
        self.static_steps = 0
        self.eager_steps = 0
        self.captures = 0
        self._noted = False

    # -- one step ------------------------------------------------------------------------------------

    def step(self, slots: list[int], tokens: list[int]) -> torch.Tensor | None:
        """Feed ``tokens[i]`` to ``slots[i]`` (sorted); the next-token logits ``[len(slots), vocab]``, or
        None (nothing done) when the step is wider than the largest bucket."""
        b = self.batch
        width = slots[-1] + 1
        rows = bucket_for(width, self.buckets)
        if rows is None or rows > b.keys[0].shape[0]:
            self.eager_steps += 1
            if not self._noted:
                self._noted = True
                print(
                    f"note: a decode step over {width} slots is wider than the largest static bucket "
                    f"({self.buckets[-1]} rows); such steps run eagerly",
                    file=sys.stderr,
                )
            return None
        b._reserve(max(b.lengths[s] for s in slots) + 1)  # a fed key goes at the slot's length
        self._check_layout()
        self._fill(rows, slots, tokens)
        logits = self._replay(rows) if self.graphs else self.run(rows)
        for s in slots:
            b.lengths[s] += 1
        b.fed_tokens += len(slots)
        b.forward_calls += 1
        self.static_steps += 1
        if slots != list(range(rows)):
            logits = logits.index_select(0, torch.tensor(slots, device=b.device))
        return logits

    def _fill(self, rows: int, slots: list[int], tokens: list[int]) -> None:
        """Write the step's inputs into the bucket's static tensor (one host-to-device copy)."""
        b = self.batch
        host = torch.zeros(4, rows, dtype=torch.long)
        lengths = b.lengths + [0] * (rows - len(b.lengths))
        last = b.capacity - 1
        host[1] = torch.tensor([min(n, last) for n in lengths[:rows]])  # waiting rows rewrite a column
        visible = lengths[:rows] if b.prefix_len else [max(1, n) for n in lengths[:rows]]  # no NaN rows
        host[3] = torch.tensor(visible)
        fed = torch.tensor(slots)
        host[0, fed] = torch.tensor(tokens)
        host[2, fed] = 1
        host[3, fed] = host[1, fed] + 1
        buf = self.inputs.get(rows)
        if buf is None:
            buf = self.inputs[rows] = torch.zeros(4, rows, dtype=torch.long, device=b.device)
        buf.copy_(host, non_blocking=False)

    # -- the fixed-shape computation ------------------------------------------------------------------

    def run(self, rows: int) -> torch.Tensor:
        """One step over the bucket's ``rows`` from its static inputs: logits ``[rows, vocab]``. Only tensor
        operations of fixed shapes, no host reads (capturable)."""
        b = self.batch
        inputs = self.inputs[rows]
        ids, col, fed, visible = inputs[0], inputs[1], inputs[2].bool(), inputs[3]
        kv_heads, group, d = b.kv_heads, b.group, b.head_dim
        turn_k = b._turns[col + b.prefix_len][:, None]
        turns = (turn_k * d**-0.5, turn_k)
        hidden = torch.arange(b.capacity, device=b.device)[None] >= visible[:, None]
        hidden = hidden[:, None, None]  # [rows, 1, 1, capacity]
        index = torch.arange(rows, device=b.device)
        keep = fed[:, None, None]

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys, values = b.keys[i][:rows], b.values[i][:rows]
            keys[index, :, col] = torch.where(keep, k, keys[index, :, col])
            values[index, :, col] = torch.where(keep, v, values[index, :, col])
            out = b._attention(i, q.view(rows, kv_heads, group, d), keys, values, hidden)
            return out.reshape(rows, b.heads * d)

        with torch.autocast(b.device.type, enabled=False):
            h = torch.nn.functional.embedding(ids, b.w.embedding).float()
            h = b._layers(h, turns, attend)
            return b.w.head(b._norm(h, b.w.final_norm))

    # -- CUDA graphs -----------------------------------------------------------------------------------

    def _check_layout(self) -> None:
        """Make the rotary table cover every position a slot can reach; drop the captured graphs when a
        buffer or the table was reallocated (a graph replays the addresses it was captured with)."""
        b = self.batch
        b._turn_table(b.prefix_len + b.capacity)
        layout = (b.keys[0].data_ptr(), b.capacity, b._turns.data_ptr())
        if layout != self.layout:
            self.layout = layout
            self.captured.clear()
            self.outputs.clear()

    def _replay(self, rows: int) -> torch.Tensor:
        """Replay the bucket's graph (captured on first use); its output tensor holds the logits."""
        graph = self.captured.get(rows)
        if graph is None:
            graph = self._capture(rows)
        graph.replay()
        return self.outputs[rows].clone()  # the next replay overwrites the graph's output

    def _capture(self, rows: int) -> Any:
        """Warm up on a side stream, then capture one run of the bucket's step (the runs rewrite the same
        values, so warming up with the step's own inputs changes nothing)."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self.run(rows)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the engine's search threads may call CUDA while this thread captures
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            self.outputs[rows] = self.run(rows)
        self.captured[rows] = graph
        self.captures += 1
        return graph
