"""The run report's HTML, read without a browser: what it embeds, and that it needs no network."""

from __future__ import annotations

import itertools
import json
import re
from html.parser import HTMLParser

import pytest
from evalworld import scripted_records, write_eval_folder, write_run_folder

from searchr1.report import ReportError, build_report
from searchr1.report.charts import nice_ticks
from searchr1.report.loading import read_metrics


class Page(HTMLParser):
    """Collects tags, attributes, chart titles and the embedded data of a report page."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.data_json = ""
        self._in_data = False
        self.h3: list[str] = []
        self._in_h3 = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        self._in_data = tag == "script" and a.get("id") == "report-data"
        self._in_h3 = tag == "h3"

    def handle_endtag(self, tag):
        self._in_data = self._in_data and tag != "script"
        self._in_h3 = False

    def handle_data(self, data):
        if self._in_data:
            self.data_json += data
        if self._in_h3:
            self.h3.append(data.strip())


def parse(path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def test_run_report_has_curves_tables_and_the_latest_trajectories(tmp_path, tiny_tokenizer):
    run = write_run_folder(tmp_path / "run", tiny_tokenizer, steps=12, val_every=5)
    path = build_report(run)
    assert path == run / "report.html"
    page = parse(path)
    titles = " | ".join(page.h3)
    for title in (
        "Reward and its components",
        "Validation EM",
        "Searches per trajectory",
        "Response length",
        "KL to the reference policy",
        "Entropy",
        "Clip fraction",
        "Step time split",
        "critic/*",
    ):
        assert title in titles
    svgs = [a for t, a in page.tags if t == "svg"]
    polylines = [a for t, a in page.tags if t == "polyline"]
    assert len(svgs) >= 9 and polylines
    html = path.read_text()
    # the reward chart's legend lists the mean first, then the components
    legend = re.search(
        r"Reward and its components</h3>.*?<div class=\"legend\">(.*?)</div>", html, re.S
    ).group(1)
    assert re.findall(r">(reward/[a-z_]+)<", legend) == ["reward/mean", "reward/exact_match", "reward/format"]
    # validation table of the latest step (10) and EM per step
    assert "validation at step 10" in titles and "EM per validation step" in titles
    data = json.loads(page.data_json)["trajectories"]
    expected = scripted_records(tiny_tokenizer, 10)
    assert [t["question"] for t in data] == [r["question"] for r in expected]
    assert [t["correct"] for t in data] == [r["correct"] for r in expected]
    assert [t["searches"] for t in data] == [r["searches"] for r in expected]
    assert {t["source"] for t in data} == {"synth", "nq"}
    roles = {seg[0] for t in data for seg in t["segments"]}
    assert roles == {"prompt", "generated", "observation"}


def test_report_needs_no_network(tmp_path, tiny_tokenizer):
    run = write_run_folder(tmp_path / "run", tiny_tokenizer, steps=6, val_every=3)
    page = parse(build_report(run))
    for tag, attrs in page.tags:
        assert "src" not in attrs, f"<{tag}> loads {attrs['src']}"
        assert tag != "link", "no stylesheet links: styles are inline"
        href = attrs.get("href", "")
        assert not href or href.startswith("#"), href
    assert "@import" not in path_text(run) and "url(" not in path_text(run)


def path_text(run):
    return (run / "report.html").read_text()


def test_eval_folder_report_and_hostile_text(tmp_path, tiny_tokenizer):
    records = scripted_records(tiny_tokenizer, 0)
    records[0]["question"] = "</script><script>alert(1)</script> <!-- & <b>bold</b>"
    folder = write_eval_folder(tmp_path / "ev", records, mode="rag")
    path = build_report(folder, out=tmp_path / "page.html", max_trajectories=4)
    html = path.read_text()
    assert "Training curves" not in html and "mode: rag" in html
    assert "</script><script>alert(1)" not in html
    page = parse(path)
    data = json.loads(page.data_json)["trajectories"]
    assert len(data) == 4 and data[0]["question"] == records[0]["question"]
    assert "first 4 of 6" in html


def test_folder_without_results_is_refused_with_what_was_expected(tmp_path):
    with pytest.raises(ReportError, match=r"metrics\.jsonl"):
        build_report(tmp_path)
    with pytest.raises(ReportError, match="not found"):
        build_report(tmp_path / "missing")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n{"step": 2, "rew')
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1.0]  # a line being written
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ReportError, match=r"metrics.jsonl:2"):
        build_report(tmp_path)


@pytest.mark.parametrize(("lo", "hi"), [(0.0, 1.0), (0.013, 0.021), (120.0, 156.0), (-3.0, 7.5), (5.0, 5.0)])
def test_nice_ticks_cover_the_range_with_round_steps(lo, hi):
    ticks = nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi
    steps = {round(b - a, 10) for a, b in itertools.pairwise(ticks)}
    assert len(steps) == 1
    (step,) = steps
    mantissa = step / 10 ** int(f"{step:e}".split("e")[1])
    assert round(mantissa, 6) in (1.0, 2.0, 5.0)


def test_report_of_a_real_training_run(trained_run):
    """The trainer's own files: metrics.jsonl (curves, logged validation) and its per-step samples."""
    path = build_report(trained_run)
    page = parse(path)
    titles = " | ".join(page.h3)
    for title in (
        "Reward and its components",
        "Validation EM",
        "Searches per trajectory",
        "Entropy",
        "Step time split",
        "validation at step 3 (from metrics.jsonl)",
    ):
        assert title in titles
    logged = [json.loads(x) for x in (trained_run / "trajectories.jsonl").read_text().splitlines()]
    data = json.loads(page.data_json)["trajectories"]
    assert [t["question"] for t in data] == [r["question"] for r in logged]
    assert [t["step"] for t in data] == [r["step"] for r in logged] and {1, 3} <= {t["step"] for t in data}
    for t, r in zip(data, logged, strict=True):
        # the trainer logs exact per-token roles (the eval layout), not roles recovered from text
        assert not t["text_roles"]
        assert [seg[0] for seg in t["segments"]] == [s["role"] for s in r["segments"]]
        assert t["segments"][0][0] == "prompt" and "generated" in {seg[0] for seg in t["segments"]}
        generated = sum(seg[2] for seg in t["segments"] if seg[0] == "generated")
        assert generated == r["num_tokens"]["generated"] > 0
        assert t["source"] == r["data_source"] and t["id"].startswith(f"step {r['step']}: ")


