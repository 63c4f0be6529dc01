"""Guidance from the gold path (searchr1.rollout.gold, searchr1.trainer.guidance): gold trajectories as the
rollout writes them, branched rollouts from a gold prefix, the schedule's exact share, policy shaping's
gradient against a hand value, and a training step that mixes them into the groups without a success."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import rlworld
import torch

from searchr1.algorithms.aggregation import AggNorms
from searchr1.algorithms.config import AlgorithmConfig
from searchr1.algorithms.policy_losses import shaped_off_policy_loss
from searchr1.config import load_config
from searchr1.data.prompts import wrap_information
from searchr1.retrieval.bm25 import BM25Retriever
from searchr1.retrieval.corpus import read_corpus
from searchr1.rollout.config import RolloutConfig
from searchr1.rollout.gold import GoldPath, GoldWriter, gold_path, sentence_naming, splice
from searchr1.rollout.types import Role, Trajectory
from searchr1.trainer.distributed import DistInfo
from searchr1.trainer.experience import Experience
from searchr1.trainer.guidance import Guidance, scheduled_share
from searchr1.trainer.loop import RLTrainer
from searchr1.trainer.update import MetricSums, UpdateSettings, _actor_loss, _Step

BRIDGE = rlworld.BRIDGE


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return rlworld.write_guided_world(tmp_path_factory.mktemp("world"))


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from searchr1.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def bm25(world):
    return BM25Retriever.from_documents(list(read_corpus(world["corpus"])))


def test_gold_path_from_each_kind_of_row():
    assert gold_path(BRIDGE) == GoldPath(("Quillon Press", "Alice Verdan"), "Borvik")
    hotpot = {
        "question": "q",
        "golden_answers": ["Denise Levertov"],
        "metadata": {
            "supporting_facts": {
                "title": ["Harvey Pekar", "Denise Levertov", "Harvey Pekar"],
                "sent_id": [0, 0, 1],
            }
        },
    }
    assert gold_path(hotpot) == GoldPath(("Harvey Pekar", "Denise Levertov"), "Denise Levertov")
    assert gold_path({"question": "q", "golden_answers": ["x"], "metadata": {"type": "single"}}) is None
    assert gold_path({**BRIDGE, "golden_answers": []}) is None


def test_a_gold_trajectory_is_written_as_the_rollout_writes_one(tokenizer, bm25):
    cfg = RolloutConfig(max_turns=2, max_obs_tokens=200, max_response_tokens=400)
    writer = GoldWriter(tokenizer, cfg, bm25, topk=1)
    prompt = tokenizer.encode("Question: where was the founder of the Quillon Press born\n")
    gold = writer.trajectory(prompt, gold_path(BRIDGE), {"sample_index": 0, "golden_answers": ["Borvik"]})
    traj = gold.trajectory
    assert not gold.cut and traj.finish_reason == "answer" and traj.meta["guided"] == "gold"
    assert traj.queries == ["Quillon Press", "Alice Verdan"] and traj.searches == 2 and traj.turns == 3
    assert [d[0]["title"] for d in traj.documents] == ["Quillon Press", "Alice Verdan"]
    press = "The Quillon Press is a publisher based in Borvik, founded by Alice Verdan."
    born = "Alice Verdan was born in Borvik in 1901."
    turns = [
        "<think> I should search Quillon Press. </think>\n<search> Quillon Press </search>",
        f"<think> {press} I should search Alice Verdan. </think>\n<search> Alice Verdan </search>",
        f"<think> {born} </think>\n<answer> Borvik </answer>",
    ]
    observations = [
        wrap_information(f"Doc 1(Title: Quillon Press) {press}\n"),
        wrap_information(f"Doc 1(Title: Alice Verdan) {born} She founded the Quillon Press.\n"),
    ]
    pieces = [(turns[0], Role.GENERATED), (observations[0], Role.OBSERVATION), (turns[1], Role.GENERATED),
              (observations[1], Role.OBSERVATION), (turns[2], Role.GENERATED)]  # fmt: skip
    ids, roles = [], []
    for text, role in pieces:  # each piece encoded on its own, as the rollout appends them
        piece = tokenizer.encode(text, add_special_tokens=False)
        ids += piece
        roles += [int(role)] * len(piece)
    assert traj.response_ids == ids and traj.roles == roles and traj.prompt_ids == prompt
    first = len(tokenizer.encode(turns[0], add_special_tokens=False))
    assert traj.search_spans[0] == [0, first]
    assert tokenizer.decode(traj.response_ids[slice(*traj.search_spans[1])]) == turns[1]


def test_a_gold_trajectory_longer_than_the_budget_is_cut_after_a_whole_turn(tokenizer, bm25):
    path = gold_path(BRIDGE)
    full = GoldWriter(tokenizer, RolloutConfig(max_turns=2, max_obs_tokens=200), bm25, 1).trajectory(
        [1], path, {}
    )
    one_turn = full.trajectory.search_spans[1][0]  # the first search turn and its observation
    cfg = RolloutConfig(max_turns=2, max_obs_tokens=200, max_response_tokens=one_turn + 5)
    gold = GoldWriter(tokenizer, cfg, bm25, 1).trajectory([1], path, {})
    assert gold.cut and gold.trajectory.truncated and gold.trajectory.finish_reason == "truncated"
    assert gold.trajectory.response_ids == full.trajectory.response_ids[:one_turn]
    assert gold.trajectory.searches == 1 and gold.trajectory.roles[-1] == Role.OBSERVATION
    few_turns = GoldWriter(tokenizer, RolloutConfig(max_turns=1, max_obs_tokens=200), bm25, 1).trajectory(
        [1], path, {}
    )
    assert few_turns.cut and few_turns.trajectory.queries == ["Quillon Press"]  # max_turns: one search
    assert few_turns.trajectory.finish_reason == "answer"


def test_the_controls_gold_trajectory_reads_its_own_empty_results(tokenizer):
    class NoSearch:
        def search(self, queries, topk):
            return [[] for _ in queries]

    gold = GoldWriter(tokenizer, RolloutConfig(max_turns=2), NoSearch(), 1).trajectory(
        [1], gold_path(BRIDGE), {}
    )
    text = tokenizer.decode(gold.trajectory.response_ids)
    assert text.count("<information></information>") == 2 and gold.trajectory.documents == [[], []]
    assert "<think> I should search Alice Verdan. </think>" in text  # no passage named the bridge entity
    assert text.endswith("<think> The answer is Borvik. </think>\n<answer> Borvik </answer>")


def test_sentence_naming_finds_the_first_sentence_with_the_phrase():
    hits = [{"text": "A is a city. B was born in A in 1900. B wrote C."}]
    assert sentence_naming(hits, "b") == "B was born in A in 1900."
    assert sentence_naming(hits, "nowhere") is None


def test_the_schedule_decays_to_zero_and_the_plan_guides_exactly_its_share():
    cfg = load_config(None, ["guidance.off_policy=1", "guidance.branched=1", "guidance.share=0.5",
                             "guidance.decay_until=0.5", "rollout.n=4"]).guidance  # fmt: skip
    assert [scheduled_share(cfg, s, 20) for s in (0, 5, 10, 15)] == [0.5, 0.25, 0.0, 0.0]

    class Writer:
        tokenizer = None

    samples = [BRIDGE] * 8
    guide = Guidance(cfg, 20, samples, Writer())  # type: ignore[arg-type]
    trajs = [Trajectory(prompt_ids=[1], meta={"sample_index": g}) for g in range(8) for _ in range(4)]
    groups = [g for g in range(8) for _ in range(4)]
    totals = [0.0] * 32
    totals[4 * 3] = 1.0  # group 3 has a success: never guided
    at_start = guide.plan(trajs, groups, totals, 0)  # 0.5 x 32 rows = 16 = 8 groups x 2 rows
    assert [rows for rows, _ in at_start] == [[4 * g + 2, 4 * g + 3] for g in (0, 1, 2, 4, 5, 6, 7)]
    assert sum(len(rows) for rows, _ in guide.plan(trajs, groups, totals, 5)) == 8  # 0.25 x 32
    assert guide.plan(trajs, groups, totals, 10) == [] and guide.plan(trajs, groups, totals, 19) == []


def test_policy_shaping_gradient_against_a_hand_value():
    """l_t = -A pi / (pi + gamma): d l / d log pi = -A gamma pi / (pi + gamma)^2, token-mean over 3 tokens."""
    gamma = 0.1
    probs = torch.tensor([[0.05, 0.5, 0.9, 0.3]])
    log_prob = probs.log().requires_grad_(True)
    adv = torch.tensor([[2.0, 2.0, -1.0, 5.0]])
    mask = torch.tensor([[True, True, True, False]])
    loss, weight = shaped_off_policy_loss(log_prob, adv, mask, gamma=gamma, loss_agg="token-mean",
                                          norms=AggNorms(num_tokens=3.0, num_seqs=1.0, seq_len=4.0))  # fmt: skip
    loss.backward()
    w = [gamma * p / (p + gamma) ** 2 for p in (0.05, 0.5, 0.9)]  # 0.2222, 0.1389, 0.09
    assert weight[0, :3].tolist() == pytest.approx(w, rel=1e-5) and weight[0, 3] == 0
    assert log_prob.grad[0].tolist() == pytest.approx(
        [-2.0 * w[0] / 3, -2.0 * w[1] / 3, 1.0 * w[2] / 3, 0.0], rel=1e-5
    )
    value = -(2 * 0.05 / 0.15 + 2 * 0.5 / 0.6 - 0.9 / 1.0) / 3
    assert float(loss) == pytest.approx(value, rel=1e-5)


def test_gold_rows_are_trained_by_policy_shaping_alone_never_by_the_ppo_loss():
    """Row 0 fresh (advantage -1; the on-policy fast path: ratio 1), row 1 gold (advantage +1; the policy
    gives its tokens 0.05, 0.5, 0.9), N = 5 trained tokens, token-mean: d loss / d log pi is -A / N on the
    fresh row and -A w / N on the gold row, w = gamma pi / (pi + gamma)^2. A gold row also in the PPO loss
    would get -A (1 + w) / N; a fresh row in the shaped loss, -A w / N."""
    gamma = 0.1
    probs = (0.05, 0.5, 0.9)
    current = torch.tensor([[0.0, math.log(0.5), math.log(0.4), 0.0], [0.0, *map(math.log, probs)]])
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1]], dtype=torch.bool)
    mb = Experience(
        input_ids=torch.ones(2, 4, dtype=torch.long),
        attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
        train_mask=mask,
        gen_mask=mask,
        group_ids=[0, 0],
        scores=torch.tensor([0.0, 1.0]),
        seq_lens=torch.tensor([3, 4]),
        advantages=torch.tensor([[0, -1.0, -1.0, 0], [0, 1.0, 1.0, 1.0]]),
        extras={"gold": torch.tensor([False, True])},
    )  # old_logprobs None: the on-policy fast path (trainer.on_policy_logprobs)
    algo = AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.2, use_kl_loss=False, loss_agg="token-mean")
    actor = rlworld.FixedLogprobs(current)
    settings = UpdateSettings(1, 1, 2, 0, 1.0, 1.0, True, False, 0, shaping_gamma=gamma)
    step = _Step(actor, None, None, None, algo, settings, DistInfo(), torch.device("cpu"), False, None)
    sums = MetricSums()
    loss = _actor_loss(actor, mb, step, AggNorms(num_tokens=5, num_seqs=2, seq_len=3), sums)
    loss.backward()
    w = [gamma * p / (p + gamma) ** 2 for p in probs]
    expected = torch.tensor([[0, 0.2, 0.2, 0], [0, -w[0] / 5, -w[1] / 5, -w[2] / 5]])
    assert torch.allclose(actor.theta.grad, expected, atol=1e-6)
    # the loss: -A ratio = 1 on each fresh token, -A pi / (pi + gamma) on each gold token
    assert loss.item() == pytest.approx((1 + 1 - sum(p / (p + gamma) for p in probs)) / 5, rel=1e-5)
    metrics = sums.reduce(DistInfo(), torch.device("cpu"))
    assert metrics["guidance/shaping_weight"] == pytest.approx(sum(w) / 3, rel=1e-5)


@torch.no_grad()
def shaping_weight_by_hand(model, traj: Trajectory, temperature: float, gamma: float) -> tuple[float, int]:
    """Mean over a trajectory's generated tokens of w_t = gamma pi_t / (pi_t + gamma)^2, with pi_t from one
    forward pass over prompt + response (log-softmax of logits / temperature, written out); and how many."""
    ids = list(traj.prompt_ids) + list(traj.response_ids)
    logits = model(input_ids=torch.tensor([ids])).logits[0].double() / temperature
    start = len(traj.prompt_ids)
    weights = []
    for i, (token, role) in enumerate(zip(traj.response_ids, traj.roles, strict=True)):
        if role != Role.GENERATED:
            continue
        row = logits[start + i - 1]
        pi = math.exp(float(row[token] - torch.logsumexp(row, dim=0)))
        weights.append(gamma * pi / (pi + gamma) ** 2)
    return sum(weights) / len(weights), len(weights)


def _trainer(world, model_dir, out: Path, **extra) -> RLTrainer:
    cfg = rlworld.load(world, model_dir, out, **{**rlworld.GUIDED_RUN, **extra})
    trainer = RLTrainer(cfg)
    trainer.setup()
    return trainer


def test_a_training_step_mixes_gold_and_branched_rollouts_into_the_failed_group(
    world, tiny_model_dir, tmp_path
):
    trainer = _trainer(world, tiny_model_dir, tmp_path / "run", guidance__off_policy=1, guidance__branched=1,
                       guidance__share=1.0, guidance__decay_until=1.0)  # fmt: skip
    seen, hand_weights = [], []
    gamma = trainer.cfg.guidance.shaping_gamma
    assert trainer.cfg.trainer.ppo_epochs == 1
    real = trainer.make_experience

    def spied(trajs, groups, rewards=None, fresh=None):
        exp, metrics = real(trajs, groups, rewards, fresh)
        seen.append((list(trajs), exp))
        gold_rows = [t for t in trajs if t.meta.get("guided") == "gold"]
        # the policy before the update (one epoch, one mini-batch: the update's own forward pass sees it)
        hand_weights.extend(
            shaping_weight_by_hand(trainer.policy, t, trainer.cfg.rollout.temperature, gamma)
            for t in gold_rows
        )
        return exp, metrics

    trainer.make_experience = spied
    metrics = trainer.train_step()
    trajs, exp = seen[0]
    weight, tokens = hand_weights[0]
    kinds = [t.meta.get("guided") for t in trajs]
    # group 0 (the bridge question, no success) gets one gold and one branched rollout; group 1 has no gold path
    assert kinds == [None, None, "gold", "branched", None, None, None, None]
    gold, branched = trajs[2], trajs[3]
    assert (
        gold.queries == ["Quillon Press", "Alice Verdan"]
        and exp.extras["gold"].tolist() == [False, False, True] + [False] * 5
    )
    assert branched.queries[0] == "Quillon Press" and branched.searches >= 1
    prefix = branched.meta["guided_prefix_tokens"]
    assert set(branched.roles[:prefix]) == {int(Role.OBSERVATION)}  # the gold prefix is never trained
    assert (
        branched.turns <= 3 and len(branched.response_ids) <= 160
    )  # max_turns and the budget count the prefix
    assert metrics["guidance/gold"] == 1 and metrics["guidance/branched"] == 1
    assert metrics["guidance/share"] == pytest.approx(2 / 8)
    # w = gamma pi / (pi + gamma)^2 over the gold row's trained tokens, pi from the policy's own logits
    assert tokens == int(exp.train_mask[2].sum()) and len(hand_weights) == 1
    assert metrics["guidance/shaping_weight"] == pytest.approx(weight, rel=1e-4)
    # the group's outcome advantage is computed over the mixed group: the gold success above the rest
    assert exp.scores[2] == 1.0 and all(float(exp.scores[r]) < 1.0 for r in (0, 1))
    assert float(exp.advantages[2][exp.train_mask[2]].min()) > 0
    trainer.close()


def test_guidance_on_data_without_a_gold_path_is_one_line_and_no_crash(
    world, tiny_model_dir, tmp_path, capsys
):
    rows = [json.loads(line) for line in world["train"].read_text().splitlines()][1:]
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trainer = _trainer({**world, "train": plain}, tiny_model_dir, tmp_path / "run", guidance__off_policy=1)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("guidance:")]
    assert len(lines) == 1 and "supporting_titles" in lines[0] and "guidance is off" in lines[0]
    metrics = trainer.train_step()
    assert "guidance/share" not in metrics and metrics["rollout/trajectories"] == 8
    trainer.close()


def test_splice_joins_a_gold_prefix_and_its_continuation(tokenizer, bm25):
    writer = GoldWriter(tokenizer, RolloutConfig(max_turns=2, max_obs_tokens=200), bm25, 1)
    prefix = writer.prefix(gold_path(BRIDGE))
    head = len(prefix.turn_ids) + len(prefix.obs_ids)
    cont = Trajectory(prompt_ids=[1, 2, *prefix.turn_ids, *prefix.obs_ids], response_ids=[7, 8, 9, 10],
                      roles=[1, 1, 2, 1], logprobs=[-0.5, -0.25, 0.0, -1.0], turns=2, searches=1,
                      queries=["Alice Verdan"], documents=[[{"id": "0"}]], search_spans=[[0, 2]],
                      finish_reason="answer", meta={"prefix_turns": 1, "prefix_tokens": head, "group_id": 3})  # fmt: skip
    traj = splice(prefix, cont, [1, 2], tokenizer)
    assert traj.prompt_ids == [1, 2] and traj.response_ids == prefix.turn_ids + prefix.obs_ids + [7, 8, 9, 10]
    assert traj.roles == [2] * head + [1, 1, 2, 1] and traj.logprobs[head:] == [-0.5, -0.25, 0.0, -1.0]
    assert traj.queries == ["Quillon Press", "Alice Verdan"] and traj.searches == 2 and traj.turns == 2
    assert traj.search_spans == [[0, len(prefix.turn_ids)], [head, head + 2]]
    assert traj.meta == {"group_id": 3, "guided": "branched", "guided_prefix_tokens": head}


def test_no_gold_text_reaches_what_the_policy_sees_at_validation(world, tiny_model_dir, tmp_path):
    """With guidance on, validation prompts the policy with the question alone: no hop-2 title, no answer,
    no gold reasoning, and each validation rollout is the engine's own (nothing guided mixed in). Its
    metrics are per kind of question: the single-hop question answered right and the bridge question
    wrong (the answers set by hand on the engine's rollouts) give 1, 0 and a mean of 1/2."""
    single = {"id": "q0", "question": "where was Alice Verdan born", "golden_answers": ["Borvik"],
              "metadata": {"data_source": "tiny"}}  # fmt: skip
    val = tmp_path / "val.jsonl"
    val.write_text(json.dumps(single) + "\n" + json.dumps(BRIDGE) + "\n")
    trainer = _trainer({**world, "val": val}, tiny_model_dir, tmp_path / "run", guidance__off_policy=1,
                       guidance__branched=1, guidance__share=1.0, trainer__val_every=1)  # fmt: skip
    prompts, outputs = [], []
    real = trainer.engine.generate

    def answered(traj: Trajectory, answer: str) -> Trajectory:
        ids = trainer.tokenizer.encode(f"<answer> {answer} </answer>", add_special_tokens=False)
        return Trajectory(prompt_ids=traj.prompt_ids, response_ids=ids, roles=[int(Role.GENERATED)] * len(ids),
                          logprobs=[0.0] * len(ids), turns=1, finish_reason="answer", meta=traj.meta)  # fmt: skip

    def spied(prompt_ids, metas, **kwargs):
        prompts.extend(prompt_ids)
        out = real(prompt_ids, metas, **kwargs)
        outputs.extend(out)
        return [
            answered(t, "Borvik" if m["sample_index"] == 0 else "Ost")
            for t, m in zip(out, metas, strict=True)
        ]

    trainer.engine.generate = spied
    metrics = trainer.validate()
    assert len(prompts) == 2
    assert (metrics["val/single-hop/em"], metrics["val/multi-hop/em"], metrics["val/em"]) == (1.0, 0.0, 0.5)
    text = trainer.tokenizer.decode(prompts[1])
    assert "Quillon Press" in text  # the question itself
    for gold in ("Alice Verdan", "Borvik", "I should search", "<information>"):
        assert gold not in text
    assert not any(t.meta.get("guided") for t in outputs)
    trainer.close()


def test_validation_balanced_by_kind_and_the_best_kept_by_the_mean_over_kinds(
    world, tiny_model_dir, tmp_path
):
    rows = [json.loads(line) for line in world["val"].read_text().splitlines()]  # single-hop questions
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps(r) + "\n" for r in [*rows, BRIDGE, {**BRIDGE, "id": "b2"}]))
    trainer = _trainer({**world, "val": val}, tiny_model_dir, tmp_path / "run", trainer__val_every=1,
                       trainer__val_balance_kinds=True, trainer__val_max_samples=3,
                       trainer__keep_best="val_em_by_kind")  # fmt: skip
    samples = trainer._validation_samples()
    assert [s["id"] if isinstance(s, dict) else s.id for s in samples] == ["b1", "q0"]  # one of each kind
    metrics = {"val/em": 0.9, "val/em_by_kind": 0.25}
    trainer._keep_if_best(metrics)
    assert trainer.best_val == {"step": 0, "em": 0.25} and metrics["val/best_em"] == 0.25
    trainer._keep_if_best({"val/em": 1.0, "val/em_by_kind": 0.2})  # a better overall EM is not a better mean
    assert trainer.best_val["em"] == 0.25
    trainer.close()
