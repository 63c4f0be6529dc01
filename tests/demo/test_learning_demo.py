"""The learning demo end to end: summary.json, the search-disabled control, the reward curve."""

from __future__ import annotations

import json

import pytest
from sample_data import flashrag_sample

from searchr1.demo.console import format_by_relation, format_results
from searchr1.demo.runs import NoSearch, run_learning_demo
from searchr1.demo.settings import DemoSettings
from searchr1.demo.summary import before_after, relation_of

TINY_RL = [
    "trainer.total_steps=2",
    "trainer.batch_size=2",
    "trainer.mini_batch_size=2",
    "rollout.n=3",  # the recipe's guidance takes two places of a failed group
    "trainer.progress_bar=false",
    "warmstart.epochs=1",  # the warm start alone, then RL from it
    "warmstart.max_examples=4",
    "warmstart.batch_size=2",
]


def test_no_search_backend_finds_nothing():
    assert NoSearch().search(["Alice Verdan", "Borvik"], topk=3) == [[], []]


HOTPOTQA_ROWS = [
    {
        "id": "h1", "question": "Where was the founder of the Quillon Press born?", "answer": "Borvik",
        "type": "bridge", "level": "hard",
        "supporting_facts": {"title": ["Quillon Press", "Alice Verdan"], "sent_id": [0, 0]},
        "context": {"title": ["Quillon Press", "Alice Verdan", "Ost"],
                    "sentences": [["The Quillon Press was founded by Alice Verdan."],
                                  ["Alice Verdan was born in Borvik.", " She wrote poems."],
                                  ["The Ost is a river."]]},
    },
    {
        "id": "h2", "question": "Which is longer, the Ost or the Tarn?", "answer": "Ost", "type": "comparison",
        "level": "hard", "supporting_facts": [["Ost", 0], ["Tarn", 0]],
        "context": [["Ost", ["The Ost is a river 900 km long."]], ["Tarn", ["The Tarn is a river 40 km long."]]],
    },
]  # fmt: skip
"""Two questions in HotpotQA's own row format (both forms of its fields), for the transfer row."""


def tiny_settings(model_dir, hotpotqa_folder) -> DemoSettings:
    nq_folder = flashrag_sample()
    return DemoSettings(
        seeds=(3,),
        num_test=4,
        model=str(model_dir),
        template="base",
        zero_shot_template="instruct",  # differs from the run's prompt: the zero-shot run is planned
        nq_sample=str(nq_folder) if nq_folder else "",
        hotpotqa_sample=str(hotpotqa_folder),
        overrides=TINY_RL,
        world={"num_entities": 40},
        outcome_only=False,  # the ablations' runs: test_demo_command.py
        no_guidance=False,
        rl_only=False,
    )


@pytest.fixture(scope="module")
def hotpotqa_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hotpotqa")
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in HOTPOTQA_ROWS))
    return folder


@pytest.fixture(scope="module")
def tiny_demo(tmp_path_factory, tiny_model_dir, hotpotqa_folder):
    """The tiny demo run once, one process, one thread: (its folder, its summary)."""
    import torch

    out = tmp_path_factory.mktemp("demo")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return out, run_learning_demo(out, tiny_settings(tiny_model_dir, hotpotqa_folder), log=lambda s: None)
    finally:
        torch.set_num_threads(before)


