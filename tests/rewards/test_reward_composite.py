"""The composite reward: each component, trajectories with roles, the seed example, user functions."""

from __future__ import annotations

import pytest
from tinymodel import train_tokenizer

from searchr1.config import load_config
from searchr1.data.prompts import SEARCH_R1_INSTRUCTION, format_observation_docs, wrap_information
from searchr1.retrieval.base import Hit
from searchr1.rewards import REWARD_COMPONENTS, RewardConfig, build_reward, context_from_text
from searchr1.rollout.types import Role, Trajectory

HITS = [Hit("3", "Alice Verdan", "Alice Verdan was born in Borvik in 1901.", 1.0)]
GOOD = (
    "<think>I must search.</think><search> Alice Verdan </search>"
    + wrap_information(format_observation_docs(HITS))
    + "<think>Found it.</think><answer> Borvik </answer>"
)
SEED = {"correct_answer": 10.0, "search_penalty": -0.1, "invalid_format": -5.0}


@pytest.fixture(scope="module")
def tok():
    texts = [SEARCH_R1_INSTRUCTION, GOOD, "Where was Alice Verdan born? Borvik Tarnland Marsk"] * 20
    return train_tokenizer(texts, vocab_size=400)


def _trajectory(tok, question: str, pieces: list[tuple[str, Role]], golden: list[str], docs=None):
    prompt_ids = tok.encode(SEARCH_R1_INSTRUCTION.format(question=question), add_special_tokens=False)
    ids, roles = [], []
    for text, role in pieces:
        piece = tok.encode(text, add_special_tokens=False)
        ids += piece
        roles += [int(role)] * len(piece)
    return Trajectory(
        prompt_ids=prompt_ids,
        response_ids=ids,
        roles=roles,
        logprobs=[0.0] * len(ids),
        searches=sum(text.count("<search>") for text, role in pieces if role == Role.GENERATED),
        documents=docs or [],
        meta={"question": question, "golden_answers": golden},
    )


def test_seed_example_configuration(tok):
    cfg = RewardConfig.from_simple(SEED)
    assert cfg.components == {"correct_answer": 10.0, "search_penalty": -0.1, "invalid_format": -5.0}
    reward = build_reward(cfg)
    good = reward.score_text(GOOD, ["Borvik"])
    assert good.total == pytest.approx(10.0 - 0.1)
    assert good.components == pytest.approx(
        {"correct_answer": 10.0, "search_penalty": -0.1, "invalid_format": 0.0}
    )
    assert sum(good.components.values()) == pytest.approx(good.total)
    wrong_and_broken = reward.score_text("Borvik <answer> Tarnland </answer>", ["Borvik"])
    assert wrong_and_broken.total == pytest.approx(-5.0)
    assert wrong_and_broken.raw == {"correct_answer": 0.0, "search_penalty": 0.0, "invalid_format": 1.0}


def test_from_trajectory_reads_the_answer_from_generated_tokens_only(tok):
    reward = build_reward(SEED)
    obs = wrap_information("Doc 1(Title: Alice Verdan) <answer> Tarnland </answer>\n")
    traj = _trajectory(
        tok,
        "Where was Alice Verdan born?",
        [
            ("<think>search</think><search> Alice Verdan </search>", Role.GENERATED),
            (obs, Role.OBSERVATION),
            ("<think>so</think>", Role.GENERATED),
        ],
        ["Tarnland"],
    )
    out = reward(traj, tok.decode)
    # the planted answer lives in an observation; the model never answered
    assert out.raw["correct_answer"] == 0.0
    assert out.raw["invalid_format"] == 1.0 and out.raw["search_penalty"] == 1.0

    answered = _trajectory(
        tok,
        "Where was Alice Verdan born?",
        [
            ("<think>search</think><search> Alice Verdan </search>", Role.GENERATED),
            (wrap_information(format_observation_docs(HITS)), Role.OBSERVATION),
            ("<think>so</think><answer> Borvik </answer>", Role.GENERATED),
        ],
        ["Borvik"],
    )
    out = reward.score_trajectories([answered], tok.decode)[0]
    assert out.total == pytest.approx(9.9) and out.raw["invalid_format"] == 0.0


