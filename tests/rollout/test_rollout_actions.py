"""Tag parsing and turn stopping: the rules that decide what a turn asked for."""

from __future__ import annotations

import pytest

from searchr1.rollout.actions import StopDetector, parse_action, truncate_query


@pytest.mark.parametrize(
    ("text", "kind", "content"),
    [
        ("<think> hmm </think><search> capital of Tarnland </search>", "search", "capital of Tarnland"),
        ("<answer> Borvik </answer>", "answer", "Borvik"),
        # two actions in one turn: the first one to complete decides
        ("<search> a </search><answer> b </answer>", "search", "a"),
        ("<answer> b </answer> <search> a </search>", "answer", "b"),
        # an answer that completes inside an unfinished search: the answer completes first
        ("<search> x <answer> y </answer> </search>", "answer", "y"),
        # the last opening tag before the closing one pairs with it
        ("<search> draft <search> final </search>", "search", "final"),
        ("  <answer>\n multi\nline </answer>", "answer", "multi\nline"),
    ],
)
def test_first_completed_action_decides(text, kind, content):
    action = parse_action(text)
    assert (action.kind, action.content) == (kind, content)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("just thinking out loud", "no action"),
        ("<search> never closed", "unclosed tag"),
        ("<answer> never closed", "unclosed tag"),
        ("stray </search> then <answer> x </answer>", "closing tag without opening"),
        ("<search>   </search>", "empty query"),
        ("<search></search><answer> x </answer>", "empty query"),
    ],
)
def test_invalid_actions(text, reason):
    action = parse_action(text)
    assert action.kind == "invalid"
    assert action.reason == reason


def test_empty_answer_is_still_an_answer():
    assert parse_action("<answer></answer>").kind == "answer"


def test_long_query_truncated_at_word_boundary():
    query = "word " * 100
    cut, was_cut = truncate_query(query.strip(), 42)
    assert was_cut and len(cut) <= 42
    assert cut.endswith("word")
    short, was_cut = truncate_query("short query", 42)
    assert (short, was_cut) == ("short query", False)
    nospace, _ = truncate_query("x" * 100, 10)
    assert nospace == "x" * 10


def _feed(stop: StopDetector, ids: list[int]) -> int | None:
    """Index of the token at which the detector says the turn ended, or None."""
    turn: list[int] = []
    for i, t in enumerate(ids):
        turn.append(t)
        if stop.closes_action(turn):
            return i
    return None


def test_stop_on_tag_split_across_tokens(tiny):
    """Tags typed out of ordinary byte-level pieces (as real tokenizers see them) still stop the turn."""
    _, tok = tiny
    pieces = ["I will ", "<sea", "rch> Borvik ", "</", "sea", "rch", ">", " trailing"]
    ids: list[int] = []
    ends: list[int] = []
    for p in pieces:
        ids += tok.encode(p, add_special_tokens=False)
        ends.append(len(ids) - 1)
    # the pieces really are split: no single tag token in there
    assert tok.convert_tokens_to_ids("</search>") not in ids
    stop = StopDetector(tok, [tok.eos_token_id])
    assert _feed(stop, ids) == ends[6]  # exactly at the token that completes "</search>"
    assert parse_action(tok.decode(ids[: ends[6] + 1])).content == "Borvik"


def test_stop_on_single_token_tag_and_not_before(tiny):
    _, tok = tiny
    ids = tok.encode("<answer> Borvik </answer> more", add_special_tokens=False)
    close = tok.convert_tokens_to_ids("</answer>")
    stop = StopDetector(tok, [tok.eos_token_id])
    assert _feed(stop, ids) == ids.index(close)
    # an opening tag alone, or text with '>' but no closing tag, does not stop
    assert _feed(stop, tok.encode("<search> a > b", add_special_tokens=False)) is None
