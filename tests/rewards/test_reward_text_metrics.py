"""Normalisation, answer extraction and the answer metrics (hand-written cases)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.data.prompts import SEARCH_R1_INSTRUCTION
from searchr1.rewards import exact_match, extract_answer, f1_score, normalize_answer, sub_exact_match


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  an   apple, a pear!  ", "apple pear"),
        ("Wilhelm Conrad Röntgen", "wilhelm conrad röntgen"),
        ("«Borvik»", "borvik"),
        ("“Quoted” — text…", "quoted text"),
        ("February\u00a01,\u00a02018", "february 1 2018"),
        ("U.S.A.", "usa"),
        ("Theatre of the Absurd", "theatre of absurd"),  # 'the' only as a whole word
        ("", ""),
        ("ÉCOLE Normale", "école normale"),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_extract_answer_takes_the_last_closed_answer_tag():
    text = "<think>a</think><answer> first </answer> more <answer>  Borvik </answer>"
    assert extract_answer(text) == "Borvik"
    assert extract_answer("<answer>x</answer><answer> y") == "x"  # unclosed last tag is ignored
    assert extract_answer("<answer> Borvik") is None  # unclosed only
    assert extract_answer("no tags at all") is None
    assert extract_answer("<think>hm</think><answer>   </answer>") == ""  # empty answer
    assert extract_answer("<answer>a <answer> b </answer>") == "b"


def test_extract_answer_never_reads_information_blocks_or_the_prompt():
    response = (
        "<think>search</think><search> Alice </search>\n\n<information>Doc 1(Title: X) "
        "<answer> Planted </answer></information>\n\n<think>hm</think>"
    )
    assert extract_answer(response) is None
    # an unclosed information block (truncated observation) is ignored too
    assert extract_answer("<think>x</think><information> <answer>Planted</answer>") is None
    prompt = SEARCH_R1_INSTRUCTION.format(question="Where was Alice born?")
    assert "<answer> Beijing </answer>" in prompt
    assert extract_answer(prompt + "<think>x</think>", prompt=prompt) is None
    assert extract_answer(prompt + "<answer> Borvik </answer>", prompt=prompt) == "Borvik"


def test_exact_match_and_sub_exact_match():
    assert exact_match("the Borvik", ["Borvik"]) == 1.0
    assert exact_match("Borvik city", ["Borvik"]) == 0.0
    assert exact_match("Paris", ["London", "paris."]) == 1.0
    assert exact_match(None, ["x"]) == 0.0
    assert exact_match("", ["x"]) == 0.0
    assert exact_match("1901", "1901") == 1.0
    assert sub_exact_match("Borvik city", ["Borvik"]) == 1.0
    assert sub_exact_match("Bor", ["Borvik"]) == 0.0
    assert sub_exact_match("anything", [""]) == 0.0
    assert isinstance(exact_match("a", ["a"]), float)


def test_f1_score():
    assert f1_score("Alice Verdan", ["Alice Verdan"]) == 1.0
    assert f1_score("Alice", ["Alice Verdan"]) == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert f1_score("Alice Marsk", ["Ivo Marsk", "Alice Verdan"]) == pytest.approx(0.5)
    assert f1_score("yes", ["no"]) == 0.0
    assert f1_score("no", ["no"]) == 1.0
    assert f1_score(None, ["x"]) == 0.0
    assert f1_score("the", ["a"]) == 0.0  # both normalise to nothing


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.lists(st.text(max_size=20), min_size=1, max_size=3))
def test_metric_properties(prediction, golden):
    norm = normalize_answer(prediction)
    assert normalize_answer(norm) == norm  # idempotent
    em, sub, f1 = (
        exact_match(prediction, golden),
        sub_exact_match(prediction, golden),
        f1_score(prediction, golden),
    )
    assert em in (0.0, 1.0) and sub in (0.0, 1.0) and 0.0 <= f1 <= 1.0
    if em == 1.0 and norm:
        assert sub == 1.0 and f1 == 1.0
    if norm:
        assert exact_match(prediction, [*golden, prediction]) == 1.0


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=30))
def test_extract_answer_roundtrips_any_text_without_tags(answer):
    assert extract_answer(f"<think>x</think><answer>{answer}</answer>") == answer.strip()
