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

# Appended after the observation that used the last search (``rollout.last_search_notice``): the next
# turn is the answer-only one, and the model is told so where it decides.
LAST_SEARCH_NOTICE = "(No searches left: I must answer now.)\n"


def format_observation_docs(hits: list) -> str:
    """Search-R1's text of a list of hits: ``Doc {i}(Title: {title}) {text}`` one per line, from 1."""
    return "".join(f"Doc {i}(Title: {h.title}) {h.text}\n" for i, h in enumerate(hits, start=1))


def wrap_information(docs_text: str) -> str:
    """The observation block appended to the context after a search."""
    return f"\n\n{INFO_OPEN}{docs_text}{INFO_CLOSE}\n\n"


# ---------------------------------------------------------------------------------------------
# prompt building
# ---------------------------------------------------------------------------------------------

TEMPLATES = ("base", "instruct", "instruct_1shot", "instruct_2shot", "instruct_2hop")
"""Built-in template names; any other value is a path: a ``.json`` / ``.yaml`` list of chat messages
or a text file, either with a ``{question}`` slot."""
CHAT_TEMPLATES = ("instruct", "instruct_1shot", "instruct_2shot", "instruct_2hop")
"""Built-in templates rendered through the tokenizer's chat template (so are message files)."""

SEARCH_R1_SYSTEM = SEARCH_R1_INSTRUCTION.split(" Question: {question}")[0]
"""The Search-R1 instruction without its question: the system message of ``instruct_1shot``."""

EXAMPLE_QUESTION = "Where was Pim Aldera born?"
EXAMPLE_TRAJECTORY = (
    f"{THINK_OPEN} I do not know Pim Aldera. I should search. {THINK_CLOSE}\n"
    f"{SEARCH_OPEN} Pim Aldera {SEARCH_CLOSE}"
    + wrap_information("Doc 1(Title: Pim Aldera) Pim Aldera was born in Tarsk in 1820.\n")
    + f"{THINK_OPEN} The document says Pim Aldera was born in Tarsk. {THINK_CLOSE}\n"
    f"{ANSWER_OPEN} Tarsk {ANSWER_CLOSE}"
)
"""The one worked example of ``instruct_1shot``, written as the rollout writes a trajectory. Its person
and city cannot occur in a synthetic world (invented words there start with a consonant and end
with one of a few codas)."""

ONE_SHOT_MESSAGES = [
    {"role": "system", "content": SEARCH_R1_SYSTEM},
    {"role": "user", "content": EXAMPLE_QUESTION},
    {"role": "assistant", "content": EXAMPLE_TRAJECTORY},
    {"role": "user", "content": "{question}"},
]
"""``instruct_1shot``: the instruction as the system message, one worked example as a user / assistant
exchange, then the question."""


TWO_HOP_QUESTION = "When was the founder of Ulmera Press born?"
TWO_HOP_TRAJECTORY = (
    f"{THINK_OPEN} I do not know who founded Ulmera Press. I should search. {THINK_CLOSE}\n"
    f"{SEARCH_OPEN} Ulmera Press {SEARCH_CLOSE}"
    + wrap_information(
        "Doc 1(Title: Ulmera Press) Ulmera Press is a publisher based in Orvale. "
        "Ulmera Press was founded in 1871 by Edda Ostin.\n"
    )
    + f"{THINK_OPEN} Ulmera Press was founded by Edda Ostin. I should search Edda Ostin. {THINK_CLOSE}\n"
    f"{SEARCH_OPEN} Edda Ostin {SEARCH_CLOSE}"
    + wrap_information(
        "Doc 1(Title: Edda Ostin) Edda Ostin was a poet. Edda Ostin was born in Orvale in 1838.\n"
    )
    + f"{THINK_OPEN} The document says Edda Ostin was born in 1838. {THINK_CLOSE}\n"
    f"{ANSWER_OPEN} 1838 {ANSWER_CLOSE}"
)
"""The second worked example of ``instruct_2shot``: a two-hop question answered with two searches, the
second for the name the first passage gave, and a year as the answer. No synthetic world can contain
its names (they start with a vowel, or are not among the world's first names)."""

