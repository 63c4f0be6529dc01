"""One trajectory's state machine, shared by every HF engine (only the scheduling differs).

    generate a turn ──► </answer>                    ──► done (answer)
                   ├──► </search> q                  ──► search q ──► append <information> ──► next turn
                   ├──► EOS / turn limit, no action  ──► append invalid-action message    ──► next turn
                   └──► response budget reached      ──► done (truncated)
    after ``max_turns`` turns: one more turn whose search is not executed, then done (max_turns); with
    ``rollout.last_search_notice`` the observation that ends turn ``max_turns`` says so

Generated tokens are stored exactly as sampled (role GENERATED, with their log-prob); observation
text is encoded once and appended (role OBSERVATION, log-prob 0). Nothing is ever re-tokenised.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from searchr1.data.prompts import (
    INFO_CLOSE,
    INVALID_ACTION_MESSAGE,
    LAST_SEARCH_NOTICE,
    format_observation_docs,
    wrap_information,
)
from searchr1.rollout.actions import Action, StopDetector, parse_action, truncate_query
from searchr1.rollout.config import RolloutConfig
from searchr1.rollout.types import Role, Trajectory

SEARCH_FAILED_TEXT = (
    "Search failed: the search engine did not answer. Try again or answer with what you know.\n"
)
"""The text inside <information> when a search failed after its retries."""


def checked_prompts(
    prompt_ids: Sequence[Sequence[int]], metas: Sequence[Mapping[str, Any]] | None
) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """The prompts of a ``generate`` call as lists of ints with one meta dict each; an empty prompt or a
    count mismatch is refused."""
    prompts = [list(map(int, p)) for p in prompt_ids]
    if metas is None:
        metas = [{} for _ in prompts]
    if len(metas) != len(prompts):
        raise ValueError(f"generate: {len(prompts)} prompts but {len(metas)} metas")
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"generate: prompt {i} is empty")
    return prompts, [dict(m) for m in metas]


class EpisodeContext:
    """What every episode of one ``generate`` call shares: tokenizer, limits, encoded messages."""

    def __init__(
        self,
        tokenizer: Any,
        config: RolloutConfig,
        stop: StopDetector,
        max_turn_tokens: int,
        max_context: int,
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.stop = stop
        self.max_turn_tokens = max_turn_tokens
        self.max_context = max_context
        self.invalid_ids = self.encode(INVALID_ACTION_MESSAGE) if config.invalid_action_message else []
        self.failed_ids = self.encode(wrap_information(SEARCH_FAILED_TEXT))
        self.notice_ids = self.encode(LAST_SEARCH_NOTICE) if config.last_search_notice else []
        """Appended to the observation after which only an answer may follow (``rollout.last_search_notice``)."""
        prefix, suffix = wrap_information("").split(INFO_CLOSE)
        self.obs_prefix_ids = self.encode(prefix)
        self.obs_suffix_ids = self.encode(INFO_CLOSE + suffix)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def observation_ids(self, hits: list[Any]) -> tuple[list[int], bool]:
        """The ``<information>`` block of ``hits`` as token ids, cut to ``max_obs_tokens`` (docs first)."""
        docs = format_observation_docs(hits)
        ids = self.encode(wrap_information(docs))
        limit = self.config.max_obs_tokens
        if len(ids) <= limit:
            return ids, False
        frame = len(self.obs_prefix_ids) + len(self.obs_suffix_ids)
        if limit <= frame:
            return ids[:limit], True
        doc_ids = self.encode(docs)[: limit - frame]
        return self.obs_prefix_ids + doc_ids + self.obs_suffix_ids, True


@dataclass
class TurnEnd:
    """What the engine must do after a turn."""

    kind: Literal["search", "continue", "done"]
    query: str = ""


@dataclass
class Episode:
    index: int
    """Row of the ``generate`` call (also selects the row's random generator)."""
    ctx: EpisodeContext
    traj: Trajectory
    budget: int
    """Response tokens allowed: min(max_response_tokens, max_context - prompt length)."""
    turn_ids: list[int] = field(default_factory=list)
    last_action: Action | None = None
    done: bool = False
    t_start: float = 0.0
    search_s: float = 0.0

    @classmethod
    def start(cls, index: int, prompt_ids: list[int], meta: dict[str, Any], ctx: EpisodeContext) -> Episode:
        """A new episode. A prompt that ends with a written prefix of the response (``meta["prefix_turns"]``
        turns in ``meta["prefix_tokens"]`` tokens: a branched rollout, ``searchr1.rollout.gold``) continues
        with what is left of ``max_turns`` and ``max_response_tokens``."""
        cfg = ctx.config
        done_turns, done_tokens = int(meta.get("prefix_turns", 0)), int(meta.get("prefix_tokens", 0))
        budget = min(cfg.max_response_tokens - done_tokens, ctx.max_context - len(prompt_ids))
        ep = cls(
            index, ctx, Trajectory(prompt_ids=list(prompt_ids), meta=dict(meta), turns=done_turns), budget
        )
        ep.t_start = time.perf_counter()
        if budget <= 0:
            ep._finish("truncated", truncated=True)
        return ep

    @property
    def context_ids(self) -> list[int]:
        return self.traj.prompt_ids + self.traj.response_ids

    @property
    def context_len(self) -> int:
        return len(self.traj.prompt_ids) + len(self.traj.response_ids)

    def tokens_from(self, start: int) -> list[int]:
        """``context_ids[start:]`` without copying the whole context."""
        n_prompt = len(self.traj.prompt_ids)
        if start >= n_prompt:
            return self.traj.response_ids[start - n_prompt :]
        return self.traj.prompt_ids[start:] + self.traj.response_ids

    @property
    def is_final_turn(self) -> bool:
        """The turn being generated is the answer-only one (its search would not run)."""
        return self.traj.turns >= self.ctx.config.max_turns

    def add_token(self, token: int, logprob: float) -> bool:
        """Append one sampled token; True when the turn has ended."""
        t = self.traj
        t.response_ids.append(int(token))
        t.roles.append(int(Role.GENERATED))
        t.logprobs.append(float(logprob))
        self.turn_ids.append(int(token))
        return (
            token in self.ctx.stop.eos_ids
            or self.ctx.stop.closes_action(self.turn_ids)
            or len(self.turn_ids) >= self.ctx.max_turn_tokens
            or len(t.response_ids) >= self.budget
        )

    def end_turn(self) -> TurnEnd:
        """Parse the finished turn and apply its action (the invalid-action message is appended here)."""
        t, cfg = self.traj, self.ctx.config
        text = self.ctx.stop.decode(self.turn_ids)
        ended_by_eos = bool(self.turn_ids) and self.turn_ids[-1] in self.ctx.stop.eos_ids
        action = parse_action(text)
        self.last_action = action
        final = self.is_final_turn
        t.turns += 1
        turn_start = len(t.response_ids) - len(self.turn_ids)
        self.turn_ids = []
        if action.kind == "answer":
            return self._finish("answer")
        if len(t.response_ids) >= self.budget:
            return self._finish("truncated", truncated=True)
        if final:
            return self._finish("max_turns")
        if action.kind == "search":
            query, _ = truncate_query(action.content, cfg.max_query_chars)
            t.searches += 1
            t.queries.append(query)
            t.search_spans.append([turn_start, len(t.response_ids)])
            return TurnEnd("search", query)
        if ended_by_eos and cfg.eos_ends_trajectory:
            return self._finish("eos")
        t.invalid_actions += 1
        if not self._append_observation(self._with_notice(self.ctx.invalid_ids)):
            return self._finish("truncated", truncated=True)
        return TurnEnd("continue")

    def receive(self, hits: list[Any] | None, error: str | None = None, wait_s: float = 0.0) -> bool:
        """Append the observation of this episode's pending search; False if that ended the episode."""
        t = self.traj
        self.search_s += wait_s
        if hits is None:
            t.search_failures += 1
            t.documents.append([])
            t.meta.setdefault("search_errors", []).append(error or "search failed")
            ids = self.ctx.failed_ids
        else:
            t.documents.append([h.to_dict() if hasattr(h, "to_dict") else dict(h) for h in hits])
            ids, cut = self.ctx.observation_ids(hits)
            t.obs_truncations += int(cut)
        if not self._append_observation(self._with_notice(ids)):
            self._finish("truncated", truncated=True)
            return False
        return True

    def _with_notice(self, ids: list[int]) -> list[int]:
        """``ids`` and, when the next turn is the answer-only one, the last-search notice."""
        return list(ids) + self.ctx.notice_ids if self.is_final_turn and self.ctx.notice_ids else ids

    def _append_observation(self, ids: list[int]) -> bool:
        """Append ``ids`` as observation tokens if at least one generated token still fits after them."""
        t = self.traj
        if len(t.response_ids) + len(ids) >= self.budget:
            return False
        t.response_ids.extend(ids)
        t.roles.extend([int(Role.OBSERVATION)] * len(ids))
        t.logprobs.extend([0.0] * len(ids))
        return True

    def _finish(self, reason: str, truncated: bool = False) -> TurnEnd:
        self.done = True
        self.traj.finish_reason = reason
        self.traj.truncated = truncated
        return TurnEnd("done")

    def finalize(self, t0: float) -> Trajectory:
        """Fill the display text and timing once the episode is over."""
        t = self.traj
        t.response_text = self.ctx.tokenizer.decode(t.response_ids, skip_special_tokens=True)
        now = time.perf_counter()
        t.timing = {
            "start_s": self.t_start - t0,
            "total_s": now - self.t_start,
            "search_wait_s": self.search_s,
        }
        return t