def test_tiny_run_writes_the_summary_with_both_runs(tiny_demo, tiny_model_dir):
    nq_folder = flashrag_sample()
    tmp_path, summary = tiny_demo
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    row = on_disk["seeds"]["3"]
    for key in ("em_before", "em_after", "searches_before", "searches_after"):
        assert 0.0 <= row[key] <= 10.0
        assert key in row["no_search"]
    runs = row["runs"]
    assert all(runs[mode]["steps"] == 2 for mode in ("search", "no_search", "zero_shot"))
    assert "zero_shot_em_after" in row and "zero_shot_em_after" in summary["mean"]
    # single- and multi-hop apart: every test question in one of them, EM as the overall one
    by_hops = runs["search"]["by_hops"]
    assert set(by_hops) <= {"single-hop", "multi-hop"} and sum(g["questions"] for g in by_hops.values()) == 4
    for when in ("before", "after"):
        weighted = sum(g[f"em_{when}"] * g["questions"] for g in by_hops.values()) / 4
        assert weighted == pytest.approx(row[f"em_{when}"])
    if nq_folder is not None:  # the first seed's search policy on the real NQ sample, before and after
        nq_records = (tmp_path / "seed_3" / "search" / "eval_nq_after" / "trajectories.jsonl").read_text()
        questions = (nq_folder / "nq_test_sample.jsonl").read_text().split("\n")
        assert len(nq_records.splitlines()) == sum(1 for q in questions if q.strip())
        assert set(runs["search"]["nq"]) == {"before", "warm", "after"} and "nq" not in runs["no_search"]
    # the transfer row: the HotpotQA questions before and after, searching their own paragraphs
    hotpot = runs["search"]["hotpotqa"]
    for when in ("before", "warm", "after"):
        recs = [json.loads(x) for x in (tmp_path / "seed_3" / "search" / f"eval_hotpotqa_{when}" /
                "trajectories.jsonl").read_text().splitlines()]  # fmt: skip
        assert sorted(r["id"] for r in recs) == ["h1", "h2"]
        assert hotpot[when]["em"] == pytest.approx(sum(r["scores"]["em"] for r in recs) / 2)
        titles = {h["title"] for r in recs for hits in r["documents"] for h in hits}
        assert titles <= {"Quillon Press", "Alice Verdan", "Ost", "Tarn"}  # BM25 over their own paragraphs
    assert "hotpotqa" not in runs["no_search"]
    # the decision probe, before and after: every two-hop test question on the search side, the one-hop
    # ones whose passage holds the answer on the answer side; the flat keys are those sides' means
    probe = json.loads((tmp_path / "seed_3" / "search" / "probe.json").read_text())
    test_rows = _test_rows(tmp_path)
    two_hop = [q["question"] for q in test_rows if q["metadata"]["type"] != "single"]
    one_hop = [q["question"] for q in test_rows if q["metadata"]["type"] == "single"]
    assert (
        two_hop and one_hop
    )  # the seeded world (seed 3, 40 entities) asks both kinds in its 4 test questions
    for when in ("before", "after"):
        rows = probe[when]["rows"]
        search = [r for r in rows if r["side"] == "search"]
        answer = [r for r in rows if r["side"] == "answer"]
        assert [r["question"] for r in search] == two_hop and len(search) + len(answer) == len(rows)
        assert answer and {r["question"] for r in answer} <= set(one_hop)
        assert probe[when]["answer_side"]["left_out"] == len(one_hop) - len(answer)
        p_search = sum(r["p_search"] for r in search) / len(search)
        p_answer = sum(1 - r["p_search"] for r in answer) / len(answer)
        assert row[f"probe_search_{when}"] == pytest.approx(p_search) == row[f"probe_{when}"]
        assert row[f"probe_answer_{when}"] == pytest.approx(p_answer)
        assert row[f"decision_{when}"] == pytest.approx((p_search + p_answer) / 2)
    table = next(line for line in format_results(summary).splitlines() if "warm start + RL" in line)
    for key in ("probe_search", "probe_answer", "decision"):
        assert f"{row[key + '_before']:.2f} -> {row[key + '_after']:.2f}" in table
    assert len(runs["search"]["reward_curve"]) == 2
    # the warm start alone, evaluated between the starting model and RL, and RL started from its policy
    warm_recs = [json.loads(x) for x in (tmp_path / "seed_3" / "search" / "eval_warm" /
                 "trajectories.jsonl").read_text().splitlines()]  # fmt: skip
    assert len(warm_recs) == 4 and row["em_warm"] == runs["search"]["warm"]["em"]
    assert runs["search"]["warm"]["em"] == pytest.approx(sum(r["scores"]["em"] for r in warm_recs) / 4)
    assert runs["search"]["warm_start"]["examples"] == 4 and runs["search"]["warm_start"]["done"]
    rl_config = (tmp_path / "seed_3" / "search" / "config.yaml").read_text()
    assert str(tmp_path / "seed_3" / "search" / "warmstart" / "model") in rl_config
    assert "warm start alone" in format_results(summary) and "warm start + RL" in format_results(summary)
    # the control's searches, if any, returned nothing
    for line in (
        (tmp_path / "seed_3" / "no_search" / "eval_after" / "trajectories.jsonl").read_text().splitlines()
    ):
        assert all(hits == [] for hits in json.loads(line)["documents"])
    assert summary["starting_model"]["path"] == str(tiny_model_dir)
    assert "search disabled" in format_results(summary)
    # per kind of question: every test question counted once, EM as the overall one
    by_relation = runs["search"]["by_relation"]
    assert sum(r["questions"] for r in by_relation.values()) == 4
    for when in ("before", "after"):
        weighted = sum(r[f"em_{when}"] * r["questions"] for r in by_relation.values()) / 4
        assert weighted == pytest.approx(row[f"em_{when}"])


