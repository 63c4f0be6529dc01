"""The gold supporting passages of a question, read from its dataset row's metadata.

What the step reward (``searchr1.rewards.steps``) counts as a gold passage. Each form below is read
where a row has it, first match wins:

    supporting_ids      [doc id, ...]                  the synthetic world (searchr1.data.synth)
    supporting_titles   [title, ...]                   the synthetic world; any dataset may add it
    supporting_facts    {"title": [...], "sent_id": [...]}      HotpotQA / 2Wiki (FlashRAG, HF datasets)
                        [[title, sent_id], ...]                 HotpotQA / 2Wiki (original json)
    paragraphs          [{"title", "is_supporting"}, ...]       MuSiQue
    hops                [entity, ...]                  synthetic worlds written before supporting_titles

    supporting_passages({"supporting_facts": {"title": ["A", "B", "A"], "sent_id": [0, 1, 2]}})
        -> {"titles": ["A", "B"]}
    supporting_passages({"type": "single"})  -> {}          (NQ, TriviaQA, ...: none)

Ids are matched against a hit's ``id``, titles against its ``title`` (``title_key``: case, quotes and
spaces do not matter); a title stands for every passage of that article.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def title_key(title: Any) -> str:
    """A title as compared: stripped of spaces and surrounding quotes, case-folded."""
    return " ".join(str(title).strip().strip('"').split()).casefold()


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))


def _fact_titles(facts: Any) -> list[str]:
    if isinstance(facts, Mapping):
        return [str(t) for t in facts.get("title") or []]
    if isinstance(facts, list | tuple):
        out = []
        for fact in facts:
            if isinstance(fact, list | tuple) and fact:
                out.append(str(fact[0]))
            elif isinstance(fact, Mapping) and "title" in fact:
                out.append(str(fact["title"]))
        return out
    return []


def supporting_passages(metadata: Mapping[str, Any] | None, data_source: str = "") -> dict[str, list[str]]:
    """``{"ids": [...]}`` or ``{"titles": [...]}`` (see the module docstring), ``{}`` when the row
    names no supporting passage."""
    meta = metadata or {}
    ids = meta.get("supporting_ids")
    if isinstance(ids, list | tuple) and ids:
        return {"ids": _unique([str(i) for i in ids])}
    titles = supporting_titles(meta, data_source)
    return {"titles": titles} if titles else {}


def supporting_titles(metadata: Mapping[str, Any] | None, data_source: str = "") -> list[str]:
    """The titles of the gold passages in the row's order (the order of its hops or supporting facts), each
    once; ``[]`` when the row names none. The gold path of guidance searches them in this order."""
    meta = metadata or {}
    titles: list[str] = []
    if isinstance(meta.get("supporting_titles"), list | tuple):
        titles = [str(t) for t in meta["supporting_titles"]]
    elif meta.get("supporting_facts"):
        titles = _fact_titles(meta["supporting_facts"])
    elif isinstance(meta.get("paragraphs"), list | tuple):
        titles = [
            str(p.get("title", ""))
            for p in meta["paragraphs"]
            if isinstance(p, Mapping) and p.get("is_supporting")
        ]
    elif isinstance(meta.get("hops"), list | tuple) and (meta.get("data_source") or data_source) == "synth":
        titles = [str(h) for h in meta["hops"]]
    return _unique([t.strip() for t in titles])


def supporting_meta(metadata: Mapping[str, Any] | None, data_source: str = "") -> dict[str, list[str]]:
    """The keys a trajectory's meta carries: ``supporting_ids`` / ``supporting_titles`` (or none)."""
    return {
        f"supporting_{kind}": values for kind, values in supporting_passages(metadata, data_source).items()
    }


def question_kind(metadata: Mapping[str, Any] | None, data_source: str = "") -> str:
    """``multi-hop`` for a question that needs two gold passages or more (metadata ``type`` bridge /
    comparison / compositional, or two supporting titles or ids), else ``single-hop``."""
    meta = metadata or {}
    kind = str(meta.get("type") or "").lower()
    if kind in ("single", "single-hop"):
        return "single-hop"
    if kind in ("bridge", "comparison", "compositional", "inference", "bridge_comparison", "multi-hop"):
        return "multi-hop"
    ids = meta.get("supporting_ids")
    gold = ids if isinstance(ids, list | tuple) and ids else supporting_titles(meta, data_source)
    return "multi-hop" if len(gold) >= 2 else "single-hop"
