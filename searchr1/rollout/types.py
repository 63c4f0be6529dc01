"""What a rollout produces: token-in / token-out trajectories with a role per token.

The trainer, the evaluation and the report read only these types, never an engine's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from searchr1.rollout.actions import parse_action


class Role(IntEnum):
    """Who produced a token. Only ``GENERATED`` tokens are trained (the loss mask)."""

    PROMPT = 0
    GENERATED = 1
    OBSERVATION = 2  # <information> blocks and invalid-action messages: masked from the loss


@dataclass
class Trajectory:
    """One multi-turn episode for one prompt.

    ``response_ids`` are all tokens after the prompt, exactly as sampled or appended (never
    re-tokenised); ``roles[i]`` and ``logprobs[i]`` describe ``response_ids[i]`` (logprob 0.0 for
    observation tokens).
    """

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    roles: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: int = 0
    """Generation turns (each ends with a search, an answer, EOS or the turn limit)."""
    searches: int = 0
    invalid_actions: int = 0
    obs_truncations: int = 0
    search_failures: int = 0
    truncated: bool = False
    """Ended by the context or response budget rather than by an answer / EOS."""
    finish_reason: str = ""
    """answer | eos | max_turns | truncated | length."""
    queries: list[str] = field(default_factory=list)
    documents: list[list[dict[str, Any]]] = field(default_factory=list)
    """Per search, the hits returned (``Hit.to_dict()``)."""
    search_spans: list[list[int]] = field(default_factory=list)
    """Per search, ``[start, end)`` of its turn's generated tokens in ``response_ids`` (the tokens a
    step reward reaches; ``searchr1.rewards.steps``)."""
    response_text: str = ""
    """Decoded response for display and answer extraction (never re-encoded for training)."""
    timing: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    """Sample metadata carried through: question, golden_answers, data_source, group id, index."""

    @property
    def loss_mask(self) -> list[int]:
        return [1 if r == Role.GENERATED else 0 for r in self.roles]

    @property
    def num_generated(self) -> int:
        return sum(1 for r in self.roles if r == Role.GENERATED)

    def generated_text_only(self, decode: Any) -> str:
        """The model's own tokens, decoded (observations left out), for reward parsing."""
        return decode([t for t, r in zip(self.response_ids, self.roles, strict=True) if r == Role.GENERATED])

    def generated_spans(self, decode: Any) -> list[str]:
        """The model's own text, one decoded string per run of consecutive generated tokens (a turn,
        or the part of a turn between two observations). Every token the rollout inserted (role
        OBSERVATION: information blocks, the invalid-action message) is left out by the role mask,
        and no span joins text from both sides of an insertion: answers are read from these."""
        spans: list[str] = []
        run: list[int] = []
        for token, role in zip(self.response_ids, self.roles, strict=True):
            if role == Role.GENERATED:
                run.append(token)
            elif run:
                spans.append(decode(run))
                run = []
        if run:
            spans.append(decode(run))
        return spans

    def search_turns(self, decode: Any = None) -> list[tuple[int, int] | None]:
        """``[start, end)`` of each executed search's turn in ``response_ids``: ``search_spans`` as the
        rollout recorded them; for a trajectory without them (an engine that does not record them), the
        runs of generated tokens whose text (``decode``) parses as a search, the first
        ``len(documents)`` of them (a search that was not executed is always the last turn); None
        where a turn cannot be found."""
        searches = len(self.documents)
        if len(self.search_spans) == searches:
            return [(int(a), int(b)) for a, b in self.search_spans]
        spans: list[tuple[int, int] | None] = []
        if decode is not None:
            start = None
            for i, role in enumerate([*self.roles, None]):
                if role == Role.GENERATED and start is None:
                    start = i
                elif role != Role.GENERATED and start is not None:
                    if parse_action(decode(self.response_ids[start:i])).kind == "search":
                        spans.append((start, i))
                    start = None
        spans = spans[:searches]
        return spans + [None] * (searches - len(spans))

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)
