"""The synthetic world: determinism, answerability by following the hops, splits, knobs, BM25."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from searchr1.data.synth import SynthConfig, generate_world, write_world

SMALL = SynthConfig(num_entities=120, num_train=300, num_val=40, num_test=60, seed=7)


@pytest.fixture(scope="module")
def world():
    return generate_world(SMALL)


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_same_seed_gives_byte_identical_files_and_another_seed_differs(tmp_path):
    a = write_world(generate_world(SMALL), tmp_path / "a")
    b = write_world(generate_world(SMALL), tmp_path / "b")
    c = write_world(generate_world(SynthConfig(**{**SMALL.__dict__, "seed": 8})), tmp_path / "c")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "corpus.jsonl",
        "test.jsonl",
        "train.jsonl",
        "val.jsonl",
    ]
    for name in a:
        assert a[name].read_bytes() == b[name].read_bytes(), name
    assert a["corpus"].read_bytes() != c["corpus"].read_bytes()
    assert a["train"].read_bytes() != c["train"].read_bytes()


def test_files_follow_wiki18_and_flashrag_shapes(tmp_path):
    paths = write_world(generate_world(SMALL), tmp_path)
    corpus = _read(paths["corpus"])
    assert [r["id"] for r in corpus] == [str(i) for i in range(len(corpus))]
    for row in corpus:
        assert set(row) == {"id", "contents"}
        title, text = row["contents"].split("\n", 1)
        assert title.startswith('"') and title.endswith('"') and len(title) > 2 and text
    for split in ("train", "val", "test"):
        rows = _read(paths[split])
        assert rows, split
        assert len({r["id"] for r in rows}) == len(rows)
        for r in rows:
            assert set(r) == {"id", "question", "golden_answers", "metadata"}
            assert r["metadata"]["data_source"] == "synth"
            assert r["metadata"]["type"] in ("single", "bridge", "comparison")
            assert isinstance(r["golden_answers"], list) and len(r["golden_answers"]) == 1
            # short questions, 1-3 word answers: what a tiny model can learn
            assert 1 <= len(r["golden_answers"][0].split()) <= 3, r
            assert len(r["question"].split()) <= 14, r


def _passages(world, title: str) -> str:
    texts = world.passages_of(title)
    assert texts, f"no passage titled {title!r}"
    return " ".join(texts)


_YEAR = re.compile(r"(?:born in \w+ in|founded in) (\d{4})")


def test_every_golden_answer_is_recoverable_by_following_the_hops(world):
    for split, rows in world.splits.items():
        for q in rows:
            hops, answer, kind = q["metadata"]["hops"], q["golden_answers"][0], q["metadata"]["type"]
            if kind == "single":
                assert answer in _passages(world, hops[0]), q
            elif kind == "bridge":
                assert len(hops) == 2
                assert hops[1] in _passages(world, hops[0]), q  # hop 1 names the bridge entity
                assert answer in _passages(world, hops[1]), q  # hop 2 holds the answer
            else:
                years = []
                for h in hops:
                    found = _YEAR.findall(_passages(world, h))
                    assert found, (split, q, h)
                    years.append(int(found[0]))
                assert years[0] != years[1]
                assert answer == hops[years.index(min(years))], q
                assert all(h in q["question"] for h in hops)


def test_test_questions_ask_about_entities_never_asked_about_in_training(world):
    train_entities = {h for q in world.splits["train"] for h in q["metadata"]["hops"]}
    for split in ("val", "test"):
        for q in world.splits[split]:
            assert set(q["metadata"]["hops"]) - train_entities, (split, q)
    test_q = {q["question"] for q in world.splits["test"]}
    assert not test_q & {q["question"] for q in world.splits["train"]}


def test_hop_mix_and_sizes_are_respected(world):
    train = world.splits["train"]
    assert len(train) == SMALL.num_train and len(world.splits["test"]) == SMALL.num_test
    share = {t: sum(q["metadata"]["type"] == t for q in train) / len(train) for t in SMALL.hop_mix}
    for t, want in SMALL.hop_mix.items():
        assert abs(share[t] - want) < 0.1, share
    only_single = generate_world(SynthConfig(num_entities=60, hop_mix={"single": 1.0}, num_train=50, seed=1))
    assert {q["metadata"]["type"] for s in only_single.splits.values() for q in s} == {"single"}


def test_distractor_density_and_passage_length_knobs():
    def shared_surnames(density: float) -> int:
        w = generate_world(SynthConfig(num_entities=200, distractor_density=density, seed=2))
        surnames = [e.name.split()[-1] for e in w.entities.values() if e.kind == "person"]
        return len(surnames) - len(set(surnames))

    assert shared_surnames(0.0) == 0
    assert shared_surnames(0.6) > 20

    def mean_words(fill: int) -> float:
        w = generate_world(SynthConfig(num_entities=60, filler_sentences=fill, seed=2))
        return sum(len(r["contents"].split()) for r in w.corpus) / len(w.corpus)

    assert mean_words(6) > mean_words(0) + 20


def test_bad_knobs_are_rejected_with_the_field_name():
    with pytest.raises(ValueError, match="hop_mix"):
        generate_world(SynthConfig(hop_mix={"trivia": 1.0}))
    with pytest.raises(ValueError, match="num_entities"):
        generate_world(SynthConfig(num_entities=3))
    with pytest.raises(ValueError, match="distractor_density"):
        generate_world(SynthConfig(distractor_density=1.5))


def test_bm25_finds_the_needed_passage_in_top3_for_most_single_hop_questions(world, tmp_path):
    from searchr1.retrieval import BM25Retriever

    paths = write_world(world, tmp_path)
    retriever = BM25Retriever.from_corpus(paths["corpus"])
    questions = [q for s in ("train", "test") for q in world.splits[s] if q["metadata"]["type"] == "single"]
    results = retriever.search([q["question"] for q in questions], topk=3)
    found = sum(
        q["metadata"]["hops"][0] in {h.title for h in hits}
        for q, hits in zip(questions, results, strict=True)
    )
    assert found / len(questions) >= 0.9, found / len(questions)
    # bridge questions: the first hop (named in the question) is found too
    bridges = [q for q in world.splits["train"] if q["metadata"]["type"] == "bridge"]
    results = retriever.search([q["question"] for q in bridges], topk=3)
    found = sum(
        q["metadata"]["hops"][0] in {h.title for h in hits} for q, hits in zip(bridges, results, strict=True)
    )
    assert found / len(bridges) >= 0.8, found / len(bridges)


def test_output_does_not_depend_on_the_python_hash_seed(tmp_path):
    import os
    import subprocess
    import sys

    code = (
        "import sys; from searchr1.data.synth import SynthConfig, generate_world, write_world; "
        "write_world(generate_world(SynthConfig(num_entities=60, num_train=80, seed=5)), sys.argv[1])"
    )
    for hash_seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run([sys.executable, "-c", code, str(tmp_path / hash_seed)], check=True, env=env)
    for name in ("corpus.jsonl", "train.jsonl", "val.jsonl", "test.jsonl"):
        assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "12345" / name).read_bytes(), name
