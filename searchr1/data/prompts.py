"""Tags and prompt templates: the single place the rollout, the rewards and the data code read them from."""

from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (THINK_OPEN, THINK_CLOSE, SEARCH_OPEN, SEARCH_CLOSE, INFO_OPEN, INFO_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

# The Search-R1 instruction (v0.3), verbatim in wording.
SEARCH_R1_INSTRUCTION = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without "
    "detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

# Appended after a turn that neither searched nor answered (Search-R1's wording).
INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> "
    "and </search>. If I want to give the final answer, I should put the answer between <answer> and "
    "</answer>. Let me try again.\n"
)


def format_observation_docs(hits: list) -> str:
    """Search-R1's text of a list of hits: ``Doc {i}(Title: {title}) {text}`` one per line, from 1."""
    return "".join(f"Doc {i}(Title: {h.title}) {h.text}\n" for i, h in enumerate(hits, start=1))


def wrap_information(docs_text: str) -> str:
    """The observation block appended to the context after a search."""
    return f"\n\n{INFO_OPEN}{docs_text}{INFO_CLOSE}\n\n"
