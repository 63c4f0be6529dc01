"""`searchr1 eval` end to end with the real model (SmolLM2-135M-Instruct) on the real NQ sample and
BM25 over the wiki-18 sample, in every mode: the paper-layout table, and replies without tags scored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from must_run import skip_or_fail

from searchr1.cli import main


def _sample_dir() -> Path | None:
    """The shared FlashRAG sample next to the checkout (``<ancestor>/shared/data/flashrag-sample``)."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "shared" / "data" / "flashrag-sample"
        if candidate.is_dir():
            return candidate
    return None


SAMPLE = _sample_dir()


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(SAMPLE is None, reason="the shared FlashRAG sample is not next to this checkout")
def test_every_mode_on_the_nq_sample_with_the_real_model(tmp_path, capsys):
    from searchr1.errors import ModelNotFoundError
    from searchr1.models import resolve_model
    from searchr1.rewards import normalize_answer

    try:
        resolve_model("smollm2-135m-instruct")
    except ModelNotFoundError as exc:
        skip_or_fail(f"the packaged model is not installed: {exc}")
    out = tmp_path / "ev"
    argv = ["eval", "--model", "smollm2-135m-instruct", "--template", "instruct",
            "--data", SAMPLE / "nq_test_sample.jsonl", "--corpus", SAMPLE / "wiki18_sample_corpus.jsonl",
            "--mode", "direct,cot,rag,agent", "--limit", "6", "--max-turns", "1",
            "--max-turn-tokens", "96", "--out", out]  # fmt: skip
    code = main([str(a) for a in argv])
    stdout = capsys.readouterr().out
    assert code == 0  # BM25 in memory: no search can fail

    lines = [x.split() for x in stdout.splitlines()]
    header = lines.index(["method", "nq", "avg"])
    rows = lines[header + 2 : header + 6]
    assert [r[0] for r in rows] == ["Direct", "CoT", "RAG", "Search-R1"]
    results = json.loads((out / "results.json").read_text())
    for row, mode in zip(rows, ("direct", "cot", "rag", "agent"), strict=True):
        em = results["summaries"][mode]["sources"]["nq"]["em"]
        assert row[1:] == [f"{em:.3f}", f"{em:.3f}"]  # one dataset: its average is itself
        assert results["summaries"][mode]["overall"]["n"] == 6

    # the instruct model answers in words, not tags: its replies are scored as they are
    direct = [json.loads(x) for x in (out / "direct" / "trajectories.jsonl").read_text().splitlines()]
    untagged = [r for r in direct if r["answer_source"] == "reply"]
    assert untagged, "SmolLM2 writes no <answer> tag under FlashRAG's prompt"
    for r in untagged:
        assert r["answer"] and "<|im_end|>" not in r["answer"]
        tokens = set(normalize_answer(r["answer"]).split())
        if any(set(normalize_answer(g).split()) & tokens for g in r["golden_answers"]):
            assert r["scores"]["f1"] > 0.0  # a reply that shares a word with the gold gets F1 for it
    # rag put the passages BM25 found for the question into the prompt
    rag = [json.loads(x) for x in (out / "rag" / "trajectories.jsonl").read_text().splitlines()]
    for r in rag:
        assert r["queries"] == [r["question"]] and len(r["documents"][0]) == 3
        assert f"Doc 1(Title: {r['documents'][0][0]['title']})" in r["segments"][0]["text"]
    # the agent is held to Search-R1's tags: without one, no answer
    agent = [json.loads(x) for x in (out / "agent" / "trajectories.jsonl").read_text().splitlines()]
    assert all((r["answer"] is None) == (r["answer_source"] == "none") for r in agent)
