"""``MetricSums`` keeps tensor values on their device until ``reduce`` (one read instead of one host sync per
metric and micro-batch): the reduced metrics equal those of reading every value at once, in the same order."""

from __future__ import annotations

from collections import defaultdict

import torch

from searchr1.trainer.distributed import DistInfo
from searchr1.trainer.update import MetricSums


def test_values_read_at_the_end_give_the_metrics_of_values_read_at_once():
    g = torch.Generator().manual_seed(0)
    sums = MetricSums()
    want: dict[str, float] = defaultdict(float)
    weights: dict[str, float] = defaultdict(float)
    for _ in range(3):  # optimizer steps
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            value = torch.randn((), generator=g).to(dtype)
            weight = float(torch.randint(1, 9, (1,), generator=g))
            sums.add("weighted", value, weight)
            want["weighted"] += float(value) * weight
            weights["weighted"] += weight
            share = (value * 3).requires_grad_()  # a loss-like tensor: detached, not read until the end
            sums.add_share("share", share)
            want["share"] += float(share.detach())
        sums.add("plain", 0.1, 3.0)
        want["plain"] += 0.1 * 3.0
        weights["plain"] += 3.0
        sums.steps += 1
    out = sums.reduce(DistInfo(), torch.device("cpu"))
    assert out["weighted"] == want["weighted"] / weights["weighted"]
    assert out["plain"] == want["plain"] / weights["plain"]
    assert out["share"] == want["share"] / 3


def test_a_value_changed_in_place_after_it_was_added_counts_as_added():
    sums = MetricSums()
    value = torch.tensor(1.5)
    sums.add("x", value, 2.0)
    value.add_(10.0)  # e.g. a buffer reused by later work
    assert sums.reduce(DistInfo(), torch.device("cpu")) == {"x": 1.5}
