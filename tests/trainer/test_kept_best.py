"""The policy a run ships as its best (``trainer.keep_best``: ``checkpoints/best``) is the one in memory after
``restore_best``, a resumed run's too (its best read back from that folder), and ``searchr1 train`` names it
in its final output."""

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


def trainable(trainer: RLTrainer) -> dict[str, torch.Tensor]:
    """A copy of the policy's trainable tensors (the LoRA adapter's with LoRA), by parameter name."""
    return {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def scripted_validation(
    trainer: RLTrainer, ems: list[float], seen: dict[int, dict[str, torch.Tensor]]
) -> None:
    """The trainer's validation runs, its EM is scripted (the tiny random model's is always 0); ``seen``
    gets the trainable tensors at each validated step."""
    scripted = iter(ems)
    real_validate = trainer.validate

    def validate() -> dict[str, float]:
        metrics = real_validate()
        seen[trainer.step] = trainable(trainer)
        return {**metrics, "val/em": next(scripted)}

    trainer.validate = validate


@pytest.mark.parametrize("lora_r", [0, 4], ids=["full", "lora"])
def test_restore_best_after_a_resume_puts_the_best_steps_weights_back(
    world, tiny_model_dir, tmp_path, lora_r, one_thread
):
    """Three steps validated at 0.25, 0.75, 0.5 (the best: step 2), a checkpoint at step 3; the resumed run
    trains a fourth step (validated lower) and its ``restore_best`` puts step 2's weights back, read from
    ``checkpoints/best``: the tensors of the kept folder and of the policy in memory are step 2's."""
    run = tmp_path / "run"
    kw = dict(
        reward__components={"rlworld:token_set_reward": 1.0}, trainer__val_every=1, trainer__keep_best="val_em",
        model__lora_r=lora_r, model__lora_alpha=8, trainer__adaptive_threads=False,
    )  # fmt: skip
    first = RLTrainer(rlworld.load(world, tiny_model_dir, run, trainer__total_steps=3, **kw))
    first.setup()
    seen: dict[int, dict[str, torch.Tensor]] = {}
    scripted_validation(first, [0.25, 0.75, 0.5], seen)
    assert first.train()["best"] == {"step": 2, "em": 0.75}
    assert not same(seen[2], seen[3])  # the last step moved the policy
    del first

    resumed = RLTrainer(rlworld.load(world, tiny_model_dir, run, trainer__total_steps=4, **kw))
    resumed.setup()
    assert resumed.step == 3 and same(trainable(resumed), seen[3])  # resumed from step 3's checkpoint
    scripted_validation(resumed, [0.5], seen)
    resumed.train()
    assert not same(seen[4], seen[2]) and not same(trainable(resumed), seen[2])
    assert resumed.restore_best() == {"step": 2, "em": 0.75}
    assert same(trainable(resumed), seen[2])
    if (
        not lora_r
    ):  # the kept folder holds step 2's weights (LoRA's merged: compared through the policy above)
        kept = load_file(next((run / "checkpoints" / "best" / "model").glob("*.safetensors")))
        assert same({k: kept[k] for k in seen[2]}, seen[2])


def test_restore_best_without_a_kept_best_leaves_the_policy(world, tiny_model_dir, tmp_path, one_thread):
    """No validation yet (``val_every`` beyond the run), no best: ``restore_best`` returns None and the policy
    stays the last step's, even when the folder holds a ``checkpoints/best`` of an earlier run (a fresh run
    never reads it)."""
    run = tmp_path / "run"
    kw = dict(reward__components={"rlworld:token_set_reward": 1.0}, trainer__adaptive_threads=False)
    earlier = RLTrainer(rlworld.load(world, tiny_model_dir, run, trainer__total_steps=1, trainer__val_every=1,
                                     trainer__keep_best="val_em", **kw))  # fmt: skip
    earlier.train()
    assert (run / "checkpoints" / "best" / "COMPLETE").is_file()
    fresh = RLTrainer(rlworld.load(world, tiny_model_dir, run, trainer__total_steps=1, trainer__resume="never",
                                   trainer__val_every=5, trainer__keep_best="val_em", **kw))  # fmt: skip
    fresh.train()
    last = trainable(fresh)
    assert fresh.restore_best() is None and same(trainable(fresh), last)


def test_train_names_the_kept_checkpoint(world, tiny_model_dir, tmp_path, capsys, one_thread):
    """With ``trainer.keep_best`` the final output names the shipped best: its step, validation score and
    folder (the first validation is kept: the tiny model's EM is 0 at every step); without it, no such line."""
    run = tmp_path / "run"
    args = rlworld.overrides(world, tiny_model_dir, run, trainer__total_steps=2, trainer__val_every=1,
                             trainer__keep_best="val_em")  # fmt: skip
    assert main(["train", *args]) == 0
    out = capsys.readouterr().out.splitlines()
    kept = [line for line in out if line.startswith("kept best:")]
    folder = run / "checkpoints" / "best" / "model"
    assert kept == [
        f"kept best: step 1, validation EM 0.000: {folder}  (searchr1 train --export {run} OUT --best copies it)"
    ]
    assert (folder / "config.json").is_file()

    other = tmp_path / "other"
    assert main(["train", *rlworld.overrides(world, tiny_model_dir, other, trainer__total_steps=1)]) == 0
    printed = capsys.readouterr().out
    assert "run folder:" in printed and "kept best" not in printed
    assert not Path(other / "checkpoints" / "best").exists()
