"""The step reward of each search turn (searchr1.rewards.steps) against hand computations on scripted
trajectories, and the gold passages read from dataset rows (searchr1.data.supporting)."""

from __future__ import annotations

import pytest

from searchr1.data.formats import Sample, sample_meta
from searchr1.data.supporting import supporting_passages
from searchr1.data.synth import SynthConfig, generate_world
from searchr1.rewards.config import RewardConfig
from searchr1.rewards.steps import step_credit, step_metrics
from searchr1.rollout.types import Role, Trajectory

GEN, OBS = int(Role.GENERATED), int(Role.OBSERVATION)
VOCAB = ["<search>", "</search>", "<answer>", "</answer>", "q", "x", "<information>", "</information>"]
"""Token id i decodes to VOCAB[i] (a toy tokenizer for the scripted trajectories)."""


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


def hit(doc_id: str, title: str, text: str = "filler") -> dict:
    return {"id": doc_id, "title": title, "text": text, "score": 1.0}


def scripted(documents: list[list[dict]], meta: dict, answer: bool = True) -> Trajectory:
    """One search turn per entry of ``documents`` (``x <search> q </search>`` then a 3-token
    observation), then ``<answer> q </answer>``; ``search_spans`` as the rollout records them."""
    ids: list[int] = []
    roles: list[int] = []
    spans = []
    for _ in documents:
        start = len(ids)
        ids += [5, 0, 4, 1]
        roles += [GEN] * 4
        spans.append([start, len(ids)])
        ids += [6, 5, 7]
        roles += [OBS] * 3
    if answer:
        ids += [2, 4, 3]
        roles += [GEN] * 3
    return Trajectory(
        prompt_ids=[5, 5],
        response_ids=ids,
        roles=roles,
        logprobs=[0.0] * len(ids),
        searches=len(documents),
        queries=["q"] * len(documents),
        documents=documents,
        search_spans=spans,
        meta=meta,
    )


GAIN, REDUNDANCY = 0.6, 0.25
CFG = RewardConfig(step_gain=GAIN, step_redundancy=REDUNDANCY)


def test_new_passage_repeated_passage_and_a_search_after_everything_was_found():
    gold_a, gold_b = hit("7", "Quillon Press"), hit("9", "Alice Verdan")
    other = hit("3", "Borvik")
    traj = scripted(
        [
            [gold_a, other],  # finds gold A (1 of 2): + GAIN / 2
            [other, gold_a],  # only what turn 1 retrieved: - REDUNDANCY
            [hit("4", "Ost")],  # something new, no gold: 0
            [gold_b],  # gold B, new: + GAIN / 2
            [hit("5", "Tarnland")],  # after all gold was found, new passage: 0
            [gold_b],  # after all gold was found, a repeat: - REDUNDANCY
            [],  # a failed search: nothing retrieved, nothing repeated: 0
        ],
        {"supporting_ids": ["7", "9"], "golden_answers": ["Borvik"]},
    )
    credit = step_credit(traj, CFG, decode)
    assert credit.gold == "ids"
    rewards = [t.reward for t in credit.turns]
    assert rewards == pytest.approx([0.3, -0.25, 0.0, 0.3, 0.0, -0.25, 0.0])
    assert [t.new_gold for t in credit.turns] == [1, 0, 0, 1, 0, 0, 0]
    assert [t.redundant for t in credit.turns] == [False, True, False, False, False, True, False]
    # each turn's span holds exactly its generated tokens: x <search> q </search>
    for turn in credit.turns:
        a, b = turn.span
        assert decode(traj.response_ids[a:b]) == "x<search>q</search>"
        assert all(r == GEN for r in traj.roles[a:b])
    sums = step_metrics([credit])
    assert sums == {"search_turns": 7.0, "scored_turns": 7.0, "reward_sum": pytest.approx(0.1),
                    "new_gold_turns": 2.0, "redundant_turns": 2.0}  # fmt: skip


def test_a_search_after_every_gold_passage_was_found_is_superfluous():
    gold_a, gold_b, other = hit("7", "Quillon Press"), hit("9", "Alice Verdan"), hit("3", "Borvik")
    cfg = RewardConfig(step_gain=GAIN, step_redundancy=REDUNDANCY, step_superfluous=0.1)
    two_hop = {"supporting_ids": ["7", "9"], "golden_answers": ["Borvik"]}
    documents = [[gold_a], [other], [gold_b], [hit("4", "Ost")], [gold_b], []]
    credit = step_credit(scripted(documents, two_hop), cfg, decode)
    # gold A, nothing new (B still missing: not superfluous), gold B, then three searches with nothing missing:
    # a new passage (-0.1), a repeat (-0.25 - 0.1), a failed search (-0.1)
    assert [t.reward for t in credit.turns] == pytest.approx([0.3, 0.0, 0.3, -0.1, -0.35, -0.1])
    assert [t.superfluous for t in credit.turns] == [False, False, False, True, True, True]
    single_hop = {"supporting_ids": ["7"], "golden_answers": ["Borvik"]}
    credit = step_credit(scripted([[gold_a], [other]], single_hop), cfg, decode)
    assert [t.reward for t in credit.turns] == pytest.approx([GAIN, -0.1])  # the second search was not needed
    off = step_credit(scripted([[gold_a], [other]], single_hop), CFG, decode)  # default 0: no penalty
    assert [t.reward for t in off.turns] == pytest.approx([GAIN, 0.0])


