"""evaluate(): per-source metrics that agree with the trajectories on disk, the three modes, resuming."""

from __future__ import annotations

import json
import re
import string
from collections import defaultdict
from pathlib import Path

import pytest
from evalworld import WORLD

from searchr1.data.prompts import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
)
from searchr1.evaluation import (
    SUMMARY_FILE,
    TRAJECTORIES_FILE,
    EvaluationError,
    SingleTurnEngine,
    evaluate,
    flatten_summary,
    format_table,
)
from searchr1.retrieval.bm25 import BM25Retriever
from searchr1.rollout.config import RolloutConfig
from searchr1.rollout.steer import FREE, ScriptedTurns, SteerRow


class ScriptBySample(ScriptedTurns):
    """A Search-R1-shaped policy from the tiny model: sample i searches ``i % 3`` times for its
    entity's title, then answers, with the golden answer when i is even.

    Forward passes are real; only the tag and content positions are forced, so the searches go
    through BM25, observations are masked, and the answers are scored like any model's."""

    def __init__(self, tokenizer, fixed_index: int | None = None):
        super().__init__(tokenizer)
        self.fixed_index = fixed_index
        """Act as sample ``fixed_index`` for every row (for callers whose metas carry other indices)."""

    def plan(self, row):
        key = (row.index, row.turn)
        if key in self._plans:
            return self._plans[key]
        i = row.index
        _, title, _, _, answer, _ = (
            WORLD[i]
            if self.fixed_index is not None
            else next(w for w in WORLD if w[3] == row.meta["question"])
        )
        enc = lambda text: self.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        think = self.tag_ids[THINK_OPEN] + [FREE] * 3 + self.tag_ids[THINK_CLOSE]
        if row.turn < i % 3:
            plan = think + self.tag_ids[SEARCH_OPEN] + enc(f" {title} ") + self.tag_ids[SEARCH_CLOSE]
        elif row.turn == i % 3:
            content = enc(f" {answer} ") if i % 2 == 0 else [FREE] * 2
            plan = think + self.tag_ids[ANSWER_OPEN] + content + self.tag_ids[ANSWER_CLOSE]
        else:
            plan = [self.eos_id]
        self._plans[key] = plan
        return plan

    def __call__(self, rows, logits):
        # key plans by sample index (unique across batches), mark every row as scripted
        rows = [
            SteerRow(
                int(r.meta["index"]) if self.fixed_index is None else self.fixed_index,
                {**r.meta, "script": True},
                r.turn,
                r.turn_ids,
            )
            for r in rows
        ]
        return super().__call__(rows, logits)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from searchr1.models import load_model, load_tokenizer

    return load_model(tiny_model_dir).eval(), load_tokenizer(tiny_model_dir)


@pytest.fixture
def samples(world_files):
    rows = []
    for source in ("synth", "nq"):
        for line in world_files[source].read_text().splitlines():
            r = json.loads(line)
            rows.append({**r, "data_source": source})
    return rows


@pytest.fixture
def retriever(world_files):
    r = BM25Retriever.from_corpus(world_files["corpus"])
    yield r
    r.close()


def agent_engine(tiny, retriever):
    from searchr1.rollout.engine import HFRolloutEngine

    model, tok = tiny
    cfg = RolloutConfig(max_turns=2, max_turn_tokens=32, max_obs_tokens=48, max_response_tokens=256, dtype="model")
    return HFRolloutEngine(
        model, tok, retriever, cfg, topk=2, steer=ScriptBySample(tok)
    )  # fresh per engine: plans are cached


# --- an independent scorer: SQuAD normalisation and metrics written out here -------------------------


def _norm(s: str) -> str:
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _f1(pred: str, gold: str) -> float:
    p, g = _norm(pred).split(), _norm(gold).split()
    common = sum(min(p.count(w), g.count(w)) for w in set(p))
    if not common:
        return 0.0
    prec, rec = common / len(p), common / len(g)
    return 2 * prec * rec / (prec + rec)


