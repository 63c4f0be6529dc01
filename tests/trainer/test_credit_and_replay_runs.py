"""The step reward and the replay inside the trainer, on the tiny model: the step advantage lands on the
search turns' tokens of real rollouts (and nowhere else), and a run with replay on resumes exactly
after a SIGKILL (the buffer is checkpointed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import rlworld
import torch

from searchr1.algorithms.advantages import compute_advantages
from searchr1.retrieval.base import Hit, Retriever
from searchr1.rewards.steps import step_credit
from searchr1.rollout.types import Role
from searchr1.trainer import checkpoint
from searchr1.trainer.loop import RLTrainer


def _world_with_gold(folder: Path, questions: int | None = None) -> dict[str, Path]:
    """rlworld's world; each question names three of the six corpus titles as its gold passages."""
    world = rlworld.write_world(folder)
    rows = [json.loads(line) for line in world["train"].read_text().splitlines()][:questions]
    titles = [title for title, _ in rlworld.CORPUS]
    for i, row in enumerate(rows):
        row["metadata"]["supporting_titles"] = [titles[(i + j) % len(titles)] for j in range(3)]
    world["train"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return world


class ByQueryText(Retriever):
    """One corpus passage per query, chosen by the query's text (the sampled queries are gibberish, so
    BM25 would find nothing): some searches find gold, others do not."""

    def search(self, queries, topk):
        out = []
        for q in queries:
            i = sum(q.encode()) % len(rlworld.CORPUS)
            title, text = rlworld.CORPUS[i]
            out.append([Hit(str(i), title, text, 1.0)])
        return out


def _searching_trainer(world: dict[str, Path], model_dir: Path, out: Path, **extra) -> RLTrainer:
    """Every trajectory searches once (the ForceSearch steer), step rewards on (gain 1)."""
    from searchr1.models import load_model, load_tokenizer
    from searchr1.rollout.registry import build_engine

    cfg = rlworld.load(world, model_dir, out, trainer__total_steps=1, rollout__max_response_tokens=200,
                       reward__step_gain=1.0, reward__step_gold="supporting",
                       reward__components={"rlworld:token_set_reward": 1.0}, **extra)  # fmt: skip
    tokenizer, model, retriever = load_tokenizer(cfg.model.path), load_model(cfg.model.path), ByQueryText()
    engine = build_engine(cfg, model, tokenizer, retriever, steer=rlworld.ForceSearch(tokenizer))
    trainer = RLTrainer(cfg, model=model, tokenizer=tokenizer, retriever=retriever, engine=engine)
    trainer.setup()
    return trainer


def test_step_advantage_lands_on_the_search_turns_tokens(tmp_path, tiny_model_dir):
    world = _world_with_gold(tmp_path / "world")
    coef = 0.5
    trainer = _searching_trainer(world, tiny_model_dir, tmp_path / "run", rollout__n=4,
                                 algorithm__step_credit_coef=coef, trainer__on_policy_logprobs=False)  # fmt: skip
    cfg = trainer.cfg
    trajs, groups, _ = trainer.rollout(trainer.sampler.next_batch(), 0)
    exp, metrics = trainer.make_experience(trajs, groups)
    outcome, _ = compute_advantages(exp.scores, exp.train_mask, cfg.algorithm, group_ids=exp.group_ids)
    credits = [step_credit(t, cfg.reward, trainer._decode) for t in trajs]
    assert all(len(c.turns) == 1 and c.gold == "titles" for c in credits)
    # the step advantage by hand: each group's step rewards, centred and divided by their unbiased std
    by_group: dict[int, list[float]] = {}
    for gid, credit in zip(groups, credits, strict=True):
        by_group.setdefault(gid, []).append(credit.turns[0].reward)
    varied = 0
    for row, (traj, credit) in enumerate(zip(trajs, credits, strict=True)):
        values = torch.tensor(by_group[groups[row]], dtype=torch.float64)
        step_adv = float((credit.turns[0].reward - values.mean()) / (values.std() + cfg.algorithm.adv_eps))
        varied += abs(step_adv) > 0
        p = len(traj.prompt_ids)
        a, b = traj.search_spans[0]
        turn = torch.zeros(exp.input_ids.shape[1], dtype=torch.bool)
        turn[p + a : p + b] = True
        assert torch.equal(exp.extras["step_turns"][row] > 0, turn)
        text = trainer.tokenizer.decode(traj.response_ids[a:b])
        assert text.startswith("<search>") and text.endswith("</search>")
        assert all(r == Role.GENERATED for r in traj.roles[a:b])
        got = exp.advantages[row]
        assert torch.allclose(got[turn], outcome[row][turn] + coef * step_adv, atol=1e-5)
        others = exp.train_mask[row] & ~turn
        assert others.any() and torch.equal(got[others], outcome[row][others])
    assert varied, "no group's step rewards differed: the test proves nothing"
    found = sum(c.turns[0].new_gold > 0 for c in credits) / len(credits)
    assert metrics["step/new_gold_share"] == pytest.approx(found)
    assert metrics["step/scored_share"] == 1.0 and metrics["step/redundant_share"] == 0.0
    mean = sum(c.turns[0].reward for c in credits) / len(credits)
    assert metrics["step/reward_mean"] == pytest.approx(mean)
    trainer.close()


def test_gae_returns_carry_the_step_reward_up_to_the_end_of_its_turn(tmp_path, tiny_model_dir):
    """PPO: with gamma = lambda = 1 the critic's target R_t is the sum of the rewards from t on: the
    outcome plus c * s on the tokens up to the search turn's last one, the outcome alone after it."""
    world = _world_with_gold(tmp_path / "world")
    coef = 2.0
    trainer = _searching_trainer(world, tiny_model_dir, tmp_path / "run", rollout__n=1, trainer__batch_size=8,
                                 trainer__mini_batch_size=8, algorithm__advantage="gae",
                                 algorithm__use_kl_loss=False, algorithm__step_credit_coef=coef)  # fmt: skip
    trajs, groups, _ = trainer.rollout(trainer.sampler.next_batch(), 0)
    exp, _ = trainer.make_experience(trajs, groups)
    credits = [step_credit(t, trainer.cfg.reward, trainer._decode) for t in trajs]
    assert any(c.turns[0].reward for c in credits) and not all(c.turns[0].reward for c in credits)
    for row, (traj, credit) in enumerate(zip(trajs, credits, strict=True)):
        p = len(traj.prompt_ids)
        _, end = traj.search_spans[0]
        mask = exp.train_mask[row]
        positions = torch.nonzero(mask).flatten()
        score, s = float(exp.scores[row]), credit.turns[0].reward
        for t in positions.tolist():
            want = score + coef * s if t < p + end else score
            assert float(exp.returns[row, t]) == pytest.approx(want, abs=1e-5), (row, t)
    trainer.close()


# ---------------------------------------------------------------------------------------------
# replay: kill and resume
# ---------------------------------------------------------------------------------------------

TOTAL_STEPS = 8


def _command(world: dict[str, Path], model_dir: Path, out_dir: Path) -> list[str]:
    extra = rlworld.overrides(
        world, model_dir, out_dir,
        trainer__total_steps=TOTAL_STEPS, trainer__save_every=1, trainer__keep_last=2,
        reward__components={"rlworld:token_set_reward": 1.0}, algorithm__advantage="grpo", rollout__n=3,
        replay__enabled=True, replay__min_reward=0.4, replay__max_share=0.5,
    )  # fmt: skip
    return [sys.executable, "-m", "searchr1", "train", *extra]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent)
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def _comparable(rows: list[dict]) -> dict[int, dict]:
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith("timing/") and k != "time"} for r in rows}


