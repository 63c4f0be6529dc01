"""Gold trajectories: a question's gold path written as the rollout writes a trajectory.

A row that names its gold passages (``searchr1.data.supporting.supporting_titles``: the synthetic world's
hops, HotpotQA / 2Wiki supporting facts, MuSiQue's supporting paragraphs) has a gold path: search each
gold title in turn, then answer with the first golden answer. ``GoldWriter`` turns it into tokens in the
run's format, with real observations from the run's own search backend:

    <think> I should search {q1}. </think>\\n<search> {q1} </search>           generated (trained)
    \\n\\n<information>Doc 1(Title: ...) ...\\n</information>\\n\\n                 observation (masked)
    <think> {the sentence of the passages that names q2} I should search {q2}. </think>\\n<search> {q2} </search>
    \\n\\n<information>...</information>\\n\\n
    <think> {the sentence that holds the answer} </think>\\n<answer> {answer} </answer>

(a sentence that is not found is left out: with a backend that finds nothing, the search-disabled control,
the gold trajectory searches, reads nothing and answers.) Each turn and each observation is encoded on its
own, exactly as the rollout encodes them (``EpisodeContext.observation_ids``), so a gold trajectory is a
``Trajectory`` the trainer and the rewards read like any other. The tokens are never sampled: their
``logprobs`` are 0 and the trainer must not treat them as on-policy (``searchr1.trainer.guidance``).

A path is cut to ``rollout.max_turns`` searches, and a trajectory longer than ``rollout.max_response_tokens``
is cut after its last whole turn that fits (``GoldTrajectory.cut``), never mid-turn.

The turn after the first passage is where the policy decides to search again or to answer: its tokens
after the opening ``<think> {evidence}`` are recorded as ``meta["decision_span"]`` (positions in the
response), which the warm start may weigh more (``warmstart.decision_weight``).

``GoldWriter.prefix`` is the gold path up to the end of the first ``<information>``: branched rollouts
continue from it (``splice``: the prefix joins the continuation as observation tokens, not trained).

    writer = GoldWriter(tokenizer, cfg.rollout, retriever, topk=cfg.retrieval.topk)
    path = gold_path(sample)                      # None: the row names no gold passage
    gold = writer.trajectory(prompt_ids, path, meta)
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from searchr1.data.formats import sample_prompt
from searchr1.data.prompts import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
)
from searchr1.data.supporting import supporting_titles
from searchr1.rollout.episode import EpisodeContext
from searchr1.rollout.types import Role, Trajectory

GOLD_PATH_KEYS = (
    "metadata.supporting_titles, metadata.supporting_facts (HotpotQA / 2Wiki), "
    "metadata.paragraphs[].is_supporting (MuSiQue) or metadata.hops (synthetic worlds), with golden_answers"
)
"""Where a row's gold path is read from (named in the message when no row has one)."""


@dataclass(frozen=True)
class GoldPath:
    """What to search, in order, and what to answer."""

    queries: tuple[str, ...]
    answer: str


def gold_path(sample: Any) -> GoldPath | None:
    """The gold path of a dataset row (a ``searchr1.data.formats.Sample`` or a FlashRAG-style dict); None
    when it names no gold passage or no golden answer."""
    if isinstance(sample, Mapping):
        metadata = sample.get("metadata") or {}
        source = str(sample.get("data_source") or metadata.get("data_source") or "")
        answers = sample.get("golden_answers") or []
    else:
        metadata = getattr(sample, "metadata", None) or {}
        source = str(getattr(sample, "data_source", "") or "")
        answers = getattr(sample, "golden_answers", None) or []
    titles = supporting_titles(metadata, source)
    answer = next((str(a).strip() for a in answers if str(a).strip()), "")
    if not titles or not answer:
        return None
    return GoldPath(tuple(titles), answer)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sentence_naming(hits: Sequence[Any], phrase: str) -> str | None:
    """The first sentence of the hits' texts that contains ``phrase`` (case-insensitive), else None."""
    needle = phrase.casefold().strip()
    if not needle:
        return None
    for hit in hits:
        for sentence in _SENTENCE_END.split(str(_field(hit, "text")).strip()):
            if needle in sentence.casefold():
                return sentence.strip()
    return None


SEARCH_SIDE = "search"
ANSWER_SIDE = "answer"


def decision_side(path: GoldPath | None, first_hits: Sequence[Any]) -> str | None:
    """Which decision the first gold passage calls for: ``SEARCH_SIDE`` when the gold path searches two
    titles or more (the passage names the next one), ``ANSWER_SIDE`` when it searches one and a sentence of
    its hits holds the answer; None on neither side (no gold path, or a one-search path whose passage lacks
    the answer)."""
    if path is None:
        return None
    if len(path.queries) >= 2:
        return SEARCH_SIDE
    return ANSWER_SIDE if sentence_naming(first_hits, path.answer) is not None else None


def _field(hit: Any, name: str) -> Any:
    return hit.get(name, "") if isinstance(hit, Mapping) else getattr(hit, name, "")