def _last_answer(generated: str) -> str | None:
    found = re.findall(r"<answer>(.*?)</answer>", generated, flags=re.S)
    return found[-1].strip() if found else None


def recompute(records: list[dict]) -> dict[str, dict[str, float]]:
    groups: dict[str, list[dict[str, float]]] = defaultdict(list)
    for r in records:
        generated = "".join(s["text"] for s in r["segments"] if s["role"] == "generated")
        ans = _last_answer(generated)
        assert ans == r["answer"], "the stored answer is the last <answer> of the model's own tokens"
        golds = r["golden_answers"]
        row = {
            "em": float(ans is not None and any(_norm(ans) == _norm(g) for g in golds)),
            "sub_em": float(ans is not None and any(_norm(g) in _norm(ans) for g in golds)),
            "f1": max((_f1(ans, g) for g in golds), default=0.0) if ans is not None else 0.0,
            "searches": float(len(r["queries"])),
            "turns": float(r["turns"]),
            "valid_format": r["scores"]["valid_format"],
            "truncated": float(r["truncated"]),
        }
        groups[r["data_source"]].append(row)
        groups["all"].append(row)
    return {k: {m: sum(x[m] for x in v) / len(v) for m in v[0]} | {"n": len(v)} for k, v in groups.items()}


def assert_summary_matches(summary: dict, records: list[dict]) -> None:
    again = recompute(records)
    for source, row in summary["sources"].items():
        for metric, value in again[source].items():
            assert row[metric] == pytest.approx(value), (source, metric)
    for metric, value in again["all"].items():
        assert summary["overall"][metric] == pytest.approx(value), ("all", metric)


def read_records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / TRAJECTORIES_FILE).read_text().splitlines()]


# --- tests ------------------------------------------------------------------------------------------


def test_agent_summary_matches_trajectories_and_records_the_searches(tiny, retriever, samples, tmp_path):
    out = tmp_path / "agent"
    summary = evaluate(
        agent_engine(tiny, retriever), samples, tokenizer=tiny[1], mode="agent", batch_size=4, out_dir=out
    )
    assert json.loads((out / SUMMARY_FILE).read_text()) == json.loads(json.dumps(summary))
    records = read_records(out)
    assert [r["index"] for r in records] == list(range(len(samples)))
    assert set(summary["sources"]) == {"synth", "nq"}
    assert summary["sources"]["synth"]["n"] == 3 and summary["overall"]["n"] == 6
    assert_summary_matches(summary, records)

    # the script asks for index % 3 searches: the records hold those queries, the hits and masked observations
    for r in records:
        assert r["searches"] == len(r["queries"]) == len(r["documents"]) == r["index"] % 3
        roles = [s["role"] for s in r["segments"]]
        assert roles[0] == "prompt" and "generated" in roles
        assert roles.count("observation") >= r["searches"]
        observed = "".join(s["text"] for s in r["segments"] if s["role"] == "observation")
        for hits in r["documents"]:
            for h in hits:
                assert f"(Title: {h['title']})" in observed
        assert r["question"] in r["segments"][0]["text"]
    assert summary["overall"]["searches"] == pytest.approx(1.0)
    # scripted answers follow the Search-R1 structure, so the format check passes for every row
    assert summary["overall"]["valid_format"] == 1.0
    flat = flatten_summary(summary)
    assert flat["val/synth/searches"] == summary["sources"]["synth"]["searches"]
    assert "synth" in format_table(summary) and "all" in format_table(summary)


