"""The evaluation modes: the rows of the paper's Table 2 that one model and one search backend give.

=========  =================================================  ===========================  ======================
mode       prompt                                             search                       answer scored
=========  =================================================  ===========================  ======================
direct     FlashRAG's zero-shot prompt (a short answer)       none                         ``<answer>`` tag, else the reply
cot        Search-R1's instruction without the search part    none                         ``<answer>`` tag, else the reply
rag        FlashRAG's standard-RAG prompt with the top-k      one, with the question        ``<answer>`` tag, else the reply
           passages retrieved for the question
agent      Search-R1's instruction                            as often as the model asks    ``<answer>`` tag only
=========  =================================================  ===========================  ======================

The baselines ask for what an off-the-shelf model can give (a short answer, or reasoning then an
answer) and score what it wrote, as FlashRAG and the paper's baselines do; whether the reply also
followed Search-R1's tag format is reported apart (``valid_format``, ``tagged``). Only the agent is
held to the tags: its answer is what the RL reward reads.

Prompt sources: ``direct`` is FlashRAG's zero-shot template ("Answer the question based on your own
knowledge. Only give me the answer and do not output any other words." / "Question: {question}"),
``rag`` FlashRAG's default ``PromptTemplate`` (the same instruction for "the given document", then
the passages as ``Doc i(Title: t) text``, Search-R1's observation format too); both go in as a
system and a user message through the chat template, or joined by a blank line for plain-text
templates (``base``), followed there by ``Answer:`` so that a base model writes the answer next.
``cot`` is Search-R1's instruction with its search sentences removed: reason inside ``<think>``,
then answer inside ``<answer>``. ``agent`` is the template the model was trained with.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from searchr1.data.prompts import (
    build_prompt,
    format_observation_docs,
    is_chat_template,
    normalize_question,
    render_messages,
)
from searchr1.evaluation.errors import EvaluationError


@dataclass(frozen=True)
class Mode:
    """How one row of the comparison is produced."""

    name: str
    label: str
    """The row name in the paper's table."""
    search: str
    """none | once (the evaluation retrieves for the question) | agent (the model decides)."""
    reply_fallback: bool
    """Score the reply itself when it has no ``<answer>`` tag (the baselines), else no answer."""
    help: str


MODES: dict[str, Mode] = {
    m.name: m
    for m in (
        Mode("direct", "Direct", "none", True, "answer from the model's own knowledge, no search"),
        Mode("cot", "CoT", "none", True, "reason inside <think>, then answer; no search"),
        Mode("rag", "RAG", "once", True, "retrieve the top-k passages for the question once, then answer"),
        Mode("agent", "Search-R1", "agent", False, "the Search-R1 loop: reason, search as needed, answer"),
    )
}
"""The modes in the paper's row order (Direct, CoT, RAG, then the trained agent)."""


def parse_modes(spec: str | Iterable[str]) -> list[Mode]:
    """Modes from ``"direct,rag,agent"`` (or a list of names), in the paper's row order, without
    repeats; an unknown name is a one-line error naming it and the known ones."""
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise EvaluationError(f"--mode: no mode given; expected some of {', '.join(MODES)}")
    for n in names:
        if n not in MODES:
            raise EvaluationError(f"--mode {n}: unknown mode; expected one of {', '.join(MODES)}")
    return [m for name, m in MODES.items() if name in names]


def get_mode(name: str) -> Mode:
    return parse_modes([name])[0]


# ---------------------------------------------------------------------------------------------
# the questions
# ---------------------------------------------------------------------------------------------


def _field(sample: Any, name: str, default: Any = None) -> Any:
    if isinstance(sample, dict):
        return sample.get(name, default)
    return getattr(sample, name, default)


def sample_view(sample: Any, index: int) -> dict[str, Any]:
    """The fields the evaluation reads from a ``Sample`` (or a FlashRAG-style dict): index, id,
    question, golden_answers, data_source. A sample without golden answers is an error naming it."""
    golden = _field(sample, "golden_answers")
    sid = _field(sample, "id")
    name = f"sample {index}" + (f" (id {sid})" if sid is not None else "")
    if isinstance(golden, str):
        golden = [golden]
    if not golden:
        raise EvaluationError(f"{name}: no golden_answers (every question needs at least one)")
    metadata = _field(sample, "metadata") or {}
    source = _field(sample, "data_source") or (metadata.get("data_source") if metadata else None)
    question = str(_field(sample, "question", "") or "")
    if not question.strip():
        raise EvaluationError(f"{name}: empty question")
    return {
        "index": index,
        "id": str(sid) if sid is not None else str(index),
        "question": question,
        "golden_answers": [str(g) for g in golden],
        "data_source": str(source or "unknown"),
    }


# ---------------------------------------------------------------------------------------------
# the prompts
# ---------------------------------------------------------------------------------------------

DIRECT_SYSTEM = (
    "Answer the question based on your own knowledge. "
    "Only give me the answer and do not output any other words."
)
RAG_SYSTEM = (
    "Answer the question based on the given document. "
    "Only give me the answer and do not output any other words.\n"
    "The following are given documents.\n\n{reference}"
)
BASELINE_USER = "Question: {question}"
COT_INSTRUCTION = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first. "
    "Then provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)


def _render(messages: list[dict[str, str]], template: str, tokenizer: Any, answer_cue: bool) -> str:
    """Chat messages through the tokenizer's chat template, or their contents joined by a blank line
    for plain templates (then ``Answer:`` follows when ``answer_cue``). A chat template that rejects
    a system message gets it as the start of the user message."""
    if not is_chat_template(template):
        text = "\n\n".join(m["content"] for m in messages)
        return text + "\nAnswer:" if answer_cue else text
    try:
        return render_messages(messages, "instruct", tokenizer)
    except ValueError:  # no chat template at all: render_messages says so
        raise
    except Exception:  # the template's own error (e.g. jinja's "System role not supported")
        if messages[0]["role"] != "system":
            raise
        merged = {"role": "user", "content": messages[0]["content"] + "\n\n" + messages[1]["content"]}
        return render_messages([merged], "instruct", tokenizer)


def mode_prompt(
    mode: Mode | str,
    sample: Any,
    *,
    template: str,
    tokenizer: Any,
    hits: Sequence[Any] | None = None,
) -> str:
    """The prompt of ``sample`` in ``mode``. ``template`` decides chat (``instruct``, message files)
    or plain text (``base``); the agent uses it as its Search-R1 template (a parquet row's stored
    messages first); ``hits``: the passages of rag."""
    mode = get_mode(mode) if isinstance(mode, str) else mode
    question = str(_field(sample, "question", ""))
    if mode.name == "agent":
        if hasattr(sample, "prompt"):
            return sample.prompt(template, tokenizer)

        return build_prompt(question, template, tokenizer)
    q = normalize_question(question)
    if mode.name == "cot":
        messages = [{"role": "user", "content": COT_INSTRUCTION.replace("{question}", q)}]
    elif mode.name == "direct":
        messages = [
            {"role": "system", "content": DIRECT_SYSTEM},
            {"role": "user", "content": BASELINE_USER.replace("{question}", q)},
        ]
    elif mode.name == "rag":
        reference = format_observation_docs(list(hits or []))
        messages = [
            {"role": "system", "content": RAG_SYSTEM.replace("{reference}", reference)},
            {"role": "user", "content": BASELINE_USER.replace("{question}", q)},
        ]
    else:  # a Mode built outside MODES
        raise EvaluationError(f"mode {mode.name!r}: no prompt for it; expected one of {', '.join(MODES)}")
    return _render(messages, template, tokenizer, answer_cue=mode.name != "cot")