def search_turn_text(query: str, evidence: str | None) -> str:
    """A gold search turn: the sentence that led to the query (if any), then the query."""
    reason = f"{evidence} I should search {query}." if evidence else f"I should search {query}."
    return f"{THINK_OPEN} {reason} {THINK_CLOSE}\n{SEARCH_OPEN} {query} {SEARCH_CLOSE}"


def answer_turn_text(answer: str, evidence: str | None) -> str:
    """The gold answer turn: the sentence that holds the answer (if any), then the answer."""
    reason = evidence or f"The answer is {answer}."
    return f"{THINK_OPEN} {reason} {THINK_CLOSE}\n{ANSWER_OPEN} {answer} {ANSWER_CLOSE}"


@dataclass
class GoldStep:
    """One search of a gold path: the turn's tokens, its observation's, and what the search returned."""

    query: str
    turn_ids: list[int]
    obs_ids: list[int]
    documents: list[dict[str, Any]]
    failed: bool = False
    cut: bool = False
    evidence: str | None = None
    """The sentence of the previous passages the turn's reasoning quotes (None: none)."""


@dataclass
class GoldTrajectory:
    trajectory: Trajectory
    cut: bool = False
    """The path was cut (more searches than ``max_turns``, or longer than ``max_response_tokens``)."""
    searches: list[GoldStep] = field(default_factory=list)


class GoldWriter:
    """Writes gold trajectories and gold prefixes for one run (its tokenizer, rollout limits and search
    backend). ``search`` failures become the rollout's failed-search observation."""

    def __init__(self, tokenizer: Any, rollout_config: Any, retriever: Any, topk: int) -> None:
        self.tokenizer = tokenizer
        self.config = rollout_config
        self.retriever = retriever
        self.topk = topk
        self.ctx = EpisodeContext(tokenizer, rollout_config, stop=None, max_turn_tokens=0, max_context=0)  # type: ignore[arg-type]

    def encode(self, text: str) -> list[int]:
        return self.ctx.encode(text)

    def search(self, query: str, evidence: str | None, turn: int = 1) -> GoldStep:
        """One gold search turn (the ``turn``-th of the trajectory) with its real observation; after turn
        ``max_turns`` the observation carries the rollout's last-search notice, as ``Episode`` writes it."""
        turn_ids = self.encode(search_turn_text(query, evidence))
        notice = self.ctx.notice_ids if turn >= int(self.config.max_turns) else []
        try:
            hits = list(self.retriever.search([query], self.topk)[0])
        except Exception:  # a failed search is an observation, as in the rollout
            return GoldStep(query, turn_ids, list(self.ctx.failed_ids) + notice, [], failed=True, evidence=evidence)
        obs, cut = self.ctx.observation_ids(hits)
        docs = [h.to_dict() if hasattr(h, "to_dict") else dict(h) for h in hits]
        return GoldStep(query, turn_ids, obs + notice, docs, cut=cut, evidence=evidence)

    def decision_span(self, turn_ids: Sequence[int], evidence: str | None) -> tuple[int, int] | None:
        """Where, in a turn after a passage, the decision is written: the tokens after its opening
        ``<think> {evidence}`` to the end of the turn (`` I should search {q}. </think>\n<search> {q}
        </search>`` or `` </think>\n<answer> {a} </answer>``); None when the turn does not start with the
        opening's own tokens."""
        opening = self.encode(f"{THINK_OPEN} {evidence}" if evidence else THINK_OPEN)
        if list(turn_ids[: len(opening)]) != opening or len(opening) >= len(turn_ids):
            return None
        return len(opening), len(turn_ids)

    def steps(self, path: GoldPath) -> tuple[list[GoldStep], bool]:
        """The searches of ``path`` (at most ``max_turns``), each turn's reasoning naming what the previous
        passages said of its query; and whether the path had to be cut to ``max_turns``."""
        queries = path.queries[: max(0, int(self.config.max_turns))]
        out: list[GoldStep] = []
        for k, query in enumerate(queries, start=1):
            evidence = sentence_naming(out[-1].documents, query) if out else None
            out.append(self.search(query, evidence, turn=k))
        return out, len(queries) < len(path.queries)

    def prefix(self, path: GoldPath) -> GoldStep:
        """The gold path up to the end of the first ``<information>`` (for branched rollouts)."""
        return self.search(path.queries[0], None, turn=1)

    def trajectory(
        self, prompt_ids: Sequence[int], path: GoldPath, meta: Mapping[str, Any]
    ) -> GoldTrajectory:
        """The whole gold trajectory after ``prompt_ids`` (``meta`` is carried, with ``guided: "gold"``)."""
        steps, cut = self.steps(path)
        answer_evidence = next(
            (s for step in reversed(steps) if (s := sentence_naming(step.documents, path.answer))), None
        )
        final = self.encode(answer_turn_text(path.answer, answer_evidence))
        budget = int(self.config.max_response_tokens)
        traj = Trajectory(prompt_ids=list(prompt_ids), meta={**meta, "guided": "gold"})
        used = 0
        second_turn: tuple[int, Sequence[int], str | None] | None = None
        for step in steps:
            if used + len(step.turn_ids) + len(step.obs_ids) + 1 > budget:
                cut = True
                break
            if traj.searches == 1:
                second_turn = (used, step.turn_ids, step.evidence)
            _append(traj, step.turn_ids, Role.GENERATED)
            traj.search_spans.append([used, used + len(step.turn_ids)])
            _append(traj, step.obs_ids, Role.OBSERVATION)
            used += len(step.turn_ids) + len(step.obs_ids)
            traj.turns += 1
            traj.searches += 1
            traj.queries.append(step.query)
            traj.documents.append(step.documents)
            traj.search_failures += int(step.failed)
            traj.obs_truncations += int(step.cut)
        if used + len(final) <= budget:
            if traj.searches == 1:
                second_turn = (used, final, answer_evidence)
            _append(traj, final, Role.GENERATED)
            traj.turns += 1
            traj.finish_reason = "answer"
        else:
            cut = True
            traj.finish_reason = "truncated"
            traj.truncated = True
        if second_turn is not None and (span := self.decision_span(second_turn[1], second_turn[2])):
            traj.meta["decision_span"] = [second_turn[0] + span[0], second_turn[0] + span[1]]
        traj.response_text = self.tokenizer.decode(traj.response_ids, skip_special_tokens=True)
        return GoldTrajectory(traj, cut, steps)