def test_no_search_has_no_step_reward():
    credit = step_credit(scripted([], {"supporting_ids": ["7"], "golden_answers": ["x"]}), CFG, decode)
    assert credit.turns == [] and credit.gold == "ids"
    assert step_metrics([credit])["search_turns"] == 0.0


def test_answer_fallback_a_search_after_the_answer_was_found_earns_nothing():
    """A row without supporting passages: the gold is "a passage holding a golden answer"."""
    traj = scripted(
        [
            [hit("1", "Ost", "The Ost is a river.")],  # no answer in it: 0
            [hit("2", "Alice Verdan", "Alice Verdan was born in Borvik.")],  # the answer, first: + GAIN
            [hit("3", "Borvik", "Borvik is a city in Tarnland.")],  # the answer again, new passage: 0
            [hit("2", "Alice Verdan", "Alice Verdan was born in Borvik.")],  # a repeat: - REDUNDANCY
        ],
        {"golden_answers": ["Borvik"]},
    )
    credit = step_credit(traj, CFG, decode)
    assert credit.gold == "answer"
    assert [t.reward for t in credit.turns] == pytest.approx([0.0, 0.6, 0.0, -0.25])
    assert [t.new_gold for t in credit.turns] == [0, 1, 0, 0]


def test_supporting_only_leaves_rows_without_gold_unscored():
    traj = scripted([[hit("2", "A", "Borvik")], [hit("2", "A", "Borvik")]], {"golden_answers": ["Borvik"]})
    cfg = RewardConfig(step_gain=GAIN, step_redundancy=REDUNDANCY, step_gold="supporting")
    credit = step_credit(traj, cfg, decode)
    assert not credit.scored and [t.reward for t in credit.turns] == [0.0, 0.0]
    assert step_metrics([credit])["scored_turns"] == 0.0
    # "answer" ignores the row's supporting passages
    traj.meta["supporting_ids"] = ["99"]
    answer_cfg = RewardConfig(step_gain=GAIN, step_redundancy=REDUNDANCY, step_gold="answer")
    assert [t.reward for t in step_credit(traj, answer_cfg, decode).turns] == pytest.approx([0.6, -0.25])


def test_titles_are_matched_whatever_the_case_and_quotes_and_hits_without_ids_by_text():
    traj = scripted(
        [
            [{"contents": '"quillon press"\nA publisher.'}],  # title from the contents line, new gold
            [{"contents": '"quillon press"\nA publisher.'}],  # the same passage again (no id): redundant
            [{"contents": '"Quillon Press"\nAnother chunk of the article.'}],  # same title: not new gold
        ],
        {"supporting_titles": ["Quillon Press", "Alice Verdan"], "golden_answers": ["x"]},
    )
    credit = step_credit(traj, CFG, decode)
    assert credit.gold == "titles"
    assert [t.reward for t in credit.turns] == pytest.approx([0.3, -0.25, 0.0])


def test_spans_are_found_from_the_tokens_when_the_rollout_did_not_record_them():
    traj = scripted([[hit("7", "A")], [hit("8", "B")]], {"supporting_ids": ["8"], "golden_answers": ["x"]})
    recorded = traj.search_turns()
    traj.search_spans = []
    assert traj.search_turns(decode) == recorded == [(0, 4), (7, 11)]
    assert [t.reward for t in step_credit(traj, CFG, decode).turns] == pytest.approx([0.0, 0.6])
    assert traj.search_turns() == [None, None]  # no decode, no record: the tokens are unknown


def test_off_by_default_and_bad_settings_name_the_key():
    assert not RewardConfig().step_rewards
    assert RewardConfig(step_redundancy=0.1).step_rewards
    with pytest.raises(ValueError, match=r"reward\.step_gain"):
        RewardConfig(step_gain=-1.0).validate(None)
    with pytest.raises(ValueError, match=r"reward\.step_redundancy"):
        RewardConfig(step_redundancy=float("nan")).validate(None)
    with pytest.raises(ValueError, match=r"reward\.step_gold"):
        RewardConfig(step_gold="titles").validate(None)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# gold passages of dataset rows
# ---------------------------------------------------------------------------------------------


