"""Learning tests: on a task where reward is easy to obtain, the mean reward rises clearly within a
few dozen steps (GRPO and PPO), across seeds.

The behaviour rewarded (``rlworld.token_set_reward``): the share of the model's own tokens taken
from a fixed quarter of the vocabulary. A random tiny policy gets about 0.25.
"""

from __future__ import annotations

import statistics

import pytest
import rlworld

from searchr1.trainer.loop import RLTrainer

pytestmark = [pytest.mark.learning, pytest.mark.slow]  # statistical: a claim about RL on given seeds (not CI)

FAMILIES = {
    "grpo": {"algorithm__advantage": "grpo", "rollout__n": 4, "trainer__batch_size": 4,
             "trainer__mini_batch_size": 2, "trainer__actor_lr": 1e-2, "trainer__total_steps": 12},
    "ppo": {"algorithm__advantage": "gae", "rollout__n": 1, "trainer__batch_size": 16,
            "trainer__mini_batch_size": 8, "trainer__actor_lr": 1e-2, "trainer__critic_lr": 1e-2,
            "algorithm__use_kl_loss": False, "algorithm__use_kl_in_reward": True, "algorithm__lam": 1.0,
            "trainer__total_steps": 20},
}  # fmt: skip


def _curve(family, seed, world, model_dir, out_dir) -> list[float]:
    cfg = rlworld.load(
        world,
        model_dir,
        out_dir,
        seed=seed,
        reward__components={"rlworld:token_set_reward": 1.0},
        rollout__max_turns=0,
        rollout__max_turn_tokens=8,
        trainer__micro_batch_size=16,
        **FAMILIES[family],
    )
    RLTrainer(cfg).train()
    return [r["reward/mean"] for r in rlworld.read_metrics(out_dir)]


def _assert_learned(curve: list[float]) -> None:
    first, last = statistics.mean(curve[:3]), statistics.mean(curve[-3:])
    assert last > first + 0.15, f"reward did not rise: first steps {first:.3f}, last steps {last:.3f}"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return rlworld.write_world(tmp_path_factory.mktemp("world"))


@pytest.mark.parametrize("family", ["grpo", "ppo"])
def test_reward_rises(family, world, tiny_model_dir, tmp_path):
    _assert_learned(_curve(family, 0, world, tiny_model_dir, tmp_path / "run"))


@pytest.mark.parametrize("family", ["grpo", "ppo"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reward_rises_across_seeds(family, seed, world, tiny_model_dir, tmp_path):
    _assert_learned(_curve(family, seed, world, tiny_model_dir, tmp_path / "run"))