def _append(traj: Trajectory, ids: Sequence[int], role: Role) -> None:
    traj.response_ids.extend(int(i) for i in ids)
    traj.roles.extend([int(role)] * len(ids))
    traj.logprobs.extend([0.0] * len(ids))


def prefix_meta(meta: Mapping[str, Any], prefix: GoldStep) -> dict[str, Any]:
    """The meta of a continuation from ``prefix``: the rollout counts the prefix's turn and tokens against
    ``max_turns`` and ``max_response_tokens`` (``Episode.start``)."""
    return {**meta, "prefix_turns": 1, "prefix_tokens": len(prefix.turn_ids) + len(prefix.obs_ids)}


def splice(
    prefix: GoldStep, continuation: Trajectory, prompt_ids: Sequence[int], tokenizer: Any
) -> Trajectory:
    """A branched rollout as one trajectory after ``prompt_ids``: the gold prefix (its search turn and
    observation, both as observation tokens: written, not sampled, never trained) then the continuation the
    model generated from it (prompted with ``prompt_ids + prefix``)."""
    head = list(prefix.turn_ids) + list(prefix.obs_ids)
    shift = len(head)
    meta = {k: v for k, v in continuation.meta.items() if k not in ("prefix_turns", "prefix_tokens")}
    traj = Trajectory(
        prompt_ids=list(prompt_ids),
        response_ids=head + list(continuation.response_ids),
        roles=[int(Role.OBSERVATION)] * shift + list(continuation.roles),
        logprobs=[0.0] * shift + list(continuation.logprobs),
        turns=continuation.turns,
        searches=continuation.searches + 1,
        invalid_actions=continuation.invalid_actions,
        obs_truncations=continuation.obs_truncations + int(prefix.cut),
        search_failures=continuation.search_failures + int(prefix.failed),
        truncated=continuation.truncated,
        finish_reason=continuation.finish_reason,
        queries=[prefix.query, *continuation.queries],
        documents=[list(prefix.documents), *continuation.documents],
        search_spans=[[0, len(prefix.turn_ids)]]
        + [[a + shift, b + shift] for a, b in continuation.search_spans],
        timing=dict(continuation.timing),
        meta={**meta, "guided": "branched", "guided_prefix_tokens": shift},
    )
    traj.response_text = tokenizer.decode(traj.response_ids, skip_special_tokens=True)
    return traj


@dataclass
class DecisionPoint:
    """A question at its decision point: its gold path, its first gold search (``first``: the turn, its real
    observation and hits), the side of the decision (None: neither side) and ``context``: the prompt's tokens,
    then the first search turn and its observation (empty when ``side`` is None)."""

    sample: Any
    path: GoldPath
    first: GoldStep
    side: str | None
    context: list[int]


def decision_points(
    samples: Sequence[Any], template: str, tokenizer: Any, writer: GoldWriter
) -> Iterator[DecisionPoint]:
    """The decision point of every sample with a gold path, in order (the decision probe and the warm start's
    check read the same contexts)."""
    for sample in samples:
        path = gold_path(sample)
        if path is None:
            continue
        first = writer.prefix(path)
        side = decision_side(path, first.documents)
        context: list[int] = []
        if side is not None:
            prompt = tokenizer(sample_prompt(sample, template, tokenizer), add_special_tokens=False)
            context = [*prompt["input_ids"], *first.turn_ids, *first.obs_ids]
        yield DecisionPoint(sample, path, first, side, context)