def test_replay_run_resumes_exactly_after_a_kill(tmp_path, tiny_model_dir):
    """Four questions, groups of three: each question comes back every other step, so successes
    stored before the kill are replayed after the resume; without the buffer in the checkpoint the
    resumed run would replay nothing there and its metrics would differ."""
    world = _world_with_gold(tmp_path / "world", questions=4)
    reference_dir, killed_dir = tmp_path / "uninterrupted", tmp_path / "killed"
    subprocess.run(_command(world, tiny_model_dir, reference_dir), env=_env(), check=True, timeout=600,
                   capture_output=True)  # fmt: skip
    expected = _comparable(rlworld.read_metrics(reference_dir))

    kill_at = 3
    proc = subprocess.Popen(_command(world, tiny_model_dir, killed_dir), env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            metrics = killed_dir / "metrics.jsonl"
            if metrics.is_file() and any(r["step"] >= kill_at for r in rlworld.read_metrics(killed_dir)):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    saved = [step for step, _ in checkpoint.list_checkpoints(killed_dir)]
    assert saved and max(saved) < TOTAL_STEPS - 1
    state = checkpoint.load_trainer_state(checkpoint.list_checkpoints(killed_dir)[-1][1])
    assert state["replay"]["questions"], "the checkpoint holds no stored success"
    after = range(max(saved) + 1, TOTAL_STEPS + 1)
    assert any(expected[s]["replay/share"] > 0 for s in after), "nothing replayed after the resume point"

    done = subprocess.run(_command(world, tiny_model_dir, killed_dir), env=_env(), timeout=600,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from {checkpoint.checkpoint_dir(killed_dir)}" in done.stderr
    got = _comparable(rlworld.read_metrics(killed_dir))
    assert sorted(got) == list(range(1, TOTAL_STEPS + 1))
    for step in after:
        assert got[step] == expected[step], f"step {step} differs after resume"
    replayed = [s for s in after if got[s]["replay/share"] > 0]
    ratios = [got[s]["replay/ratio_mean"] for s in replayed]
    # pi_theta / mu of trajectories sampled before the kill by an earlier policy: near 1 but not 1 (the policy
    # moved since); a lost behaviour log-prob (0 in the checkpoint) would give pi_theta itself, far below 0.5
    assert all(0.5 < r < 2.0 for r in ratios) and any(abs(r - 1.0) > 1e-4 for r in ratios), ratios
