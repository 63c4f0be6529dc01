"""Normalisation, answer extraction and the answer metrics (hand-written cases)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.data.prompts import INVALID_ACTION_MESSAGE, SEARCH_R1_INSTRUCTION
from searchr1.rewards import (
    answer_from_spans,
    exact_match,
    extract_answer,
    f1_score,
    normalize_answer,
    normalize_answer_unicode,
    read_answer,
    sub_exact_match,
)


@pytest.mark.parametrize(
    ("raw", "squad", "unicode"),
    [
        ("The Eiffel Tower", "eiffel tower", "eiffel tower"),
        ("  an   apple, a pear!  ", "apple pear", "apple pear"),
        ("Wilhelm Conrad Röntgen", "wilhelm conrad röntgen", "wilhelm conrad röntgen"),
        ("«Borvik»", "«borvik»", "borvik"),  # the paper's scorer keeps non-ASCII punctuation
        ("“Quoted” — text…", "“quoted” — text…", "quoted text"),
        ("February\u00a01,\u00a02018", "february 1 2018", "february 1 2018"),
        ("U.S.A.", "usa", "usa"),
        ("Theatre of the Absurd", "theatre of absurd", "theatre of absurd"),  # 'the' only as a word
        ("", "", ""),
        ("ÉCOLE Normale", "école normale", "école normale"),
        ("l'the", "lthe", "lthe"),  # punctuation goes first, then the articles
    ],
)
def test_normalize_answer_and_its_unicode_variant(raw, squad, unicode):
    assert normalize_answer(raw) == squad
    assert normalize_answer_unicode(raw) == unicode


def test_the_unicode_variant_is_a_named_option_of_every_metric():
    pred, gold = "“Borvik”", ["Borvik"]
    assert exact_match(pred, gold) == 0.0 and exact_match(pred, gold, "unicode") == 1.0
    assert sub_exact_match("Bor—vik", gold) == 0.0 and sub_exact_match("Bor—vik", gold, "unicode") == 1.0
    assert f1_score(pred, gold) == 0.0 and f1_score(pred, gold, "unicode") == 1.0
    with pytest.raises(ValueError, match="normalization: expected one of squad, unicode, got 'ascii'"):
        exact_match(pred, gold, "ascii")


def test_extract_answer_takes_the_last_closed_answer_tag():
    text = "<think>a</think><answer> first </answer> more <answer>  Borvik </answer>"
    assert extract_answer(text) == "Borvik"
    assert extract_answer("<answer>x</answer><answer> y") == "x"  # unclosed last tag is ignored
    assert extract_answer("<answer> Borvik") is None  # unclosed only
    assert extract_answer("no tags at all") is None
    assert extract_answer("<think>hm</think><answer>   </answer>") == ""  # empty answer
    assert extract_answer("<answer>a <answer> b </answer>") == "b"


def test_extract_answer_never_reads_the_invalid_action_message():
    # the message says "... put the answer between <answer> and </answer> ...": not the model's answer
    assert "<answer> and </answer>" in INVALID_ACTION_MESSAGE
    assert extract_answer("I think it is Borvik." + INVALID_ACTION_MESSAGE) is None
    own = "no tags" + INVALID_ACTION_MESSAGE + "<think>ok</think><answer> Borvik </answer>"
    assert extract_answer(own) == "Borvik"


def test_answers_are_read_inside_one_span_of_model_text():
    assert answer_from_spans(["<answer> a </answer>", "<think>x</think>"]) == "a"
    assert answer_from_spans(["<answer> a </answer>", "<answer> b </answer>"]) == "b"
    # a tag pair cut by an insertion of the environment is no answer
    assert answer_from_spans(["<answer> Bor", "vik </answer>"]) is None
    assert answer_from_spans([]) is None
    assert read_answer(["<think>x</think><answer> y </answer>"], fallback_to_reply=True) == ("y", "tag")
    assert read_answer(["<think>hm</think> It is  Paris.<|im_end|>"], fallback_to_reply=True) == (
        "It is Paris.<|im_end|>",
        "reply",
    )
    assert read_answer(["It is Paris."]) == (None, "none")


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
    # Search-R1's subem_check: a golden answer that normalises to "" is inside every prediction
    assert sub_exact_match("anything", [""]) == 1.0 and sub_exact_match("anything", ["The"]) == 1.0
    assert sub_exact_match(None, [""]) == 0.0
    assert isinstance(exact_match("a", ["a"]), float)


def test_f1_score():
    assert f1_score("Alice Verdan", ["Alice Verdan"]) == 1.0
    assert f1_score("Alice", ["Alice Verdan"]) == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert f1_score("Alice Marsk", ["Ivo Marsk", "Alice Verdan"]) == pytest.approx(0.5)
    assert f1_score("yes", ["no"]) == 0.0
    assert f1_score("no", ["no"]) == 1.0
    assert f1_score("yes it is", ["yes"]) == pytest.approx(0.5)  # SQuAD's F1: no yes/no special case
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
    if em == 1.0:
        assert sub == 1.0
    if em == 1.0 and norm:
        assert f1 == 1.0
    if norm:
        assert exact_match(prediction, [*golden, prediction]) == 1.0


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=30))
def test_extract_answer_roundtrips_any_text_without_tags(answer):
    assert extract_answer(f"<think>x</think><answer>{answer}</answer>") == answer.strip()
