"""What the guarding options change, not only what they log: ``trainer.keep_best`` ships the best validated
policy (``train --export --best``), not the last one; ``algorithm.llds_coef`` changes the update."""

from __future__ import annotations

from pathlib import Path

import pytest
import rlworld
import torch
from safetensors.torch import load_file

from searchr1.cli import main
from searchr1.trainer.loop import RLTrainer


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return rlworld.write_world(tmp_path_factory.mktemp("world"))


def weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face model folder's safetensors files."""
    files = sorted(folder.glob("*.safetensors"))
    assert files, f"no safetensors in {folder}"
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(f))
    return out


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_keep_best_exports_the_best_validated_policy_not_the_last(world, tiny_model_dir, tmp_path, capsys):
    """Three steps, validated after each. The tiny random model's real validation EM is 0 at every step,
    so the EM is scripted (0.25, 0.75, 0.5: the best is step 2 of 3); the validation itself runs. The
    policy changes at every step, so step 2's weights are not step 3's."""
    run = tmp_path / "run"
    cfg = rlworld.load(
        world, tiny_model_dir, run, reward__components={"rlworld:token_set_reward": 1.0},
        trainer__total_steps=3, trainer__val_every=1, trainer__keep_best="val_em",
    )  # fmt: skip
    trainer = RLTrainer(cfg)
    trainer.setup()
    scripted = iter([0.25, 0.75, 0.5])
    at_step: dict[int, dict[str, torch.Tensor]] = {}
    real_validate = trainer.validate

    def validate() -> dict[str, float]:
        metrics = real_validate()
        assert "val/em" in metrics
        at_step[trainer.step] = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
        return {**metrics, "val/em": next(scripted)}

    trainer.validate = validate
    summary = trainer.train()
    rows = rlworld.read_metrics(run)
    assert [r["val/em"] for r in rows] == [0.25, 0.75, 0.5]
    assert [r.get("val/best_em") for r in rows] == [0.25, 0.75, None]
    assert summary["best"] == {"step": 2, "em": 0.75}
    assert all(r["actor/updated"] == 1.0 for r in rows)
    assert not same(at_step[2], at_step[3])  # the last step moved the policy

    best = weights(run / "checkpoints" / "best" / "model")
    last = weights(run / "checkpoints" / "step_000003" / "model")
    assert same(best, {k: at_step[2][k] for k in best}) and same(last, {k: at_step[3][k] for k in last})

    assert main(["train", "--export", str(run), str(tmp_path / "export-best"), "--best"]) == 0
    assert "best validation EM 0.750 at step 2" in capsys.readouterr().out
    exported = weights(tmp_path / "export-best")
    assert same(exported, best) and not same(exported, last)
    assert main(["train", "--export", str(run), str(tmp_path / "export-last")]) == 0
    assert "newest checkpoint step_000003" in capsys.readouterr().out
    assert same(weights(tmp_path / "export-last"), last)

    # in the same process, restore_best puts step 2's policy back (what the demo evaluates as "after")
    assert same({k: v.detach() for k, v in trainer.policy.state_dict().items()}, at_step[3])
    assert trainer.restore_best() == {"step": 2, "em": 0.75}
    assert same({k: v.detach() for k, v in trainer.policy.state_dict().items()}, at_step[2])


def test_with_validation_before_training_a_run_that_only_got_worse_restores_its_start(world, tiny_model_dir, tmp_path):
    """Validation EM 0.5 before training, lower after each step: the best is the starting policy."""
    cfg = rlworld.load(
        world, tiny_model_dir, tmp_path / "run", reward__components={"rlworld:token_set_reward": 1.0},
        trainer__total_steps=2, trainer__val_every=1, trainer__keep_best="val_em", trainer__val_before_train=True,
    )  # fmt: skip
    trainer = RLTrainer(cfg)
    trainer.setup()
    start = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
    scripted = iter([0.5, 0.25, 0.0])
    real_validate = trainer.validate
    trainer.validate = lambda: {**real_validate(), "val/em": next(scripted)}
    trainer.train()
    assert not same({k: v.detach() for k, v in trainer.policy.state_dict().items()}, start)  # it moved
    assert trainer.restore_best() == {"step": 0, "em": 0.5}
    assert same({k: v.detach() for k, v in trainer.policy.state_dict().items()}, start)


def test_export_best_of_a_run_without_a_kept_best_is_one_line(world, tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    RLTrainer(rlworld.load(world, tiny_model_dir, run, trainer__total_steps=1)).train()
    capsys.readouterr()
    assert main(["train", "--export", str(run), str(tmp_path / "out"), "--best"]) == 2
    err = capsys.readouterr().err
    assert "trainer.keep_best=val_em" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def first_update(world, model_dir, out, llds_coef: float) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """One step with two PPO epochs (so that the second epoch sees a moved policy): metrics, new weights."""
    cfg = rlworld.load(
        world, model_dir, out, reward__components={"rlworld:token_set_reward": 1.0}, trainer__total_steps=1,
        trainer__ppo_epochs=2, algorithm__llds_coef=llds_coef, algorithm__llds_positive_only=False,
        trainer__adaptive_threads=False,  # a thread count that follows the machine's load changes the rounding
    )  # fmt: skip
    trainer = RLTrainer(cfg)
    trainer.setup()
    metrics = trainer.train_step()
    return metrics, {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}


def test_llds_changes_the_update(world, tiny_model_dir, tmp_path):
    """The same step with ``llds_coef`` 0 and 1: the same rollouts, the same first epoch; the LLDS term of
    the second epoch changes the loss and the new weights. The control: the step without LLDS, run twice,
    gives the same weights exactly (so a difference is LLDS's)."""
    m0, w0 = first_update(world, tiny_model_dir, tmp_path / "a", 0.0)
    _, w0_again = first_update(world, tiny_model_dir, tmp_path / "b", 0.0)
    m1, w1 = first_update(world, tiny_model_dir, tmp_path / "c", 1.0)
    assert same(w0, w0_again)
    assert m1["rollout/searches"] == m0["rollout/searches"] and m1["reward/mean"] == m0["reward/mean"]
    assert "actor/llds_loss" not in m0 and m1["actor/llds_loss"] > 0.0
    assert m1["actor/loss"] != pytest.approx(m0["actor/loss"], abs=1e-9)
    moved = max(float((w1[k] - w0[k]).abs().max()) for k in w0)
    assert moved > 1e-6
