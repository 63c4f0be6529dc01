"""Search-R1's outcome reward with its format and retrieval scores (the ``search_r1`` component)."""

from __future__ import annotations

import pytest

from searchr1.data.prompts import format_observation_docs, wrap_information
from searchr1.retrieval.base import Hit
from searchr1.rewards import RewardConfig, build_reward

FOUND = wrap_information(
    format_observation_docs([Hit("3", "Alice Verdan", "Alice Verdan was born in Borvik.", 1.0)])
)
OTHER = wrap_information(
    format_observation_docs([Hit("4", "Ivo Marsk", "Ivo Marsk was born in Tarnholm.", 1.0)])
)
SEARCH = "<think> search </think><search> Alice Verdan </search>"
S_F, S_A, S_R = 0.2, 0.1, 0.15


def score(response: str, **fields) -> float:
    cfg = RewardConfig(
        components={"search_r1": 1.0},
        structure_format_score=S_F,
        final_format_score=S_A,
        retrieval_score=S_R,
        **fields,
    )
    return build_reward(cfg).score_text(response, ["Borvik"]).total


@pytest.mark.parametrize(
    ("response", "expected", "case"),
    [
        (SEARCH + FOUND + "<think> found </think><answer> Borvik </answer>", 1.0, "right, valid"),
        (SEARCH + FOUND + "<answer> Borvik </answer>", 1.0 - S_F, "right, no think after the passage"),
        (
            SEARCH + FOUND + "<think> found </think><answer> Tarnholm </answer>",
            S_F + S_R,
            "wrong, valid, gold retrieved",
        ),
        (
            SEARCH + OTHER + "<think> found </think><answer> Tarnholm </answer>",
            S_F,
            "wrong, valid, gold not retrieved",
        ),
        (SEARCH + FOUND + "<answer> Tarnholm </answer>", S_A, "wrong, closed, invalid"),
        (SEARCH + FOUND + "<answer> Borvik", 0.0, "unclosed answer"),
        (SEARCH + FOUND + "I think it is Borvik.", 0.0, "no answer tag"),
    ],
)
def test_each_case_of_search_r1_reward(response: str, expected: float, case: str) -> None:
    assert score(response) == pytest.approx(expected), case


def test_zero_scores_make_it_plain_exact_match() -> None:
    plain = dict(structure_format_score=0.0, final_format_score=0.0, retrieval_score=0.0)
    cfg = RewardConfig(components={"search_r1": 1.0}, **plain)
    reward = build_reward(cfg)
    for response in (
        SEARCH + FOUND + "<answer> Borvik </answer>",
        SEARCH + FOUND + "<think> found </think><answer> Tarnholm </answer>",
        SEARCH + FOUND + "<answer> Tarnholm </answer>",
    ):
        em = build_reward({"exact_match": 1.0}).score_text(response, ["Borvik"]).total
        assert reward.score_text(response, ["Borvik"]).total == em


def test_an_answer_quoted_inside_a_passage_is_not_the_models() -> None:
    planted = wrap_information("Doc 1(Title: X) <answer> Borvik </answer>\n")
    assert score(SEARCH + planted + "<think> found </think>") == 0.0  # no answer of its own: invalid too


def test_f1_is_refused_and_scores_are_range_checked() -> None:
    with pytest.raises(ValueError, match="em or subem"):
        RewardConfig(components={"search_r1": 1.0}, answer_metric="f1").validate(None)
    with pytest.raises(ValueError, match=r"reward\.final_format_score"):
        RewardConfig(components={"search_r1": 1.0}, final_format_score=1.5).validate(None)
