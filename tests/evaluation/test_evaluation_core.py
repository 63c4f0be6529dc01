"""evaluate(): per-source metrics that agree with the trajectories on disk, the four modes, resuming,
failed searches retried, several modes in one table."""

from __future__ import annotations

import json
import re
import string
from collections import defaultdict
from pathlib import Path

import pytest
from evalworld import WORLD
from scripted_turns import FREE, ScriptedTurns

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
    evaluate,
    evaluate_modes,
    flatten_summary,
    format_summary_table,
)
from searchr1.evaluation.modes import DIRECT_SYSTEM
from searchr1.retrieval.base import SearchError
from searchr1.retrieval.bm25 import BM25Retriever
from searchr1.rollout.config import RolloutConfig
from searchr1.rollout.single_turn import SingleTurnEngine
from searchr1.rollout.steer import SteerRow


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
    from searchr1.rollout.hf import HFRolloutEngine

    model, tok = tiny
    cfg = RolloutConfig(
        max_turns=2, max_turn_tokens=32, max_obs_tokens=48, max_response_tokens=256, dtype="model"
    )
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


def _answer(generated: list[str], reply_fallback: bool) -> str | None:
    """The last <answer> inside one generated segment; for the baselines, else the reply itself."""
    for text in reversed(generated):
        found = re.findall(r"<answer>(.*?)</answer>", text, flags=re.S)
        if found:
            return found[-1].strip()
    if not reply_fallback:
        return None
    reply = re.sub(r"<\|[a-z_]+\|>", "", "".join(generated))  # special tokens are not the reply
    return " ".join(re.sub(r"<think>.*?(</think>|$)", " ", reply, flags=re.S).split())