def test_direct_and_rag_modes(tiny, retriever, samples, tmp_path):
    model, tok = tiny
    engine = SingleTurnEngine(model, tok, max_new_tokens=6)
    direct = evaluate(engine, samples, tokenizer=tok, mode="direct", batch_size=3, out_dir=tmp_path / "d")
    rag = evaluate(
        engine, samples, tokenizer=tok, mode="rag", retriever=retriever, batch_size=3, out_dir=tmp_path / "r"
    )
    for summary, folder in ((direct, tmp_path / "d"), (rag, tmp_path / "r")):
        records = read_records(folder)
        assert len(records) == len(samples)
        assert_summary_matches(summary, records)
        for r in records:
            assert r["turns"] == 1 and [s["role"] for s in r["segments"]] == ["prompt", "generated"]
            assert r["num_tokens"]["generated"] <= 6
    assert direct["overall"]["searches"] == 0.0 and rag["overall"]["searches"] == 1.0
    for r in read_records(tmp_path / "d"):
        assert "Doc 1(" not in r["segments"][0]["text"] and r["queries"] == []
    for r, s in zip(read_records(tmp_path / "r"), samples, strict=True):
        top = retriever.search([s["question"]], 3)[0]
        assert r["queries"] == [s["question"]]
        assert [h["title"] for h in r["documents"][0]] == [h.title for h in top]
        assert f"Doc 1(Title: {top[0].title})" in r["segments"][0]["text"]
    with pytest.raises(EvaluationError, match="rag"):
        evaluate(engine, samples, tokenizer=tok, mode="rag", batch_size=3)


class Interrupt(Exception):
    pass


def test_resume_after_interruption_gives_the_same_summary(tiny, retriever, samples, tmp_path):
    tok = tiny[1]
    full = evaluate(
        agent_engine(tiny, retriever), samples, tokenizer=tok, batch_size=2, out_dir=tmp_path / "full"
    )

    def stop_after_two(progress):
        if progress.batch == 1:
            raise Interrupt

    out = tmp_path / "resumed"
    with pytest.raises(Interrupt):
        evaluate(
            agent_engine(tiny, retriever),
            samples,
            tokenizer=tok,
            batch_size=2,
            out_dir=out,
            on_batch=stop_after_two,
        )
    assert len(read_records(out)) == 4 and not (out / SUMMARY_FILE).exists()
    with open(out / TRAJECTORIES_FILE, "a") as fh:  # a crash in the middle of writing a line
        fh.write('{"index": 4, "id": "nq_4", "quest')

    batches = []
    resumed = evaluate(
        agent_engine(tiny, retriever),
        samples,
        tokenizer=tok,
        batch_size=2,
        out_dir=out,
        on_batch=batches.append,
    )
    assert [len(b.records) for b in batches] == [2], "only the missing samples are generated"
    assert resumed == full
    assert read_records(out) == read_records(tmp_path / "full")


def test_resume_refuses_a_different_run_and_no_resume_starts_over(tiny, samples, tmp_path):
    model, tok = tiny
    engine = SingleTurnEngine(model, tok, max_new_tokens=4)
    out = tmp_path / "e"
    evaluate(engine, samples[:2], tokenizer=tok, mode="direct", batch_size=2, out_dir=out)
    with pytest.raises(EvaluationError, match="num_samples"):
        evaluate(engine, samples, tokenizer=tok, mode="direct", batch_size=2, out_dir=out)
    with pytest.raises(EvaluationError, match="model"):
        evaluate(engine, samples[:2], tokenizer=tok, mode="direct", out_dir=out, settings={"model": "other"})
    summary = evaluate(engine, samples, tokenizer=tok, mode="direct", batch_size=2, out_dir=out, resume=False)
    assert summary["overall"]["n"] == len(samples) == len(read_records(out))


def test_single_turn_cut_keeps_the_answer_and_nothing_after(tiny):
    model, tok = tiny
    engine = SingleTurnEngine(model, tok)
    ids = tok("<think> x </think> <answer> Borvik </answer> and more", add_special_tokens=False)["input_ids"]
    cut, reason = engine._cut(ids)
    assert reason == "answer" and tok.decode(cut).endswith("</answer>")
    eos = tok.eos_token_id
    cut, reason = engine._cut([*ids[:3], eos, *ids[3:]])
    assert reason == "eos" and cut == [*ids[:3], eos]
    cut, reason = engine._cut(ids[:4])
    assert reason == "length" and cut == ids[:4]
