"""The Search-R1 v0.3 structure checker."""

from __future__ import annotations

import pytest

from searchr1.data.prompts import INVALID_ACTION_MESSAGE
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