def _test_rows(folder) -> list[dict]:
    rows = (folder / "seed_3" / "world" / "test.jsonl").read_text().splitlines()
    return [json.loads(x) for x in rows if x.strip()][:4]


def _record(index: int, em: float) -> str:
    """An evaluation record (the fields ``evaluation.aggregate`` reads)."""
    scores = {"em": em, "sub_em": em, "f1": em, "valid_format": 1.0}
    return json.dumps({"index": index, "data_source": "synth", "scores": scores, "searches": 1 + int(em),
                       "turns": 2, "truncated": False}) + "\n"  # fmt: skip


def test_before_after_joins_questions_and_trajectories_by_index(tmp_path):
    samples = [{"metadata": {"relation": r}} for r in ("founder", "birth_city", "founder", "birth_city")]
    before, after = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    before.write_text(_record(0, 0.0) + _record(1, 1.0) + _record(2, 0.0) + _record(3, 0.0))
    after.write_text(_record(3, 1.0) + _record(2, 1.0) + _record(0, 1.0) + _record(1, 0.0))  # any order
    table = before_after(samples, before, after, relation_of)
    assert table == {
        "birth_city": {
            "questions": 2,
            "em_before": 0.5,
            "em_after": 0.5,
            "searches_before": 1.5,
            "searches_after": 1.5,
        },
        "founder": {
            "questions": 2,
            "em_before": 0.0,
            "em_after": 1.0,
            "searches_before": 1.0,
            "searches_after": 2.0,
        },
    }
    summary = {
        "seeds": {
            "0": {"runs": {"search": {"by_relation": table}}},
            "1": {"runs": {"search": {"by_relation": table}}},
        }
    }
    lines = {line.split()[0]: line for line in format_by_relation(summary).splitlines()[1:]}
    assert lines["founder"].split()[1:] == ["0", "->", "4", "of", "4"]
    assert lines["birth_city"].split()[1:] == ["2", "->", "2", "of", "4"]


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.timeout(3600)
def test_quick_demo_learns_to_search(tmp_path):
    """``searchr1 demo --quick`` (seed 0, SmolLM2-135M-Instruct, ~30 minutes on 2 AVX2 cores): the warm start,
    stopped by its held-out check, lifts held-out EM far above the starting model's and searches on two-hop
    questions more than on one-hop ones; the policy that ships (after RL, or the warm start when validation
    keeps it) is not below the warm start (a statistical claim about one seed: marked ``learning``; measured:
    EM 0.000 -> 0.958, searches 1.03 / 1.92, benchmarks/results/demo_quick_r7.json)."""
    settings = DemoSettings.quick_settings()
    summary = run_learning_demo(tmp_path, settings, log=lambda s: None)
    run = summary["seeds"]["0"]["runs"]["search"]
    assert run["warm"]["em"] >= run["before"]["em"] + 0.5
    hops = run["by_hops_warm"]
    assert hops["multi-hop"]["searches_after"] > hops["single-hop"]["searches_after"]
    assert run["after"]["em"] >= run["warm"]["em"]
    assert run["after"]["searches"] >= 0.5


def test_parallel_runs_give_the_serial_summary(tmp_path, tiny_demo, tiny_model_dir, hotpotqa_folder):
    """``--jobs 2``: the runs go to two worker processes (one thread each) and the summary holds exactly
    the numbers of the one-process run with one thread (same seeds, same arithmetic)."""
    from dataclasses import replace

    serial = tiny_demo[1]
    settings = replace(tiny_settings(tiny_model_dir, hotpotqa_folder), jobs=2)
    parallel = run_learning_demo(tmp_path, settings, log=lambda s: None)
    a, b = serial["seeds"]["3"], parallel["seeds"]["3"]
    assert list(b["runs"]) == list(a["runs"]) == ["search", "no_search", "zero_shot"]
    compared = [k for k in a if k not in ("runs", "no_search") and "seconds" not in k]
    assert len(compared) > 20
    for key in compared:
        assert b[key] == a[key], key
    assert b["runs"]["search"].get("nq") == a["runs"]["search"].get("nq")
    assert b["runs"]["search"]["hotpotqa"] == a["runs"]["search"]["hotpotqa"]
