"""HotpotQA in its own row format (Yang et al. 2018, the distractor setting): FlashRAG rows and a corpus.

A HotpotQA row holds ``id``, ``question``, ``answer``, ``type`` (bridge / comparison), ``level``,
``supporting_facts`` (``{"title": [...], "sent_id": [...]}`` or ``[[title, sent_id], ...]``: the gold
paragraphs and sentences) and ``context`` (``{"title": [...], "sentences": [[...], ...]}`` or
``[[title, [sentences]], ...]``: two gold and eight distractor paragraphs). It becomes

* a FlashRAG row ``{"id", "question", "golden_answers": [answer], "metadata": {"type", "level",
  "supporting_facts": {"title", "sent_id"}, "data_source": "hotpotqa"}}``: the step reward and guidance read
  the supporting titles from it (``searchr1.data.supporting``), the policy never sees them;
* one passage per distinct context paragraph ``{"id", "contents": "\\"Title\\"\\ntext"}`` (the sentences
  joined), the corpus a BM25 index over the questions' own paragraphs is built from.

    rows = read_hotpotqa("shared/data/hotpotqa-sample/test.jsonl")
    corpus = hotpotqa_corpus(raw_rows)
    missing = missing_gold(rows, corpus)         # [(row id, title)] of gold paragraphs the corpus lacks
    print(missing_gold_line(missing, len(rows)) or "every gold paragraph is in the corpus")
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from searchr1.data.formats import DataError, jsonl_rows
from searchr1.data.supporting import supporting_titles, title_key

DATA_SOURCE = "hotpotqa"


class HotpotQAError(ValueError):
    """A row that is not HotpotQA's format; the message names the file and line."""


def _pairs(block: Any, second: str) -> list[tuple[str, Any]]:
    """``[(title, value), ...]`` from ``{"title": [...], second: [...]}`` or ``[[title, value], ...]``."""
    if isinstance(block, Mapping):
        return list(zip([str(t) for t in block.get("title") or []], block.get(second) or [], strict=False))
    if isinstance(block, list | tuple):
        return [
            (str(item[0]), item[1]) for item in block if isinstance(item, list | tuple) and len(item) == 2
        ]
    return []


def flashrag_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The FlashRAG form of one HotpotQA row (``KeyError`` for a missing field)."""
    facts = _pairs(row["supporting_facts"], "sent_id")
    return {
        "id": str(row["id"]),
        "question": str(row["question"]),
        "golden_answers": [str(row["answer"])],
        "metadata": {
            "type": str(row.get("type") or ""),
            "level": str(row.get("level") or ""),
            "supporting_facts": {"title": [t for t, _ in facts], "sent_id": [int(s) for _, s in facts]},
            "data_source": DATA_SOURCE,
        },
    }


def paragraphs(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A row's context paragraphs as ``(title, text)``."""
    return [
        (title, "".join(str(s) for s in sentences).strip())
        for title, sentences in _pairs(row.get("context"), "sentences")
    ]


def read_raw(path: str | Path) -> list[dict[str, Any]]:
    """The HotpotQA rows of a ``.jsonl`` (one row a line) or ``.json`` (a list) file."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        rows = json.loads(text)
        if not isinstance(rows, list):
            raise HotpotQAError(f"{path}: expected a JSON list of HotpotQA rows")
        return rows
    out = []
    for where, row in jsonl_rows(path):  # the project's line reader: a bad line comes back as its error
        if isinstance(row, DataError):
            raise HotpotQAError(f"{where}: not JSON ({str(row).removeprefix(f'{where}: invalid JSON: ')})")
        out.append(row)
    return out


REQUIRED = ("id", "question", "answer", "supporting_facts")


def read_hotpotqa(path: str | Path) -> list[dict[str, Any]]:
    """FlashRAG rows of a HotpotQA file; a row missing a field is named by its number and the fields."""
    out = []
    for n, row in enumerate(read_raw(path), start=1):
        missing = [k for k in REQUIRED if not isinstance(row, Mapping) or k not in row]
        if missing:
            raise HotpotQAError(f"{path}: row {n} is not a HotpotQA row (missing {', '.join(missing)})")
        out.append(flashrag_row(row))
    return out


def hotpotqa_corpus(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """One passage per distinct (title, text) context paragraph of ``rows``, in first-seen order."""
    seen: dict[tuple[str, str], None] = {}
    for row in rows:
        for title, text in paragraphs(row):
            if text:
                seen.setdefault((title, text), None)
    return [{"id": str(i), "contents": f'"{title}"\n{text}'} for i, (title, text) in enumerate(seen)]


def missing_gold(
    rows: Iterable[Mapping[str, Any]], corpus: Iterable[Mapping[str, Any]]
) -> list[tuple[str, str]]:
    """``(row id, title)`` for each supporting title of the FlashRAG ``rows`` that no passage of ``corpus``
    (``{"contents": "\"Title\"\ntext"}``) carries, in row order; titles compare by ``title_key``."""
    have = {title_key(str(p["contents"]).partition("\n")[0]) for p in corpus}
    return [
        (str(row.get("id")), title)
        for row in rows
        for title in supporting_titles(row.get("metadata") or {}, DATA_SOURCE)
        if title_key(title) not in have
    ]


def missing_gold_line(missing: Sequence[tuple[str, str]], questions: int) -> str | None:
    """One line naming the gold paragraphs a corpus lacks (the first three), None when it lacks none."""
    if not missing:
        return None
    rows = len({row for row, _ in missing})
    more = " ..." if len(missing) > 3 else ""
    shown = "; ".join(f"{row}: {title!r}" for row, title in missing[:3]) + more
    paragraphs = "1 gold paragraph" if len(missing) == 1 else f"{len(missing)} gold paragraphs"
    return (
        f"corpus: {paragraphs} of {rows} of the {questions} questions missing, so no search can find "
        f"{'it' if len(missing) == 1 else 'them'} ({shown})"
    )


def write_hotpotqa(inputs: Sequence[str | Path], out_dir: str | Path) -> dict[str, Path]:
    """``<stem>.jsonl`` (FlashRAG rows) per input file and ``corpus.jsonl`` over all of their paragraphs."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    raw_all: list[dict[str, Any]] = []
    for path in inputs:
        raw = read_raw(path)
        rows = read_hotpotqa(path)
        target = out / f"{Path(path).stem}.jsonl"
        target.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        written[Path(path).stem] = target
        raw_all.extend(raw)
    corpus = out / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in hotpotqa_corpus(raw_all)), encoding="utf-8"
    )
    written["corpus"] = corpus
    return written
