"""Faults: a non-finite loss skips the step (counted) and the run goes on; too many in a row stop the
run with a message and a checkpoint; a search backend outage becomes observations, not a crash."""

from __future__ import annotations

import socket

import pytest
import rlworld
import torch

from searchr1.rollout.types import Role
from searchr1.trainer.loop import RLTrainer, TrainingStopped


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return rlworld.write_world(tmp_path_factory.mktemp("world"))


def test_nonfinite_step_is_skipped_and_counted(world, tiny_model_dir, tmp_path):
    cfg = rlworld.load(world, tiny_model_dir, tmp_path / "run", trainer__total_steps=2,
                       reward__components={"rlworld:nan_reward": 1.0})  # fmt: skip
    trainer = RLTrainer(cfg)
    trainer.setup()
    initial = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    rlworld.NAN_CALLS["left"] = 4  # the 4 trajectories of step 1
    first = trainer.train_step()
    assert first["train/nonfinite_skipped"] == 1.0
    assert all(torch.equal(v, initial[k]) for k, v in trainer.policy.state_dict().items())  # no update
    second = trainer.train_step()
    assert second["train/nonfinite_skipped"] == 1.0 and trainer.nonfinite_in_a_row == 0
    assert any(not torch.equal(v, initial[k]) for k, v in trainer.policy.state_dict().items())


def test_too_many_nonfinite_steps_stop_with_a_checkpoint(world, tiny_model_dir, tmp_path):
    cfg = rlworld.load(world, tiny_model_dir, tmp_path / "run", trainer__total_steps=5,
                       trainer__max_nonfinite_in_a_row=2, reward__components={"rlworld:nan_reward": 1.0})  # fmt: skip
    rlworld.NAN_CALLS["left"] = 10**6
    try:
        with pytest.raises(TrainingStopped, match="2 steps in a row had a non-finite"):
            RLTrainer(cfg).train()
    finally:
        rlworld.NAN_CALLS["left"] = 0
    assert (tmp_path / "run/checkpoints/step_000002/COMPLETE").is_file()


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: nothing listens there


def _steered_trainer(cfg):
    from searchr1.models import load_model, load_tokenizer
    from searchr1.retrieval.factory import build_retriever
    from searchr1.rollout.registry import build_engine

    tokenizer = load_tokenizer(cfg.model.path)
    model = load_model(cfg.model.path)
    retriever = build_retriever(cfg.retrieval)
    engine = build_engine(cfg, model, tokenizer, retriever, steer=rlworld.ForceSearch(tokenizer))
    return RLTrainer(cfg, model=model, tokenizer=tokenizer, retriever=retriever, engine=engine)


def test_search_outage_becomes_observations(world, tiny_model_dir, tmp_path):
    cfg = rlworld.load(world, tiny_model_dir, tmp_path / "run", retrieval__backend="http",
                       retrieval__url=f"http://127.0.0.1:{_dead_port()}", retrieval__retries=0,
                       retrieval__timeout_s=2.0, rollout__search_retries=0, rollout__max_obs_tokens=64,
                       rollout__max_response_tokens=200)  # fmt: skip
    trainer = _steered_trainer(cfg)
    trainer.train()
    rows = rlworld.read_metrics(tmp_path / "run")
    assert len(rows) == 2
    assert all(r["rollout/searches"] == 1.0 and r["rollout/search_failures"] == 1.0 for r in rows)
    assert rows[-1]["rollout/search_failures_total"] == 4.0
    traj = trainer._last_trajs[0]
    observed = trainer.tokenizer.decode([t for t, r in zip(traj.response_ids, traj.roles, strict=True)
                                         if r == Role.OBSERVATION])  # fmt: skip
    assert "<information>" in observed and "fail" in observed.lower()


@pytest.mark.parametrize("mask_observations", [True, False])
def test_only_generated_tokens_are_trained_unless_ablated(world, tiny_model_dir, tmp_path, mask_observations):
    cfg = rlworld.load(world, tiny_model_dir, tmp_path / "run", trainer__mask_observations=mask_observations,
                       trainer__total_steps=1, rollout__max_response_tokens=200,
                       trainer__on_policy_logprobs=False)  # a pass of their own  # fmt: skip
    trainer = _steered_trainer(cfg)
    trainer.setup()
    indices = trainer.sampler.next_batch()
    trajs, groups, _ = trainer.rollout(indices, 0)
    exp, metrics = trainer.make_experience(trajs, groups)
    assert metrics["rollout/searches"] == 1.0
    for row, traj in enumerate(trajs):
        p = len(traj.prompt_ids)
        roles = torch.tensor(traj.roles)
        trained = exp.train_mask[row, p : p + len(roles)]
        assert not exp.train_mask[row, :p].any()
        assert torch.equal(exp.gen_mask[row, p : p + len(roles)], roles == Role.GENERATED)
        expected = roles == Role.GENERATED if mask_observations else roles != Role.PROMPT
        assert torch.equal(trained, expected)
        assert (roles == Role.OBSERVATION).any()
        # old log-probs exist exactly where the loss is computed
        assert torch.equal(exp.old_logprobs[row] != 0, exp.train_mask[row] & (exp.old_logprobs[row] != 0))
