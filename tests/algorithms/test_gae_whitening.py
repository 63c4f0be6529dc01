"""GAE advantages whitened over the batch (veRL core_algos, Search-R1's PPO), against numbers
computed by hand in the comments; the switch algorithm.gae_whiten=false gives the raw recursion."""

from __future__ import annotations

import math

import torch

from searchr1.algorithms.advantages import compute_advantages, gae
from searchr1.algorithms.config import AlgorithmConfig

# Two rows, gamma = 1, lam = 0.5.
# Row 0: mask [1, 1, 1], r = [0, 0, 1], V = [.5, .5, .5]
#   t=2: delta = 1 - .5 = .5,          A = .5
#   t=1: delta = 0 + .5 - .5 = 0,      A = 0 + .5 * .5 = .25
#   t=0: delta = 0,                    A = .5 * .25 = .125          returns = A + V = [.625, .75, 1]
# Row 1: mask [1, 0, 1] (token 1 is an observation: reward 7 and value 9 are not a step), r = [0, 7, 1],
#   V = [.2, 9, .5]
#   t=2: delta = 1 - .5 = .5,          A = .5
#   t=0: next value V_2 = .5: delta = .5 - .2 = .3, A = .3 + .5 * .5 = .55    returns = [.75, 0, 1]
# Whitening over the 5 generated tokens A = [.125, .25, .5, .55, .5]:
#   mean = 1.925 / 5 = .385
#   squared deviations: .0676 + .018225 + .013225 + .027225 + .013225 = .1395
#   unbiased variance = .1395 / 4 = .034875
#   A' = (A - .385) / sqrt(.034875 + 1e-8)
MASK = torch.tensor([[1, 1, 1], [1, 0, 1]])
REWARDS = torch.tensor([[0.0, 0.0, 1.0], [0.0, 7.0, 1.0]], dtype=torch.float64)
VALUES = torch.tensor([[0.5, 0.5, 0.5], [0.2, 9.0, 0.5]], dtype=torch.float64)
RAW = [[0.125, 0.25, 0.5], [0.55, 0.0, 0.5]]
RETURNS = [[0.625, 0.75, 1.0], [0.75, 0.0, 1.0]]


def hand_whitened() -> list[list[float]]:
    std = math.sqrt(0.034875 + 1e-8)
    return [[(a - 0.385) / std if m else 0.0 for a, m in zip(row, mrow, strict=True)]
            for row, mrow in zip(RAW, MASK.tolist(), strict=True)]  # fmt: skip


def test_gae_is_whitened_over_the_batch_by_default():
    cfg = AlgorithmConfig(gamma=1.0, lam=0.5)
    assert cfg.gae_whiten
    adv, ret = gae(REWARDS, MASK, config=cfg, values=VALUES)
    torch.testing.assert_close(adv, torch.tensor(hand_whitened(), dtype=torch.float64))
    torch.testing.assert_close(ret, torch.tensor(RETURNS, dtype=torch.float64))  # from the raw advantages
    generated = adv[MASK.bool()]
    assert abs(float(generated.mean())) < 1e-12 and abs(float(generated.std()) - 1.0) < 1e-6


def test_switch_off_gives_the_raw_recursion():
    cfg = AlgorithmConfig(advantage="gae", gamma=1.0, lam=0.5, gae_whiten=False)
    adv, ret = compute_advantages(REWARDS, MASK, cfg, values=VALUES)
    torch.testing.assert_close(adv, torch.tensor(RAW, dtype=torch.float64))
    torch.testing.assert_close(ret, torch.tensor(RETURNS, dtype=torch.float64))


def test_the_switch_is_a_config_key():
    from searchr1.config import load_config

    assert load_config(None, ["algorithm.advantage=gae"]).algorithm.gae_whiten is True
    assert load_config(None, ["algorithm.gae_whiten=false"]).algorithm.gae_whiten is False
