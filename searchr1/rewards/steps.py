"""Credit for each search: a step reward per search turn (StepSearch, Wang et al., EMNLP 2025,
arXiv 2505.15107: per-search information gain and a redundancy penalty, with token-level credit).

For one trajectory with executed search turns k = 1..K, H_k the hits of turn k and G the question's
gold units (``reward.step_gold``):

    cov(h)  = the gold units hit h covers: its id (G = supporting ids), its title (G = supporting
              titles) or "answer" when its text holds a golden answer (G = {"answer"})
    new_k   = | U_{h in H_k} cov(h)  minus  U_{j<k} U_{h in H_j} cov(h) |     gold first retrieved at k
    red_k   = 1 if H_k is not empty and every hit of H_k was retrieved by a turn j < k, else 0
    sup_k   = 1 if every gold unit of G was retrieved by a turn j < k, else 0   (nothing was missing)
    s_k     = step_gain * new_k / |G|  -  step_redundancy * red_k  -  step_superfluous * sup_k

So the gains of a trajectory sum to at most ``step_gain`` (every gold passage found once), a search
that only repeats earlier hits costs ``step_redundancy``, and a search after all gold was found costs
``step_superfluous`` (0 by default: then it earns nothing unless it repeats). Compared per search position
(``searchr1.algorithms.step_credit``), a second search of a single-hop question whose first search found
its passage then ranks below answering, while the second search of a two-hop question that finds hop 2
ranks above it. A failed search (no hits) earns 0. Where the row names no gold passages,
``step_gold=supporting`` leaves the trajectory unscored (no step reward at all), while
``supporting_or_answer`` falls back to the answer unit. How s_k reaches the turn's tokens (a step
advantage beside the outcome one, or token rewards under GAE) is ``searchr1.algorithms.step_credit``.

    credit = step_credit(traj, cfg.reward, decode)     # StepCredit(turns=[SearchTurn(...)], gold="ids")
    [t.reward for t in credit.turns]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from searchr1.data.supporting import title_key
from searchr1.rewards.config import RewardConfig
from searchr1.rewards.text import normalizer

ANSWER_UNIT = "answer"


@dataclass
class SearchTurn:
    """The step credit of one executed search."""

    span: tuple[int, int] | None
    """``[start, end)`` of the turn's generated tokens in ``response_ids`` (None: not found)."""
    reward: float = 0.0
    new_gold: int = 0
    """Gold units this turn retrieved first."""
    redundant: bool = False
    superfluous: bool = False
    """Made after every gold unit had been retrieved."""


@dataclass
class StepCredit:
    """The step credit of one trajectory."""

    turns: list[SearchTurn] = field(default_factory=list)
    gold: str = ""
    """What counted as gold: ids | titles | answer; "" = none known (the turns are not scored)."""
    stop_span: tuple[int, int] | None = None
    """``[start, end)`` in ``response_ids`` of what the trajectory did instead of one more search: from the
    end of its last executed search turn (0 without one) to the end of the response (the observation in
    between is not trained); None when unknown or empty."""

    @property
    def scored(self) -> bool:
        return bool(self.gold)


def _hit_title_text(hit: Mapping[str, Any]) -> tuple[str, str]:
    title, text = str(hit.get("title") or ""), str(hit.get("text") or "")
    if not title and not text and hit.get("contents"):
        head, _, rest = str(hit["contents"]).partition("\n")
        title, text = head.strip().strip('"'), rest
    return title, text


def hit_key(hit: Mapping[str, Any]) -> str:
    """What makes two hits the same passage: the doc id, else the title and text."""
    if hit.get("id") not in (None, ""):
        return f"id:{hit['id']}"
    title, text = _hit_title_text(hit)
    return f"text:{title_key(title)}\n{text.strip()}"


def gold_units(meta: Mapping[str, Any], mode: str) -> tuple[str, set[str]]:
    """``(kind, units)`` for a trajectory's meta under ``reward.step_gold`` (kind "" = no gold)."""
    if mode != "answer":
        ids = [str(i) for i in meta.get("supporting_ids") or []]
        if ids:
            return "ids", set(ids)
        titles = {title_key(t) for t in meta.get("supporting_titles") or [] if title_key(t)}
        if titles:
            return "titles", titles
        if mode == "supporting":
            return "", set()
    if any(str(g).strip() for g in meta.get("golden_answers") or []):
        return ANSWER_UNIT, {ANSWER_UNIT}
    return "", set()