TWO_SHOT_MESSAGES = [
    *ONE_SHOT_MESSAGES[:3],
    {"role": "user", "content": TWO_HOP_QUESTION},
    {"role": "assistant", "content": TWO_HOP_TRAJECTORY},
    {"role": "user", "content": "{question}"},
]
"""``instruct_2shot``: the instruction as the system message, a one-search example and a two-search
example as user / assistant exchanges, then the question."""

BRIDGE_QUESTION = "Where was the author of The Ilka Lantern born?"
BRIDGE_TRAJECTORY = (
    f"{THINK_OPEN} I do not know who wrote The Ilka Lantern. I should search. {THINK_CLOSE}\n"
    f"{SEARCH_OPEN} The Ilka Lantern {SEARCH_CLOSE}"
    + wrap_information(
        "Doc 1(Title: The Ilka Lantern) The Ilka Lantern is a novel written by Pim Aldera. "
        "The Ilka Lantern was first published in 1874.\n"
    )
    + f"{THINK_OPEN} The Ilka Lantern was written by Pim Aldera. I should search Pim Aldera. {THINK_CLOSE}\n"
    f"{SEARCH_OPEN} Pim Aldera {SEARCH_CLOSE}"
    + wrap_information(
        "Doc 1(Title: Pim Aldera) Pim Aldera was a sculptor. Pim Aldera was born in Tarsk in 1820.\n"
    )
    + f"{THINK_OPEN} The document says Pim Aldera was born in Tarsk. {THINK_CLOSE}\n"
    f"{ANSWER_OPEN} Tarsk {ANSWER_CLOSE}"
)
"""The first worked example of ``instruct_2hop``: a book's author, then where the author was born (a city
as the answer, where ``TWO_HOP_TRAJECTORY`` answers a year). No world can contain its names."""

TWO_HOP_MESSAGES = [
    {"role": "system", "content": SEARCH_R1_SYSTEM},
    {"role": "user", "content": BRIDGE_QUESTION},
    {"role": "assistant", "content": BRIDGE_TRAJECTORY},
    {"role": "user", "content": TWO_HOP_QUESTION},
    {"role": "assistant", "content": TWO_HOP_TRAJECTORY},
    {"role": "user", "content": "{question}"},
]
"""``instruct_2hop``: the instruction as the system message and two two-search examples (the second
search for the name the first passage gave), then the question. The demo's prompt: with only a one-search
example in the prompt, RL settled on one search per question and multi-hop questions stayed unanswered."""


def normalize_question(question: str) -> str:
    """Strip white space and end with a question mark, as Search-R1's data preparation does."""
    q = question.strip()
    if q and not q.endswith("?"):
        q += "?"
    return q


def load_template(template: str) -> str | list[dict[str, str]]:
    """A template's text, or its chat messages, for a built-in name or a file; it must have ``{question}``."""
    import json
    from pathlib import Path

    if template == AUTO:
        raise ValueError(
            "template auto is chosen with the tokenizer: resolve_template(template, tokenizer) first"
        )
    if template == "instruct_1shot":
        return [dict(m) for m in ONE_SHOT_MESSAGES]
    if template == "instruct_2shot":
        return [dict(m) for m in TWO_SHOT_MESSAGES]
    if template == "instruct_2hop":
        return [dict(m) for m in TWO_HOP_MESSAGES]
    if template in TEMPLATES:
        return SEARCH_R1_INSTRUCTION
    path = Path(template)
    if not path.is_file():
        raise ValueError(
            f"prompt template {template!r} is neither one of {', '.join(TEMPLATES)} nor an existing file"
        )
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".json", ".yaml", ".yml"):
        import yaml

        try:
            messages = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise ValueError(f"prompt template file {path}: not valid {path.suffix[1:]}: {exc}") from None
        if not (
            isinstance(messages, list)
            and messages
            and all(isinstance(m, dict) and set(m) == {"role", "content"} for m in messages)
        ):
            raise ValueError(
                f"prompt template file {path}: expected a list of chat messages "
                '[{"role": ..., "content": ...}, ...]'
            )
        if not any("{question}" in str(m["content"]) for m in messages):
            raise ValueError(f"prompt template file {path} has no {{question}} slot")
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
    if "{question}" not in text:
        raise ValueError(f"prompt template file {path} has no {{question}} slot")
    return text


