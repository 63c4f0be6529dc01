"""Decision groups (searchr1.trainer.decision, ``guidance.decision_groups``): whole groups continued by the
policy from the gold prefix that ends after the first passage, chosen single-hop / multi-hop alternately,
generated in the step's rollout instead of those groups' fresh rollouts, left alone by replay and guidance;
their advantages against a hand computation (answer now vs search again on a single-hop question, with
``reward.step_superfluous``); the config's refusals; and decision_groups=0 leaving the step as it was."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import rlworld
import torch

from searchr1.config import ConfigError, load_config
from searchr1.data.formats import sample_meta
from searchr1.rewards.steps import step_credit
from searchr1.rollout.actions import parse_action
from searchr1.rollout.gold import GoldPath, GoldWriter, answer_turn_text, gold_path, prefix_meta
from searchr1.rollout.types import Role, Trajectory
from searchr1.trainer.decision import DecisionGroups, DecisionJob, DecisionPlan, is_decision
from searchr1.trainer.loop import RLTrainer
from searchr1.trainer.mixing import mix_batch, shares
from searchr1.trainer.replay import ReplayBuffer

SINGLE = {"id": "s1", "question": "where was Alice Verdan born", "golden_answers": ["Borvik"],
          "metadata": {"data_source": "synth", "supporting_titles": ["Alice Verdan"]}}  # fmt: skip
SINGLE2 = {"id": "s2", "question": "what is the capital of Tarnland", "golden_answers": ["Borvik"],
           "metadata": {"data_source": "synth", "supporting_titles": ["Tarnland"]}}  # fmt: skip
BRIDGE2 = {"id": "b2", "question": "when was the founder of the Quillon Press born", "golden_answers": ["1901"],
           "metadata": {"type": "bridge", "data_source": "synth",
                        "supporting_titles": ["Quillon Press", "Alice Verdan"]}}  # fmt: skip
PLAIN = {"id": "p1", "question": "which river flows through Borvik", "golden_answers": ["Ost"],
         "metadata": {"data_source": "tiny"}}  # fmt: skip
PLAIN2 = {**PLAIN, "id": "p2", "question": "what is the Ost", "golden_answers": ["river"]}
ROWS = [rlworld.BRIDGE, SINGLE, PLAIN, BRIDGE2, SINGLE2, PLAIN2]
"""The training questions in batch order: groups 0 and 3 two-hop, 1 and 4 single-hop, 2 and 5 without a path."""

RUN = {
    "rollout__n": 3, "rollout__max_turns": 2, "rollout__max_obs_tokens": 60, "rollout__max_response_tokens": 160,
    "trainer__batch_size": 6, "trainer__mini_batch_size": 6, "trainer__total_steps": 2, "trainer__shuffle": False,
}  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    files = rlworld.write_world(tmp_path_factory.mktemp("world"))
    files["train"].write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return files


def _trainer(world, model_dir, out: Path, **extra: Any) -> RLTrainer:
    trainer = RLTrainer(rlworld.load(world, model_dir, out, **{**RUN, **extra}))
    trainer.setup()
    return trainer


def _spy_generate(trainer: RLTrainer) -> list[tuple[list[list[int]], list[dict[str, Any]], list[Trajectory]]]:
    calls: list[tuple[list[list[int]], list[dict[str, Any]], list[Trajectory]]] = []
    real = trainer.engine.generate

    def spied(prompt_ids, metas, **kwargs):
        out = real(prompt_ids, metas, **kwargs)
        calls.append(([list(p) for p in prompt_ids], [dict(m) for m in metas], list(out)))
        return out

    trainer.engine.generate = spied
    return calls


def _spy_experience(trainer: RLTrainer) -> list[tuple[list[Trajectory], Any]]:
    seen: list[tuple[list[Trajectory], Any]] = []
    real = trainer.make_experience

    def spied(trajs, groups, rewards=None, fresh=None):
        exp, metrics = real(trajs, groups, rewards, fresh)
        seen.append((list(trajs), exp))
        return exp, metrics

    trainer.make_experience = spied
    return seen


def _first_turn(traj: Trajectory, start: int, decode) -> str:
    """The action of the first run of generated tokens from ``start`` (written out, for the metrics)."""
    ids = []
    for token, role in zip(traj.response_ids[start:], traj.roles[start:], strict=True):
        if role != Role.GENERATED:
            break
        ids.append(token)
    return parse_action(decode(ids)).kind if ids else "none"


def test_k_decision_groups_continue_every_row_from_the_gold_prefix_in_the_one_rollout(
    world, tiny_model_dir, tmp_path
):
    trainer = _trainer(world, tiny_model_dir, tmp_path / "run", guidance__decision_groups=4)
    calls = _spy_generate(trainer)
    seen = _spy_experience(trainer)
    metrics = trainer.train_step()
    trajs, exp = seen[0]
    n = 3
    # generated instead of the fresh rollouts: one generate call of 6 x 3 rows, nothing thrown away
    assert len(calls) == 1 and len(calls[0][0]) == 18
    decided = [g for g in range(6) if all(is_decision(t) for t in trajs[n * g : n * g + n])]
    assert decided == [0, 1, 3, 4]  # single-hop and two-hop alternately: 1, 0, 4, 3
    assert not any(is_decision(t) for g in (2, 5) for t in trajs[n * g : n * g + n])
    hops = [trajs[n * g].meta["decision_hops"] for g in decided]
    assert sorted(hops) == [1, 1, 2, 2] and metrics["decision/groups"] == 4
    writer = GoldWriter(trainer.tokenizer, trainer.cfg.rollout, trainer.retriever, trainer.cfg.retrieval.topk)
    prompts, metas, _ = calls[0]
    answered, searched = [], []
    decode = lambda ids: trainer.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    for g in decided:
        path = gold_path(ROWS[g])
        prefix = writer.prefix(path)
        head = [*prefix.turn_ids, *prefix.obs_ids]
        for row in range(n * g, n * g + n):
            traj, prompt = trajs[row], trainer._prompt_ids(g)
            # the engine was asked to continue prompt + gold prefix, with the prefix counted in its budgets
            assert prompts[row] == prompt + head and metas[row]["prefix_tokens"] == len(head)
            assert traj.prompt_ids == prompt and traj.response_ids[: len(head)] == head
            assert traj.queries[0] == path.queries[0] and traj.meta["group_id"] == g
            assert set(traj.roles[: len(head)]) == {int(Role.OBSERVATION)}
            p = len(prompt)
            mask = exp.train_mask[row]
            assert not mask[: p + len(head)].any()  # the prompt and the gold prefix: never trained
            generated = [p + i for i, r in enumerate(traj.roles) if r == Role.GENERATED]
            assert generated and all(i >= p + len(head) for i in generated)
            assert mask.nonzero().flatten().tolist() == generated  # every token the policy wrote after it
            first = _first_turn(traj, len(head), decode)
            assert traj.meta["decision_first"] == first
            (searched if len(path.queries) > 1 else answered).append(first)
    assert metrics["decision/answer_now_single"] == pytest.approx(answered.count("answer") / len(answered))
    assert metrics["decision/search_next_multi"] == pytest.approx(searched.count("search") / len(searched))
    rewards = exp.scores.tolist()
    single_rows = [
        r for g in decided if len(gold_path(ROWS[g]).queries) == 1 for r in range(n * g, n * g + n)
    ]
    assert metrics["decision/reward_single"] == pytest.approx(sum(rewards[r] for r in single_rows) / 6)
    # the rollout metrics describe the two groups rolled out from the prompt alone
    assert metrics["rollout/trajectories"] == 6
    trainer.close()


def test_guidance_leaves_decision_groups_alone(world, tiny_model_dir, tmp_path):
    """Decision groups are chosen before the rollout; guidance then guides only the fresh groups without a
    success (group 0, the first failed two-hop group, is a decision group and keeps all its rows)."""
    trainer = _trainer(world, tiny_model_dir, tmp_path / "run", guidance__decision_groups=3, guidance__off_policy=1,
                       guidance__branched=1, guidance__share=1.0, guidance__decay_until=1.0)  # fmt: skip
    seen = _spy_experience(trainer)
    metrics = trainer.train_step()
    trajs, _ = seen[0]
    kinds = [t.meta.get("guided") for t in trajs]
    assert kinds == ["decision"] * 6 + [None] * 3 + [None, "gold", "branched"] + ["decision"] * 3 + [None] * 3
    assert metrics["decision/groups"] == 3 and metrics["guidance/gold"] == 1
    trainer.close()


def test_the_choice_alternates_kinds_takes_the_other_kind_when_one_runs_out_and_is_capped():
    paths = [GoldPath(("A", "B"), "x"), GoldPath(("C",), "y"), None, GoldPath(("D", "E"), "z"),
             GoldPath(("F", "G"), "w"), GoldPath((), "v")]  # fmt: skip
    metas = [{"sample_index": g} for g in range(6) for _ in range(2)]
    groups = [g for g in range(6) for _ in range(2)]
    chosen = lambda k: [g for g, _, _ in DecisionGroups(k, paths, None).choose(metas, groups)]  # noqa: E731
    assert chosen(1) == [1]  # single-hop first
    assert chosen(2) == [0, 1]
    assert chosen(3) == [0, 1, 3]  # the only single-hop group taken: the multi-hop ones fill in
    assert chosen(5) == [0, 1, 3, 4]  # every group with a path (group 2 has none, group 5 an empty one)
    assert chosen(0) == []
    # at most the rank's groups - 1 (under torchrun a rank holds batch_size / world_size groups)
    assert [g for g, _, _ in DecisionGroups(5, paths, None).choose(metas[:6], groups[:6])] == [0, 1]


def test_config_refuses_bad_decision_group_counts():
    base = ["trainer.batch_size=8", "trainer.mini_batch_size=8", "rollout.n=4"]
    assert load_config(None, [*base, "guidance.decision_groups=7"]).guidance.decision_groups == 7
    assert load_config(None, [*base, "guidance.decision_groups=0"]).guidance.enabled is False
    cases = {
        "guidance.decision_groups=-1": "guidance.decision_groups must be >= 0, got -1",
        "guidance.decision_groups=8": "guidance.decision_groups=8 with trainer.batch_size=8",
        "guidance.decision_groups=9": "at most trainer.batch_size - 1 = 7",
    }
    for override, message in cases.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(None, [*base, override])
    with pytest.raises(ConfigError, match=r"guidance\.decision_groups=2 with rollout\.n=1"):
        load_config(
            None, [*base, "rollout.n=1", "guidance.decision_groups=2", "algorithm.norm_adv_by_std=false"]
        )
    with pytest.raises(ConfigError, match=r"guidance\.decision_groups=2 with algorithm\.advantage=gae"):
        load_config(None, [*base, "algorithm.advantage=gae", "guidance.decision_groups=2"])


def _continuation(meta: dict[str, Any], pieces: list[tuple[list[int], Role]], **fields: Any) -> Trajectory:
    traj = Trajectory(prompt_ids=[1], meta=dict(meta), **fields)
    for ids, role in pieces:
        traj.response_ids += ids
        traj.roles += [int(role)] * len(ids)
        traj.logprobs += [-0.5 if role == Role.GENERATED else 0.0] * len(ids)
    return traj


def test_answer_now_against_search_again_on_a_single_hop_question_by_hand(world, tiny_model_dir, tmp_path):
    """One decision group of the single-hop question, its gold prefix found the answer's passage. Rows: A
    answers Borvik now, B searches again then answers Borvik, C answers Ost now; exact match R = (1, 1, 0).

        A_i   = (R_i - 2/3) / (std R + eps),   std R = sqrt(1/3)           -> (1, 1, -2) / sqrt(3)
        v_i2  = (0, -step_superfluous, 0) = (0, -0.2, 0)     B's 2nd search after all gold was found
        Â_i2  = (v_i2 - mean v_2) / (std v_2 + eps)                     -> (1, -2, 1) / sqrt(3)

    so A's answer holds A_A + Â_A2 = 2 / sqrt(3), B's second search A_B + Â_B2 = -1 / sqrt(3): the search
    again lies 0.2 / std v_2 = sqrt(3) below answering now (step_credit_coef 1), where with
    step_superfluous = 0 the two would be equal. The prefix's own search (position 1: a gold passage, step
    reward step_gain for every row) is an observation: no advantage reaches it."""
    trainer = _trainer(
        world, tiny_model_dir, tmp_path / "run", reward__step_superfluous=0.2, reward__step_gain=0.5
    )
    tok = trainer.tokenizer
    writer = GoldWriter(tok, trainer.cfg.rollout, trainer.retriever, trainer.cfg.retrieval.topk)
    index = 1
    path = gold_path(ROWS[index])
    prefix = writer.prefix(path)
    head = len(prefix.turn_ids) + len(prefix.obs_ids)
    meta = prefix_meta({**sample_meta(ROWS[index], index), "group_id": 0}, prefix)
    answer = {a: writer.encode(answer_turn_text(a, None)) for a in ("Borvik", "Ost")}
    again = writer.search("Borvik", None, turn=2)  # a real second search and its observation
    gen, obs = Role.GENERATED, Role.OBSERVATION
    rows = [
        _continuation(meta, [(answer["Borvik"], gen)], turns=2, finish_reason="answer"),
        _continuation(meta, [(again.turn_ids, gen), (again.obs_ids, obs), (answer["Borvik"], gen)], turns=3,
                      searches=1, queries=["Borvik"], documents=[again.documents],
                      search_spans=[[0, len(again.turn_ids)]], finish_reason="answer"),
        _continuation(meta, [(answer["Ost"], gen)], turns=2, finish_reason="answer"),
    ]  # fmt: skip
    prompt = trainer._prompt_ids(index)
    plan = DecisionPlan([], [], [DecisionJob(0, [0, 1, 2], prefix, 1)], [prompt] * 3, tok)
    trajs = plan.splice(rows)
    assert [t.meta["decision_first"] for t in trajs] == ["answer", "search", "answer"]
    credit = step_credit(trajs[1], trainer.cfg.reward, trainer._decode)
    assert credit.turns[0].reward == 0.5 and credit.turns[1].superfluous and credit.turns[1].reward == -0.2
    exp, _ = trainer.make_experience(trajs, [0, 0, 0])
    assert exp.scores.tolist() == [1.0, 1.0, 0.0]
    p, s3 = len(prompt), math.sqrt(3.0)
    turn_b = slice(p + head, p + head + len(again.turn_ids))
    answer_at = lambda t: slice(p + len(t.response_ids) - len(answer["Borvik"]), p + len(t.response_ids))  # noqa: E731
    adv = exp.advantages
    assert adv[0, answer_at(trajs[0])].tolist() == pytest.approx([2 / s3] * len(answer["Borvik"]), rel=1e-4)
    assert adv[1, turn_b].tolist() == pytest.approx([-1 / s3] * len(again.turn_ids), rel=1e-4)
    assert adv[1, answer_at(trajs[1])].tolist() == pytest.approx([1 / s3] * len(answer["Borvik"]), rel=1e-4)
    ost = slice(p + head, p + head + len(answer["Ost"]))
    assert adv[2, ost].tolist() == pytest.approx([-1 / s3] * len(answer["Ost"]), rel=1e-4)
    assert float(adv[0, answer_at(trajs[0])][0] - adv[1, turn_b][0]) == pytest.approx(s3, rel=1e-4)
    # the gold prefix: not trained, no advantage, though its step reward (a gold passage found) is recorded
    assert not exp.train_mask[:, : p + head].any() and not adv[:, : p + head].any()
    assert exp.extras["step_rewards"][0, p : p + len(prefix.turn_ids)].tolist() == [0.5] * len(
        prefix.turn_ids
    )
    # without the superfluous-step term answering now and searching again are worth the same here
    trainer.cfg.reward.step_superfluous = 0.0
    flat, _ = trainer.make_experience(trajs, [0, 0, 0])
    assert flat.advantages[1, turn_b].tolist() == pytest.approx([1 / s3] * len(again.turn_ids), rel=1e-4)
    assert flat.advantages[0, answer_at(trajs[0])].tolist() == pytest.approx(
        [1 / s3] * len(answer["Borvik"]), rel=1e-4
    )
    trainer.close()


class _Reward:
    total: float

    def __init__(self, total: float) -> None:
        self.total = total


def test_mixing_keeps_replay_off_decision_groups_and_counts_them_apart():
    """Group 0 single-hop decision rows (answer now, search again), group 1 two-hop decision rows (search,
    answer), group 2 fresh, all failed except one decision row; the buffer holds successes of every
    question: replay goes into group 2 alone, the decision success is not stored, and the rollout metrics'
    rows are group 2's."""

    def row(question: int, gid: int, k: int, **meta: Any) -> Trajectory:
        return Trajectory(prompt_ids=[1], response_ids=[5], roles=[int(Role.GENERATED)], logprobs=[-1.0],
                          meta={"sample_index": question, "group_id": gid, "sample_in_group": k, **meta})  # fmt: skip

    single = {"guided": "decision", "decision_hops": 1}
    multi = {"guided": "decision", "decision_hops": 2}
    trajs = [row(10, 0, 0, **single, decision_first="answer"), row(10, 0, 1, **single, decision_first="search"),
             row(11, 1, 0, **multi, decision_first="search"), row(11, 1, 1, **multi, decision_first="answer"),
             row(12, 2, 0), row(12, 2, 1)]  # fmt: skip
    groups = [0, 0, 1, 1, 2, 2]
    totals = {id(trajs[0]): 1.0}
    buffer = ReplayBuffer(keep_per_question=1)
    for q in (10, 11, 12):
        buffer.add(q, row(q, 9, 0), step=0)
    cfg = SimpleNamespace(min_reward=1.0, per_group=1, max_share=1.0)
    guidance = SimpleNamespace(decisions=object(), active=False)
    score = lambda batch: [_Reward(totals.get(id(t), 1.0 if t.meta.get("replayed") else 0.0)) for t in batch]  # noqa: E731
    batch = mix_batch(trajs, groups, 1, score=score, replay=buffer, replay_cfg=cfg, guidance=guidance,
                      generate=lambda p, m: [])  # fmt: skip
    assert [t.meta.get("replayed", False) for t in batch.trajs] == [False] * 5 + [True]
    assert batch.trajs[:5] == trajs[:5] and batch.fresh == trajs[4:]
    assert [r.total for r in batch.rewards] == [1.0, 0, 0, 0, 0, 1.0]
    assert buffer.take(10, 1)[0][0] == 0  # the decision row's success was not stored for replay
    out = shares(batch.counts, replay=True, guidance=False)
    assert out["decision/groups"] == 2 and out["replay/share"] == pytest.approx(1 / 6)
    assert out["decision/answer_now_single"] == 0.5 and out["decision/search_next_multi"] == 0.5
    assert out["decision/reward_single"] == 0.5 and out["decision/reward_multi"] == 0.0