def _covers(hit: Mapping[str, Any], kind: str, golden: Sequence[str], norm: Callable[[str], str]) -> set[str]:
    if kind == "ids":
        return {str(hit.get("id"))}
    title, text = _hit_title_text(hit)
    if kind == "titles":
        return {title_key(title)}
    info = f" {norm(f'{title} {text}')} "
    return {ANSWER_UNIT} if any(norm(g) and f" {norm(g)} " in info for g in golden) else set()


def step_credit(traj: Any, cfg: RewardConfig, decode: Callable[[list[int]], str] | None = None) -> StepCredit:
    """The step reward of each executed search of ``traj`` (a ``searchr1.rollout.types.Trajectory``;
    see the module docstring). ``decode`` finds the turns of a trajectory whose rollout did not record
    them (``Trajectory.search_turns``)."""
    meta = traj.meta or {}
    kind, gold = gold_units(meta, cfg.step_gold)
    spans = traj.search_turns(decode)
    stop = _stop_span(spans, len(traj.response_ids))
    if not kind:
        return StepCredit([SearchTurn(span) for span in spans], "", stop)
    golden = [str(g) for g in meta.get("golden_answers") or []]
    norm = normalizer(cfg.normalization)
    seen_hits: set[str] = set()
    found: set[str] = set()
    turns = []
    for span, hits in zip(spans, traj.documents, strict=True):
        keys = {hit_key(h) for h in hits}
        covered: set[str] = set()
        for h in hits:
            covered |= _covers(h, kind, golden, norm) & gold
        new = covered - found
        redundant = bool(keys) and keys <= seen_hits
        superfluous = found >= gold
        reward = (
            cfg.step_gain * len(new) / len(gold)
            - (cfg.step_redundancy if redundant else 0.0)
            - (cfg.step_superfluous if superfluous else 0.0)
        )
        turns.append(SearchTurn(span, reward, len(new), redundant, superfluous))
        seen_hits |= keys
        found |= new
    return StepCredit(turns, kind, stop)


def _stop_span(spans: Sequence[tuple[int, int] | None], response_len: int) -> tuple[int, int] | None:
    """After the last executed search turn, to the end of the response (None: a turn not found, or nothing
    after it)."""
    if spans and spans[-1] is None:
        return None
    start = int(spans[-1][1]) if spans else 0
    return (start, response_len) if response_len > start else None


def gold_coverage(
    meta: Mapping[str, Any], documents: Sequence[Sequence[Mapping[str, Any]]], cfg: RewardConfig
) -> float | None:
    """The share of the question's gold units (``reward.step_gold``) that any retrieved passage covers:
    ``|U_k U_{h in H_k} cov(h)  intersect  G| / |G|``, the sum of a trajectory's gains over ``step_gain``;
    None when the row names no gold."""
    kind, gold = gold_units(meta, cfg.step_gold)
    if not kind:
        return None
    golden = [str(g) for g in meta.get("golden_answers") or []]
    norm = normalizer(cfg.normalization)
    covered: set[str] = set()
    for hits in documents:
        for h in hits:
            covered |= _covers(h, kind, golden, norm) & gold
    return len(covered) / len(gold)


def step_metrics(credits: Sequence[StepCredit]) -> dict[str, float]:
    """Sums for the step metrics (the trainer reduces them over ranks and divides by the counts):
    ``step/reward_mean`` over scored search turns, the share of them that found new gold
    (``step/new_gold_share``) or were redundant (``step/redundant_share``), and the share of search
    turns that could be scored at all (``step/scored_share``)."""
    turns = [t for c in credits for t in c.turns]
    scored = [t for c in credits if c.scored for t in c.turns]
    return {
        "search_turns": float(len(turns)),
        "scored_turns": float(len(scored)),
        "reward_sum": float(sum(t.reward for t in scored)),
        "new_gold_turns": float(sum(t.new_gold > 0 for t in scored)),
        "redundant_turns": float(sum(t.redundant for t in scored)),
    }
