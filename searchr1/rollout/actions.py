"""What the model asked for in one turn: parsing ``<search>`` / ``<answer>`` and stopping on them.

Rule (Search-R1): a turn stops at the first ``</search>`` or ``</answer>``; the *first completed*
action decides — the first closing tag in the turn's text, paired with the last opening tag of the
same kind before it. Only the turn's own generated text is parsed, so tags inside an
``<information>`` block (an observation) never count. A closing tag without its opening tag, an
unclosed tag, or an empty query is an invalid action.

Tags are matched on decoded text, never on token ids, so a tokenizer that splits ``</search>``
into several tokens works the same as one that has it as a single token.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from searchr1.data.prompts import ANSWER_CLOSE, ANSWER_OPEN, SEARCH_CLOSE, SEARCH_OPEN

ActionKind = Literal["search", "answer", "invalid"]
STOP_TAGS = (SEARCH_CLOSE, ANSWER_CLOSE)
_OPEN = {SEARCH_CLOSE: SEARCH_OPEN, ANSWER_CLOSE: ANSWER_OPEN}
_KIND: dict[str, ActionKind] = {SEARCH_CLOSE: "search", ANSWER_CLOSE: "answer"}


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    content: str = ""
    """The query (search) or the answer text (answer), stripped."""
    reason: str = ""
    """Why an action is invalid: no action | unclosed tag | closing tag without opening | empty query."""


def first_stop(text: str) -> tuple[int, str] | None:
    """Position and tag of the first closing action tag in ``text``, or None."""
    best: tuple[int, str] | None = None
    for tag in STOP_TAGS:
        pos = text.find(tag)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, tag)
    return best


def parse_action(text: str) -> Action:
    """The action of one turn's generated text (see the module docstring)."""
    stop = first_stop(text)
    if stop is None:
        if SEARCH_OPEN in text or ANSWER_OPEN in text:
            return Action("invalid", reason="unclosed tag")
        return Action("invalid", reason="no action")
    pos, close = stop
    open_tag = _OPEN[close]
    start = text.rfind(open_tag, 0, pos)
    if start < 0:
        return Action("invalid", reason="closing tag without opening")
    content = text[start + len(open_tag) : pos].strip()
    kind = _KIND[close]
    if kind == "search" and not content:
        return Action("invalid", reason="empty query")
    return Action(kind, content)


def truncate_query(query: str, max_chars: int) -> tuple[str, bool]:
    """Cut ``query`` to ``max_chars`` characters (at a word boundary when one is near)."""
    if len(query) <= max_chars:
        return query, False
    cut = query[:max_chars]
    space = cut.rfind(" ")
    if space >= max_chars // 2:
        cut = cut[:space]
    return cut.rstrip(), True


class StopDetector:
    """Decides, token by token, whether a turn has ended; decodes only when a token may close a tag.

    A closing tag ends with ``>``, so the turn's text is decoded (and searched for a closing tag)
    only after a token whose text contains ``>``; pieces are cached per token id.
    """

    def __init__(self, tokenizer: Any, eos_ids: Iterable[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self._may_close: dict[int, bool] = {}

    def may_close(self, token: int) -> bool:
        hit = self._may_close.get(token)
        if hit is None:
            hit = ">" in self.tokenizer.decode([token], skip_special_tokens=False)
            self._may_close[token] = hit
        return hit

    def closes_action(self, turn_ids: list[int]) -> bool:
        """True when the turn's text (ending with its last token) contains a closing action tag."""
        if not turn_ids or not self.may_close(turn_ids[-1]):
            return False
        return first_stop(self.decode(turn_ids)) is not None

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def eos_token_ids(tokenizer: Any, model: Any | None = None) -> set[int]:
    """EOS ids from the tokenizer and the model's generation config (which may list several)."""
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_cfg = getattr(model, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, list | tuple):
        ids.update(int(i) for i in eos)
    return ids