def _pass_through(guidance, prompt_ids, metas, groups) -> DecisionPlan:
    """The rollout's requests with no decision hook at all: the prompts and metas as given."""
    return DecisionPlan([list(p) for p in prompt_ids], [dict(m) for m in metas])


def test_zero_decision_groups_leave_the_step_bit_identical(world, tiny_model_dir, tmp_path, monkeypatch):
    """decision_groups=0 (with guidance on, so the guidance object exists): the step's rollout, rewards,
    masks and advantages are those of a step whose rollout bypasses the decision hook, exactly."""
    import searchr1.trainer.loop as loop

    extra = dict(guidance__off_policy=1, guidance__branched=1, guidance__share=1.0, guidance__decay_until=1.0,
                 guidance__decision_groups=0)  # fmt: skip
    runs = []
    for name in ("now", "without the hook"):
        if name != "now":
            monkeypatch.setattr(loop, "rollout_requests", _pass_through)
        trainer = _trainer(world, tiny_model_dir, tmp_path / name.replace(" ", "_"), **extra)
        assert trainer.guidance is not None and trainer.guidance.decisions is None
        seen = _spy_experience(trainer)
        metrics = trainer.train_step()
        runs.append((seen[0], metrics))
        trainer.close()
    (now, exp), metrics = runs[0]
    (before, ref), _ = runs[1]
    assert [t.response_ids for t in now] == [t.response_ids for t in before]
    assert [t.roles for t in now] == [t.roles for t in before]
    assert [t.logprobs for t in now] == [t.logprobs for t in before]
    assert [t.meta for t in now] == [t.meta for t in before]
    for name in ("input_ids", "attention_mask", "train_mask", "scores", "advantages"):
        assert torch.equal(getattr(exp, name), getattr(ref, name)), name
    assert not any(k.startswith("decision/") for k in metrics) and metrics["rollout/trajectories"] == 18
