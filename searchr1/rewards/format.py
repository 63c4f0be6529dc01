"""The Search-R1 (v0.3) structure checker, independent of any chat template.

A valid response is

    <think> ... </think> ( <search> ... </search> <information> ... </information> <think> ... </think> )* <answer> ... </answer>

with every tag balanced and nothing but white space outside the tags. Chat-template markers such
as ``<|im_end|>`` / ``<|endoftext|>`` / ``</s>`` are ignored, so the same check works for base and instruct
models. A response carrying the rollout's invalid-action message is invalid (text outside tags). The
last-search notice the rollout writes right after an observation (``rollout.last_search_notice``) is part of
that observation, not text of the model's: it does not make a response invalid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from searchr1.data.prompts import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    INFO_CLOSE,
    INFO_OPEN,
    LAST_SEARCH_NOTICE,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    TAGS,
    THINK_CLOSE,
    THINK_OPEN,
)

_SPECIAL_MARKER = re.compile(r"<\|[^|<>]{1,40}\|>|</s>|<eos>|<pad>")
_INFO_CONTENT = re.compile(re.escape(INFO_OPEN) + r".*?" + re.escape(INFO_CLOSE), flags=re.DOTALL)
_NOTICE_AFTER_INFO = re.compile(re.escape(INFO_CLOSE) + r"(\s*)" + re.escape(LAST_SEARCH_NOTICE.strip()))
_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in TAGS) + ")")

# state -> {tag: next state}. States named "in_*" accept any text; the others only white space.
_TRANSITIONS: dict[str, dict[str, str]] = {
    "start": {THINK_OPEN: "in_think"},
    "in_think": {THINK_CLOSE: "after_think"},
    "after_think": {SEARCH_OPEN: "in_search", ANSWER_OPEN: "in_answer"},
    "in_search": {SEARCH_CLOSE: "after_search"},
    "after_search": {INFO_OPEN: "in_information"},
    "in_information": {INFO_CLOSE: "after_information"},
    "after_information": {THINK_OPEN: "in_think"},
    "in_answer": {ANSWER_CLOSE: "end"},
    "end": {},
}


@dataclass(frozen=True)
class FormatResult:
    """Whether a response follows the structure, and if not, the first problem found."""

    valid: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.valid


def check_format(response: str) -> FormatResult:
    """Check ``response`` (the text after the prompt, observations included) against the structure."""
    text = _SPECIAL_MARKER.sub("", response)
    # Retrieved text is opaque: a document that quotes a tag does not break the structure.
    text = _INFO_CONTENT.sub(INFO_OPEN + INFO_CLOSE, text)
    text = _NOTICE_AFTER_INFO.sub(INFO_CLOSE + r"\1", text)
    for open_tag, close_tag in zip(TAGS[::2], TAGS[1::2], strict=True):
        if text.count(open_tag) != text.count(close_tag):
            return FormatResult(
                False, f"unbalanced {open_tag}: {text.count(open_tag)} opened, {text.count(close_tag)} closed"
            )
    state = "start"
    for part in _SPLIT.split(text):
        if not part:
            continue
        if part in TAGS:
            nxt = _TRANSITIONS[state].get(part)
            if nxt is None:
                return FormatResult(False, f"unexpected {part} in state {state}")
            state = nxt
        elif not state.startswith("in_") and part.strip():
            return FormatResult(False, f"text outside tags in state {state}: {part.strip()[:40]!r}")
    if state != "end":
        return FormatResult(False, f"response ends in state {state} (no closed <answer>)")
    return FormatResult(True)


def is_valid_format(response: str) -> bool:
    """``check_format(response).valid``."""
    return check_format(response).valid