@pytest.mark.parametrize(
    ("name", "response", "golden", "expected"),
    [
        ("exact_match", "<think>x</think><answer>Borvik</answer>", ["borvik"], 1.0),
        ("exact_match", "<think>x</think><answer>in Borvik</answer>", ["borvik"], 0.0),
        ("sub_exact_match", "<think>x</think><answer>in Borvik</answer>", ["borvik"], 1.0),
        ("f1", "<think>x</think><answer>Alice</answer>", ["Alice Verdan"], 2 / 3),
        ("format", GOOD, ["x"], 1.0),
        ("format", "<answer>x</answer>", ["x"], 0.0),
        ("invalid_format", "<answer>x</answer>", ["x"], 1.0),
        ("search_penalty", GOOD, ["x"], 1.0),
        ("retrieval", GOOD, ["Borvik"], 1.0),
        ("retrieval", GOOD, ["Tarnland"], 0.0),
        ("retrieval", GOOD, ["Bor"], 0.0),  # whole words only
    ],
)
def test_each_rule_component(name, response, golden, expected):
    out = build_reward({name: 2.0}).score_text(response, golden)
    assert out.raw[name] == pytest.approx(expected)
    assert out.total == pytest.approx(2.0 * expected)


def test_correct_answer_follows_the_answer_metric():
    response = "<think>x</think><answer>Alice</answer>"
    for metric, want in (("em", 0.0), ("subem", 0.0), ("f1", 2 / 3)):
        cfg = RewardConfig(components={"correct_answer": 1.0}, answer_metric=metric)
        assert build_reward(cfg).score_text(response, ["Alice Verdan"]).total == pytest.approx(want)


def test_search_budget_counts_searches_beyond_the_budget():
    reward = build_reward(
        RewardConfig(components={"search_budget": -1.0, "search_penalty": -0.1}, search_budget=2)
    )
    for searches, over in ((0, 0), (2, 0), (5, 3)):
        out = reward.score_text("<think>x</think><answer>a</answer>", ["a"], searches=searches)
        assert out.raw["search_budget"] == over
        assert out.total == pytest.approx(-over - 0.1 * searches)


def test_retrieval_reward_reads_trajectory_documents(tok):
    traj = _trajectory(
        tok,
        "q",
        [("<think>x</think><answer>a</answer>", Role.GENERATED)],
        ["Borvik"],
        docs=[[h.to_dict() for h in HITS]],
    )
    assert build_reward({"retrieval": 1.0})(traj, tok.decode).total == 1.0


def test_user_reward_function(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def short_answer(ctx):\n    return 1.0 if ctx.answer is not None and len(ctx.answer.split()) <= 2 else 0.0\n"
        "def not_a_number(ctx):\n    return 'high'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    reward = build_reward({"exact_match": 1.0, "my_rewards:short_answer": 0.5})
    out = reward.score_text("<think>x</think><answer>Borvik</answer>", ["Borvik"])
    assert out.components == {"exact_match": 1.0, "my_rewards:short_answer": 0.5}
    assert reward.score_text("<answer>a b c</answer>", ["x"]).total == 0.0
    with pytest.raises(ValueError, match="no function 'missing'"):
        build_reward({"my_rewards:missing": 1.0})
    with pytest.raises(ValueError, match="cannot import module"):
        build_reward({"no_such_module_xyz:f": 1.0})
    with pytest.raises(TypeError, match="not a number"):
        build_reward({"my_rewards:not_a_number": 1.0}).score_text("x", ["x"])


def test_config_errors_name_the_key():
    with pytest.raises(
        ValueError, match=r"reward\.components: unknown reward component 'exact_mach'; known: .*exact_match"
    ):
        load_config(overrides=["reward.components={exact_mach: 1.0}"])
    with pytest.raises(ValueError, match=r"reward\.answer_metric"):
        RewardConfig(answer_metric="bleu").validate(None)
    with pytest.raises(ValueError, match=r"reward\.judge_url"):
        RewardConfig(components={"llm_judge": 1.0}).validate(None)
    assert {
        "correct_answer",
        "format",
        "invalid_format",
        "search_penalty",
        "search_budget",
        "retrieval",
        "embedding_similarity",
        "llm_judge",
    } <= set(REWARD_COMPONENTS)


def test_context_from_text_counts_searches_in_own_text_only():
    ctx = context_from_text(GOOD.replace("</information>", "<search> x </search></information>"), ["a"])
    assert ctx.searches == 1
    assert "<information>" not in ctx.response