AUTO = "auto"
"""``data.template`` / ``--template`` default: the model's chat template if it has one, else plain text."""


def resolve_template(template: str, tokenizer: object) -> str:
    """``auto``: ``instruct`` (Search-R1's instruction through the chat template) when ``tokenizer`` has
    a chat template, ``base`` (plain text) otherwise; any other template as given."""
    if template != AUTO:
        return template
    return "instruct" if getattr(tokenizer, "chat_template", None) else "base"


def describe_template(asked: str, chosen: str) -> str:
    """What a command prints about its prompt: ``instruct (auto: the model has a chat template)``."""
    if asked != AUTO:
        return chosen
    why = "the model has a chat template" if chosen == "instruct" else "the model has no chat template"
    return f"{chosen} (auto: {why})"


def is_chat_template(template: str) -> bool:
    """Whether ``template`` is rendered through the tokenizer's chat template."""
    return template in CHAT_TEMPLATES or template.endswith((".json", ".yaml", ".yml"))


def fill_template(template_text: str, question: str) -> str:
    """Put the question into the ``{question}`` slot (other braces in the template stay as they are)."""
    return template_text.replace("{question}", normalize_question(question))


def prompt_messages(question: str, template: str = "base") -> list[dict[str, str]]:
    """The chat messages of ``question`` (the form stored in the training parquet): one user message
    with the filled template, or the template's own messages with the question filled in."""
    loaded = load_template(template)
    if isinstance(loaded, list):
        return [{**m, "content": fill_template(m["content"], question)} for m in loaded]
    return [{"role": "user", "content": fill_template(loaded, question)}]


def template_messages(template: str = "base") -> list[dict[str, str]]:
    """The chat messages of ``template`` with its ``{question}`` slot still open (what a prompt file holds):
    ``prompt_messages`` of a question would end the slot with a question mark (``{question}?``) and every
    question read back from such a file would end in two."""
    loaded = load_template(template)
    if isinstance(loaded, list):
        return loaded
    return [{"role": "user", "content": loaded}]


def render_messages(messages: list[dict[str, str]], template: str = "base", tokenizer: object = None) -> str:
    """The prompt string for already built messages: the tokenizer's chat template (with the
    generation prompt) for chat templates (``is_chat_template``), else the joined contents."""
    if is_chat_template(template):
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"template {template!r} needs a tokenizer with a chat template")
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)  # type: ignore[attr-defined]
    return "".join(m["content"] for m in messages)


def build_prompt(question: str, template: str = "base", tokenizer: object = None) -> str:
    """The text the policy continues for ``question``.

    ``auto``: ``instruct`` when ``tokenizer`` has a chat template, else ``base`` (``resolve_template``).
    ``base``: the Search-R1 instruction with the question (plain text, for base models).
    ``instruct``: the same instruction as a user message through ``tokenizer``'s chat template.
    ``instruct_1shot``: ``ONE_SHOT_MESSAGES`` through the chat template.
    ``instruct_2shot``: ``TWO_SHOT_MESSAGES`` (adds a two-search example) through the chat template.
    ``instruct_2hop``: ``TWO_HOP_MESSAGES`` (two two-search examples) through the chat template.
    A path: a ``.json`` / ``.yaml`` list of chat messages (through the chat template) or a text file,
    with a ``{question}`` slot.
    """
    template = resolve_template(template, tokenizer)
    return render_messages(prompt_messages(question, template), template, tokenizer)