def recompute(records: list[dict]) -> dict[str, dict[str, float]]:
    groups: dict[str, list[dict[str, float]]] = defaultdict(list)
    for r in records:
        generated = [s["text"] for s in r["segments"] if s["role"] == "generated"]
        ans = _answer(generated, reply_fallback=r["mode"] != "agent")
        assert ans == r["answer"], "the stored answer is read from the model's own tokens"
        golds = r["golden_answers"]
        row = {
            "em": float(ans is not None and any(_norm(ans) == _norm(g) for g in golds)),
            "sub_em": float(ans is not None and any(_norm(g) in _norm(ans) for g in golds)),
            "f1": max((_f1(ans, g) for g in golds), default=0.0) if ans is not None else 0.0,
            "valid_format": r["scores"]["valid_format"],
            "tagged": float(r["answer_source"] == "tag"),
            "searches": float(len(r["queries"])),
            "turns": float(r["turns"]),
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


class ForcedReply:
    """A steer that makes row i write ``replies[i]`` token by token and then EOS (a reply "model")."""

    def __init__(self, tokenizer, replies: list[str]):
        self.eos = tokenizer.eos_token_id
        self.ids = [tokenizer.encode(r, add_special_tokens=False) for r in replies]

    def __call__(self, rows, logits):
        out = logits.clone()
        for i, row in enumerate(rows):
            plan = self.ids[int(row.meta["index"])]
            pos = len(row.turn_ids)
            out[i] = float("-inf")
            out[i, plan[pos] if pos < len(plan) else self.eos] = 0.0
        return out


class FailingRetriever:
    """A search backend that is down."""

    calls = 0

    def search(self, queries, topk):
        FailingRetriever.calls += 1
        raise SearchError("connection refused")

    def close(self):
        pass


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
        assert r["answer_source"] == "tag" and r["search_failures"] == 0
    assert summary["overall"]["searches"] == pytest.approx(1.0)
    # scripted answers follow the Search-R1 structure, so the format check passes for every row
    assert summary["overall"]["valid_format"] == 1.0 and summary["overall"]["tagged"] == 1.0
    assert summary["overall"]["em"] == pytest.approx(3 / 6)  # the even samples give the golden answer
    flat = flatten_summary(summary)
    assert flat["val/synth/searches"] == summary["sources"]["synth"]["searches"]
    assert flat["val/all/search_failures"] == 0
    table = format_summary_table(summary)
    assert "synth" in table and "all" in table and "failed" in table.splitlines()[0]


def test_direct_cot_and_rag_modes(tiny, retriever, samples, tmp_path):
    model, tok = tiny
    engine = SingleTurnEngine(model, tok, max_new_tokens=6)
    summaries = {}
    for mode in ("direct", "cot", "rag"):
        summaries[mode] = evaluate(
            engine,
            samples,
            tokenizer=tok,
            mode=mode,
            retriever=retriever,
            batch_size=3,
            out_dir=tmp_path / mode,
        )
        records = read_records(tmp_path / mode)
        assert len(records) == len(samples)
        assert_summary_matches(summaries[mode], records)
        for r in records:
            assert r["turns"] == 1 and [s["role"] for s in r["segments"]] == ["prompt", "generated"]
            assert r["num_tokens"]["generated"] <= 6
            assert r["answer"] is not None, "a baseline's reply is scored even without an answer tag"
    assert (
        summaries["direct"]["overall"]["searches"] == 0.0 and summaries["rag"]["overall"]["searches"] == 1.0
    )
    for r in read_records(tmp_path / "direct"):
        prompt = r["segments"][0]["text"]
        assert DIRECT_SYSTEM in prompt and "Doc 1(" not in prompt and r["queries"] == []
    for r in read_records(tmp_path / "cot"):
        assert "<think>" in r["segments"][0]["text"] and r["queries"] == []
    for r, s in zip(read_records(tmp_path / "rag"), samples, strict=True):
        top = retriever.search([s["question"]], 3)[0]
        assert r["queries"] == [s["question"]]
        assert [h["title"] for h in r["documents"][0]] == [h.title for h in top]
        assert f"Doc 1(Title: {top[0].title})" in r["segments"][0]["text"]
    with pytest.raises(EvaluationError, match="rag"):
        evaluate(engine, samples, tokenizer=tok, mode="rag", batch_size=3)


def test_a_reply_without_tags_is_scored_and_a_tagged_one_by_its_tag(tiny, samples, tmp_path):
    """Forced replies: the golden answer bare, inside tags, inside a sentence, and a wrong one."""
    model, tok = tiny
    golds = [s["golden_answers"][0] for s in samples]
    replies = [
        golds[0],
        f"<think> easy </think> <answer> {golds[1]} </answer>",
        f"It is {golds[2]}.",
        "Nowhere",
        f"<answer> {golds[4]} </answer> and more",
        golds[5],
    ]
    engine = SingleTurnEngine(model, tok, max_new_tokens=24, steer=ForcedReply(tok, replies))
    summary = evaluate(engine, samples, tokenizer=tok, mode="direct", out_dir=tmp_path / "d")
    records = read_records(tmp_path / "d")
    assert [r["answer_source"] for r in records] == ["reply", "tag", "reply", "reply", "tag", "reply"]
    assert [r["scores"]["em"] for r in records] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert [r["scores"]["sub_em"] for r in records] == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    assert [r["finish_reason"] for r in records] == ["eos", "answer", "eos", "eos", "answer", "eos"]
    assert records[4]["segments"][-1]["text"].endswith("</answer>"), "the reply ends at </answer>"
    assert [r["scores"]["valid_format"] for r in records] == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert summary["overall"]["tagged"] == pytest.approx(2 / 6)
    assert_summary_matches(summary, records)
    # the agent is held to the tag: the same replies give no answer where there is no tag
    agent = evaluate(SingleTurnEngine(model, tok, 24, steer=ForcedReply(tok, replies)), samples,
                     tokenizer=tok, mode="agent")  # fmt: skip
    assert agent["overall"]["em"] == pytest.approx(2 / 6)


def test_single_turn_engine_stops_and_names_why(tiny, samples):
    model, tok = tiny
    replies = ["<answer> x </answer> more", "<search> q </search> more", "a b c d e f g h i j k l", "y"]
    engine = SingleTurnEngine(model, tok, max_new_tokens=8, steer=ForcedReply(tok, replies))
    metas = [{"index": i} for i in range(4)]
    prompts = [tok.encode("Question: q", add_special_tokens=False)] * 4
    trajs = engine.generate(prompts, metas)
    assert [t.finish_reason for t in trajs] == ["answer", "search", "length", "eos"]
    assert [t.truncated for t in trajs] == [False, False, True, False]
    assert all(t.turns == 1 and t.searches == 0 and set(t.roles) == {1} for t in trajs)
    assert len(trajs[2].response_ids) == 8
    assert all(len(t.logprobs) == len(t.response_ids) and max(t.logprobs) <= 0.0 for t in trajs)


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

    batches, starts = [], []
    resumed = evaluate(
        agent_engine(tiny, retriever),
        samples,
        tokenizer=tok,
        batch_size=2,
        out_dir=out,
        on_batch=batches.append,
        on_start=lambda done, total: starts.append((done, total)),
    )
    assert starts == [(4, 6)]
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
    with pytest.raises(EvaluationError, match="normalization"):
        evaluate(engine, samples[:2], tokenizer=tok, mode="direct", out_dir=out, normalization="unicode")
    summary = evaluate(engine, samples, tokenizer=tok, mode="direct", batch_size=2, out_dir=out, resume=False)
    assert summary["overall"]["n"] == len(samples) == len(read_records(out))


def test_failed_searches_are_counted_and_retried_on_resume(tiny, retriever, samples, tmp_path):
    model, tok = tiny
    engine = SingleTurnEngine(model, tok, max_new_tokens=3)
    out = tmp_path / "rag"
    down = evaluate(engine, samples, tokenizer=tok, mode="rag", retriever=FailingRetriever(), batch_size=4,
                    out_dir=out, search_retries=1)  # fmt: skip
    assert FailingRetriever.calls == 2 * 2, "two batches, each tried twice"
    assert down["overall"]["search_failures"] == 6 and down["sources"]["nq"]["search_failures"] == 3
    records = read_records(out)
    assert all(r["search_failures"] == 1 and r["documents"] == [[]] for r in records)
    assert "connection refused" in records[0]["search_errors"][0]
    assert "Doc 1(" not in records[0]["segments"][0]["text"]

    batches = []
    up = evaluate(engine, samples, tokenizer=tok, mode="rag", retriever=retriever, batch_size=4, out_dir=out,
                  on_batch=batches.append)  # fmt: skip
    assert sum(len(b.records) for b in batches) == 6, "every failed question is generated again"
    assert up["overall"]["search_failures"] == 0
    records = read_records(out)
    assert [r["index"] for r in records] == list(range(6)), "one line per question after the retry"
    assert all(r["documents"][0] for r in records)


def test_several_modes_give_one_table_in_the_papers_layout(tiny, retriever, samples, tmp_path):
    model, tok = tiny

    def engine_for(mode):
        if mode.name == "agent":
            return agent_engine(tiny, retriever)
        return SingleTurnEngine(model, tok, max_new_tokens=4)

    results = evaluate_modes("agent,direct,rag", engine_for, samples, tokenizer=tok, out_dir=tmp_path,
                             retriever=retriever, batch_size=3, settings={"model": "tiny"})  # fmt: skip
    assert results["modes"] == ["direct", "rag", "agent"]  # the paper's row order
    em = results["tables"]["em"]
    assert em["columns"] == ["nq", "synth", "avg"]  # benchmarks first, then others by name, then avg
    assert [r["method"] for r in em["rows"]] == ["Direct", "RAG", "Search-R1"]
    for row in em["rows"]:
        per_source = results["summaries"][row["mode"]]["sources"]
        assert row["values"][:2] == [per_source["nq"]["em"], per_source["synth"]["em"]]
        assert row["values"][2] == pytest.approx((row["values"][0] + row["values"][1]) / 2)  # macro avg
    assert em["rows"][2]["values"][2] == pytest.approx(0.5)
    table = (tmp_path / "table.md").read_text()
    assert table.count("\n| ") == 4 and "| Search-R1 |" in table
    assert json.loads((tmp_path / "results.json").read_text())["tables"]["em"] == em

    # a later run of one more mode into the same folder adds its row to the same table
    more = evaluate_modes("cot", engine_for, samples, tokenizer=tok, out_dir=tmp_path, batch_size=3,
                          settings={"model": "tiny"})  # fmt: skip
    assert more["modes"] == ["direct", "cot", "rag", "agent"]
    other = evaluate_modes("cot", engine_for, samples, tokenizer=tok, out_dir=tmp_path / "x", batch_size=3,
                           settings={"model": "another"})  # fmt: skip
    assert other["modes"] == ["cot"]


def test_bad_input_is_one_line_naming_it(tiny, samples):
    model, tok = tiny
    engine = SingleTurnEngine(model, tok, max_new_tokens=2)
    with pytest.raises(
        EvaluationError, match=r"^--mode bogus: unknown mode; expected one of direct, cot, rag, agent$"
    ):
        evaluate(engine, samples, tokenizer=tok, mode="bogus")
    broken = [dict(samples[0]), {k: v for k, v in samples[1].items() if k != "golden_answers"}]
    with pytest.raises(EvaluationError, match=r"^sample 1 \(id synth_1\): no golden_answers"):
        evaluate(engine, broken, tokenizer=tok, mode="direct")


def test_progress_is_shown_while_a_batch_decodes(tiny, retriever, samples):
    """The eval monitor hears the engine's tokens (``on_tokens``), never its logits."""
    import io

    from searchr1.evaluation.progress import Monitor

    stream = io.StringIO()
    monitor = Monitor(stream=stream, interval_s=0.0)
    monitor.start("agent", 0, len(samples))
    evaluate(
        agent_engine(tiny, retriever), samples, tokenizer=tiny[1], mode="agent", batch_size=3,
        on_tokens=monitor.on_tokens, on_batch=monitor.batch,
    )  # fmt: skip
    lines = stream.getvalue().splitlines()
    beats = [line for line in lines if "decoding" in line]
    assert monitor.steps > 0 and len(beats) == monitor.steps  # interval 0: a line per decoding step
    assert "[eval agent] 0/6 questions | decoding 3 rows, step 1" in beats[0]
    assert lines[-1].startswith("[eval agent] 6/6 questions")