def test_supporting_passages_of_each_dataset_form():
    hotpot_hf = {"supporting_facts": {"title": ["Alice", "Borvik", "Alice"], "sent_id": [0, 1, 2]}}
    assert supporting_passages(hotpot_hf) == {"titles": ["Alice", "Borvik"]}
    hotpot_json = {"supporting_facts": [["Alice", 0], ["Borvik", 2]]}
    assert supporting_passages(hotpot_json) == {"titles": ["Alice", "Borvik"]}
    musique = {"paragraphs": [{"title": "A", "is_supporting": False}, {"title": "B", "is_supporting": True}]}
    assert supporting_passages(musique) == {"titles": ["B"]}
    assert supporting_passages({"hops": ["Alice Verdan"], "data_source": "synth"}) == {"titles": ["Alice Verdan"]}
    assert supporting_passages({"hops": ["Alice Verdan"]}, data_source="hotpotqa") == {}  # hops: synth only
    assert supporting_passages({"supporting_ids": [3, "3", 4]}) == {"ids": ["3", "4"]}
    assert supporting_passages({"type": "single"}) == {} == supporting_passages(None)


def test_the_meta_of_a_trajectory_carries_the_gold_passages():
    sample = Sample("q1", "who?", ["x"], data_source="hotpotqa",
                    metadata={"supporting_facts": {"title": ["A", "B"], "sent_id": [0, 0]}})  # fmt: skip
    assert sample_meta(sample, 5)["supporting_titles"] == ["A", "B"]
    assert "supporting_titles" not in sample_meta(Sample("q2", "who?", ["x"]), 0)
    as_dict = {"question": "who?", "golden_answers": ["x"], "metadata": {"supporting_ids": ["4"]}}
    assert sample_meta(as_dict, 0)["supporting_ids"] == ["4"]


def test_synthetic_rows_name_the_passage_holding_each_hops_fact():
    world = generate_world(SynthConfig(num_entities=80, seed=3))
    corpus = {d["id"]: d["contents"] for d in world.corpus}
    rows = [r for split in world.splits.values() for r in split]
    assert {r["metadata"]["type"] for r in rows} == {"single", "bridge", "comparison"}
    for row in rows:
        meta = row["metadata"]
        assert meta["supporting_titles"] == meta["hops"]
        assert len(meta["supporting_ids"]) == len(meta["hops"])
        for doc_id, hop in zip(meta["supporting_ids"], meta["hops"], strict=True):
            title, _, text = corpus[doc_id].partition("\n")
            assert title == f'"{hop}"'
            assert text.startswith(hop)  # the first passage: the one with the entity's facts
    bridge = next(r for r in rows if r["metadata"]["type"] == "bridge")
    last_hop = corpus[bridge["metadata"]["supporting_ids"][-1]]
    assert bridge["golden_answers"][0] in last_hop  # the answer is in the last hop's passage


def test_gold_coverage_is_the_share_of_gold_passages_found_by_the_whole_trajectory():
    from searchr1.rewards.composite import context_from_trajectory
    from searchr1.rewards.registry import build_component

    gold_a, gold_b, other = hit("7", "Quillon Press"), hit("9", "Alice Verdan"), hit("3", "Borvik")
    meta = {"supporting_ids": ["7", "9"], "golden_answers": ["Borvik"]}
    component = build_component("gold_coverage", CFG)
    for documents, want in (
        ([], 0.0),  # no search
        ([[other], [other]], 0.0),  # searched, found no gold
        ([[gold_a, other], [gold_a]], 0.5),  # one hop found (twice): half
        ([[gold_a], [other], [gold_b]], 1.0),  # both hops
    ):
        traj = scripted(documents, meta)
        assert component.score(context_from_trajectory(traj, decode)) == pytest.approx(want)
    # without supporting passages: a passage holding a golden answer is the one gold unit
    answer_only = {"golden_answers": ["Borvik"]}
    assert component.score(context_from_trajectory(scripted([[other]], answer_only), decode)) == 1.0
    assert component.score(context_from_trajectory(scripted([[gold_a]], answer_only), decode)) == 0.0


def test_gold_coverage_inside_the_composite_reward():
    """The demo's reward form: a weighted sum in which gold coverage adds 0.3 x the share of gold found."""
    from searchr1.rewards.composite import CompositeReward

    reward = CompositeReward(RewardConfig(components={"exact_match": 1.0, "gold_coverage": 0.3}))
    gold_a, gold_b, other = hit("7", "Quillon Press"), hit("9", "Alice Verdan"), hit("3", "Borvik")
    meta = {"supporting_ids": ["7", "9"], "golden_answers": ["q"]}  # the scripted answer is "q": EM 1
    wrong = {"supporting_ids": ["7", "9"], "golden_answers": ["Borvik"]}
    trajs = [scripted([[gold_a], [gold_b]], meta), scripted([[gold_a], [other]], meta), scripted([[other]], wrong)]
    outs = reward.score_trajectories(trajs, decode)
    assert [o.total for o in outs] == pytest.approx([1.3, 1.15, 0.0])
    assert [o.components["gold_coverage"] for o in outs] == pytest.approx([0.3, 0.15, 0.0])
    assert [o.raw["gold_coverage"] for o in outs] == pytest.approx([1.0, 0.5, 0.0])
    assert [o.components["exact_match"] for o in outs] == [1.0, 1.0, 0.0]
