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


# ---------------------------------------------------------------------------------------------
# prompt building
# ---------------------------------------------------------------------------------------------

TEMPLATES = ("base", "instruct")
"""Built-in template names; any other value is a path to a text file with a ``{question}`` slot."""


def normalize_question(question: str) -> str:
    """Strip white space and end with a question mark, as Search-R1's data preparation does."""
    q = question.strip()
    if q and not q.endswith("?"):
        q += "?"
    return q


def load_template(template: str) -> str:
    """The template text for a built-in name or a file path; it must contain ``{question}``."""
    from pathlib import Path

    if template in TEMPLATES:
        return SEARCH_R1_INSTRUCTION
    path = Path(template)
    if not path.is_file():
        raise ValueError(
            f"prompt template {template!r} is neither one of {', '.join(TEMPLATES)} nor an existing file"
        )
    text = path.read_text(encoding="utf-8")
    if "{question}" not in text:
        raise ValueError(f"prompt template file {path} has no {{question}} slot")
    return text


def fill_template(template_text: str, question: str) -> str:
    """Put the question into the ``{question}`` slot (other braces in the template stay as they are)."""
    return template_text.replace("{question}", normalize_question(question))


def prompt_messages(question: str, template: str = "base") -> list[dict[str, str]]:
    """The chat-message form stored in the training parquet: one user message with the filled template."""
    return [{"role": "user", "content": fill_template(load_template(template), question)}]


def render_messages(messages: list[dict[str, str]], template: str = "base", tokenizer: object = None) -> str:
    """The prompt string for already built messages: joined contents for ``base`` or a user
    template, the tokenizer's chat template (with the generation prompt) for ``instruct``."""
    if template == "instruct":
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError("template 'instruct' needs a tokenizer with a chat template")
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)  # type: ignore[attr-defined]
    return "".join(m["content"] for m in messages)


def build_prompt(question: str, template: str = "base", tokenizer: object = None) -> str:
    """The text the policy continues for ``question``.

    ``base``: the Search-R1 instruction with the question (plain text, for base models).
    ``instruct``: the same instruction as a user message through ``tokenizer``'s chat template.
    Anything else: a path to a template file whose ``{question}`` slot receives the question.
    """
    return render_messages(prompt_messages(question, template), template, tokenizer)