def test_multi_mode_eval_folder_shows_the_papers_table_and_every_mode(tmp_path, tiny_tokenizer):
    from searchr1.evaluation.runner import write_results

    out = tmp_path / "ev"
    summaries = {}
    for mode, step in (("agent", 0), ("direct", 1)):  # direct gets the other half of the answers right
        records = [{**r, "mode": mode} for r in scripted_records(tiny_tokenizer, step)]
        write_eval_folder(out / mode, records, mode=mode)
        (out / mode / "eval_state.json").write_text(json.dumps({"mode": mode}))
        summaries[mode] = json.loads((out / mode / "summary.json").read_text())
    write_results(out, summaries, {})
    page = parse(build_report(out))
    html = (out / "report.html").read_text()
    assert "EM per dataset" in page.h3 and "F1 per dataset" in page.h3
    assert [h for h in page.h3 if "per data source" in h] == [
        "direct per data source (mode: direct)",
        "agent per data source (mode: agent)",
    ]
    rows = re.findall(
        r"<tr><td>(Direct|Search-R1)</td><td>([0-9.]+)</td><td>([0-9.]+)</td><td>([0-9.]+)</td>", html
    )
    assert [r[0] for r in rows[:2]] == ["Direct", "Search-R1"]  # the paper's row order
    for label, nq, synth, avg in rows[:2]:
        mode = "direct" if label == "Direct" else "agent"
        src = summaries[mode]["sources"]
        assert (float(nq), float(synth)) == (round(src["nq"]["em"], 3), round(src["synth"]["em"], 3))
        assert float(avg) == round((src["nq"]["em"] + src["synth"]["em"]) / 2, 3)
    data = json.loads(page.data_json)["trajectories"]
    assert sorted({t["mode"] for t in data}) == ["agent", "direct"] and len(data) == 12
