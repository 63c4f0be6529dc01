"""The Search-R1 v0.3 structure checker."""

from __future__ import annotations

import pytest

from searchr1.data.prompts import INVALID_ACTION_MESSAGE, LAST_SEARCH_NOTICE
from searchr1.rewards import check_format, is_valid_format

INFO = "\n\n<information>Doc 1(Title: Alice Verdan) Alice Verdan was born in Borvik.\n</information>\n\n"


@pytest.mark.parametrize(
    "text",
    [
        "<think>easy</think><answer>Borvik</answer>",
        "<think>x</think>\n<search> Alice Verdan </search>"
        + INFO
        + "<think>found</think>\n<answer> Borvik </answer>",
        "<think>a</think><search>q1</search>"
        + INFO
        + "<think>b</think><search>q2</search>"
        + INFO
        + "<think>c</think><answer>B</answer><|im_end|>",
        "  <think>x</think>  <answer></answer>\n<|endoftext|>",
        # a retrieved document quoting a tag does not break the structure
        "<think>x</think><search>q</search><information>see <answer> here</information><think>y</think><answer>z</answer>",
    ],
)
def test_valid_structures(text):
    assert check_format(text).valid, check_format(text).reason


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("<answer>Borvik</answer>", "unexpected <answer>"),  # no think first
        ("<think>x</think>Borvik<answer>Borvik</answer>", "text outside tags"),
        ("<think>x</think><answer>Borvik</answer> trailing", "text outside tags"),
        ("<think>x</think><search>q</search><think>y</think><answer>a</answer>", "unexpected <think>"),
        ("<think>x</think><search>q</search>" + INFO + "<answer>a</answer>", "unexpected <answer>"),
        ("<think>x<think>y</think></think><answer>a</answer>", "unexpected <think>"),
        ("<think>x</think><answer>a", "unbalanced <answer>"),
        ("<think>x</think>", "no closed <answer>"),
        ("<think>x</think>" + INVALID_ACTION_MESSAGE + "<think>y</think><answer>a</answer>", "text outside"),
        ("", "no closed <answer>"),
    ],
)
def test_invalid_structures_name_the_problem(text, why):
    result = check_format(text)
    assert not result.valid and not is_valid_format(text)
    assert why in result.reason


def test_the_last_search_notice_after_an_observation_is_part_of_it():
    """The rollout writes the notice right after the last observation it allows; a two-search answer
    that carries it is valid (it was scored invalid, and its reward cut by the structure score, before)."""
    two_searches = (
        "<think>a</think>\n<search> Ulmera Press </search>"
        + INFO
        + "<think>b</think>\n<search> Edda Ostin </search>"
        + INFO
        + LAST_SEARCH_NOTICE
        + "<think>c</think>\n<answer> 1838 </answer><|im_end|>"
    )
    assert check_format(two_searches).valid, check_format(two_searches).reason
    # the same words written by the model outside the tags are still text outside tags
    written = "<think>a</think>" + LAST_SEARCH_NOTICE + "<answer>x</answer>"
    assert "text outside tags" in check_format(written).reason
    # and the notice does not excuse other text after the observation
    extra = "<think>a</think><search>q</search>" + INFO + LAST_SEARCH_NOTICE + "and more<think>c</think><answer>x</answer>"
    assert "text outside tags" in check_format(extra).reason
