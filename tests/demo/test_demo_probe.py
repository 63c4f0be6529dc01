"""The starting-model probe: what its counts mean, and the probe run on a tiny model."""

from __future__ import annotations

import json
import math

import pytest
from tiny_pretrain import TINY_PRETRAIN

from searchr1.demo_probe import (
    ANSWER_KINDS,
    answer_of,
    answers_given_passage,
    classify_answer,
    gold_given_passage,
    passage_context,
    probe_policy,
    summarise,
    tag_choices,
)
from searchr1.learning_demo import DemoSettings, main
from searchr1.rollout.types import Trajectory


def _traj(text: str, searches: int = 0, passages: tuple[str, ...] = (), gold: str = "Zemoor") -> Trajectory:
    hits = [[{"title": "T", "text": p}] for p in passages]
    return Trajectory(
        prompt_ids=[1], response_text=text, searches=searches, documents=hits, meta={"golden_answers": [gold]}
    )


def test_summarise_counts_each_behaviour():
    info = "\n\n<information>Doc 1(Title: T) T is based in Zemoor.</information>\n\n"
    trajectories = [
        _traj("<search> T </search>" + info + "<answer> Zemoor </answer>", 1, ("T is based in Zemoor.",)),
        _traj("<search> T </search>" + info + "<search> U </search>", 1, ("T is based in Zemoor.",)),
        _traj(
            "<search> U </search>\n\n<information>Doc 1(Title: U) U is a city.</information>",
            1,
            ("U is a city.",),
        ),
        _traj(" <answer> T </answer>"),
        # a search whose observation never came (the budget ran out): an answer before it does not count
        _traj("<answer> T <search> T </search>", 1, ()),
        _traj("<search> T </search>\n\n<information></information>\n\n<answer> V </answer>", 1),
    ]
    result = summarise(trajectories, rewards=[1.0, 0.0, 0.0, 0.0, 0.0, 0.5], groups=[0, 0, 1, 1, 2, 2])
    assert result.rollouts == 6
    assert result.first_search == 4 / 6 and result.first_answer == 2 / 6
    assert result.searched == 5 / 6
    assert result.retrieved_answer == 2 / 6  # the third search found a passage without the answer
    assert result.answered_after_search == 2 / 6  # the first and the last (an empty block still counts)
    assert result.rewarded == 2 / 6 and result.mean_reward == 0.25
    assert result.groups_with_signal == 2 / 3


def test_summarise_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="as many rewards"):
        summarise([_traj("<answer> x </answer>")], rewards=[], groups=[0])


def test_probe_samples_the_demo_rollouts_of_a_model(tmp_path):
    from searchr1.pretrain import pretrain

    model = pretrain(tmp_path / "model", TINY_PRETRAIN)
    settings = DemoSettings(pretrain=TINY_PRETRAIN, world={"num_entities": 40}, overrides=["rollout.n=3"])
    result = probe_policy(model, settings, seed=3, questions=2)
    assert result.rollouts == 6  # 2 questions x rollout.n
    assert result.first_search + result.first_answer <= 1.0
    assert result.groups_with_signal in (0.0, 0.5, 1.0) and (result.rewarded > 0) == (
        result.groups_with_signal > 0
    )
    assert probe_policy(model, settings, seed=3, questions=2) == result  # seeded: the same rollouts again
    with pytest.raises(ValueError, match="questions must be between"):
        probe_policy(model, settings, seed=3, questions=10_000)


def test_demo_probe_flag_writes_probe_json(tmp_path, monkeypatch, capsys):
    import searchr1.learning_demo as demo

    real = demo.DemoSettings
    monkeypatch.setattr(
        demo, "DemoSettings", lambda **kw: real(pretrain=TINY_PRETRAIN, world={"num_entities": 40}, **kw)
    )
    assert main(["--out", str(tmp_path), "--model-cache", "", "--probe", "1", "rollout.n=2"]) == 0
    probe = json.loads((tmp_path / "probe.json").read_text())
    assert probe["rollouts"] == 2 and probe["model"] == str(tmp_path / "starting-model")
    printed = capsys.readouterr().out
    assert "reward > 0" in printed and "first piece" in printed
    shares = probe["answers_given_passage"]
    assert sum(r["questions"] for r in shares) == 4  # 4 x --probe questions
    for row in shares:
        assert set(row["picked"]) == set(ANSWER_KINDS) and sum(row["picked"].values()) == pytest.approx(1.0)
    tags = probe["tag_choices"]
    assert tags["questions"] == 4 and set(tags["first"]) == {"answer", "search", "information"}
    assert 0.0 < sum(tags["after_passage"].values()) <= 1.0
    gold = probe["gold_given_passage"]
    assert sum(r["questions"] for r in gold) == 4


def test_passage_context_is_the_rollouts_context_after_a_search():
    from searchr1.data.prompts import fill_template, format_observation_docs, wrap_information
    from searchr1.retrieval.base import Hit

    template, question = "Q: {question}\n", "Where was Ann Lee born"
    context = passage_context(template, question, "Ann Lee", "Ann Lee was born in Zemoor.")
    # the rollout: the prompt, the model's turn, the observation of the hit it got, the next turn
    observation = wrap_information(
        format_observation_docs([Hit("d1", "Ann Lee", "Ann Lee was born in Zemoor.", 1.0)])
    )
    assert (
        context == fill_template(template, question) + "<search> Ann Lee </search>" + observation + "<answer>"
    )
    assert context.startswith(
        "Q: Where was Ann Lee born?\n<search> Ann Lee </search>\n\n<information>Doc 1(Title: Ann Lee)"
    )
    opened = passage_context(template, question, "Ann Lee", "Ann Lee was born in Zemoor.", then="<")
    assert opened + "answer>" == context  # the tag's name left to the model


@pytest.mark.parametrize(
    ("continuation", "answer"),
    [
        (" Zemoor </answer>", "Zemoor"),
        (" <answer> Zemoor </answer>", "Zemoor"),  # a re-opened tag: the last opening counts
        (" Kalvania <answer> Zemoor </answer>", "Zemoor"),
        (" Zemoor </search> <answer> x </answer>", None),  # the turn ends at </search>: no answer
        (" Zemoor", None),  # unclosed
    ],
)
def test_answer_of_reads_a_turn_as_the_rollout_does(continuation, answer):
    assert answer_of(continuation) == answer


class _ScriptedModel:
    """A stand-in language model that always writes the same text, and records what it was shown."""

    def __init__(self, tokenizer, text: str):
        self.tokenizer, self.text, self.shown = tokenizer, text, []

    def eval(self):
        return self

    def generate(self, ids, **_):
        import torch

        self.shown.append(self.tokenizer.decode(ids[0]))
        tail = torch.tensor(self.tokenizer(self.text, add_special_tokens=False).input_ids)
        return torch.cat([ids, tail.expand(ids.shape[0], -1)], dim=1)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from searchr1.pretrain import pretrain

    return pretrain(tmp_path_factory.mktemp("probe") / "model", TINY_PRETRAIN)


@pytest.mark.parametrize(
    ("text", "score"),
    [
        (" {city} </answer>", 1.0),
        (" born in {city} </answer>", 0.5),
        (" {city}", 0.0),
        (" {city} </search>", 0.0),
    ],
)
def test_answers_given_passage_scores_each_kind_of_question(tiny_model_dir, monkeypatch, text, score):
    """A scripted policy that answers every question with one city scores, per kind of question,
    the share whose gold answer is that city (half as much, F1 0.5, for a three-word answer holding
    it; nothing for an unclosed answer or a turn that ends another way); it is shown each question's
    context with the asked entity's passage."""
    import searchr1.models as models
    from searchr1.data.synth import SynthConfig, generate_world
    from searchr1.pretrain import DEMO_INSTRUCTION
    from searchr1.retrieval.corpus import split_contents

    knobs = {"num_entities": 40, "hop_mix": {"single": 1.0}}
    world = generate_world(SynthConfig(seed=3, **knobs))
    asked = world.splits["train"][:30]
    city = next(q["golden_answers"][0] for q in asked if q["metadata"]["relation"] == "birth_city")
    tokenizer = models.load_tokenizer(tiny_model_dir)
    scripted = _ScriptedModel(tokenizer, text.format(city=city))
    monkeypatch.setattr(models, "load_model", lambda _: scripted)
    rows = answers_given_passage(tiny_model_dir, seed=3, questions=30, samples=2, world=knobs)
    assert sum(r.questions for r in rows) == 30
    for row in rows:
        golds = [q["golden_answers"][0] for q in asked if q["metadata"]["relation"] == row.relation]
        assert row.questions == len(golds)
        assert row.mean_f1 == pytest.approx(score * golds.count(city) / len(golds))
        assert row.exact == pytest.approx((score == 1.0) * golds.count(city) / len(golds))
    assert any(r.mean_f1 > 0 for r in rows) == (score > 0)
    for row in rows:  # what each answer was, by an independent reading of the world
        of_kind = [q for q in asked if q["metadata"]["relation"] == row.relation]
        expected = dict.fromkeys(ANSWER_KINDS, 0)
        for q in of_kind:
            entity = world.entities[q["metadata"]["hops"][0]]
            if score == 0.0:
                expected["no_answer"] += 1
            elif city in q["golden_answers"]:
                expected["asked" if score == 1.0 else "partial"] += 1
            elif score == 0.5:
                expected["invented"] += 1  # "born in X" is no value of any passage
            elif entity.name == city:
                expected["subject"] += 1  # a question about the city itself
            elif city in map(str, entity.attrs.values()):
                expected["other_value"] += 1  # a person born there, a company based there
            else:
                expected["invented"] += 1
        assert row.picked == pytest.approx({k: v / len(of_kind) for k, v in expected.items()})
    if score == 1.0:  # the world has answers of each of these kinds for this city
        assert any(r.picked["other_value"] > 0 for r in rows) and any(r.picked["subject"] > 0 for r in rows)
    first = asked[0]["metadata"]["hops"][0]
    passage = next(
        split_contents(r["contents"])[1] for r in world.corpus if split_contents(r["contents"])[0] == first
    )
    assert scripted.shown[0] == passage_context(DEMO_INSTRUCTION, asked[0]["question"], first, passage)


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        ("Zemoor", "asked"),
        ("the zemoor", "asked"),  # SQuAD normalisation
        ("1901", "other_value"),
        ("Ann Lee", "subject"),
        ("Zemor", "invented"),  # a misspelt copy
        ("Ann Leeds", "invented"),
        ("born in Zemoor", "partial"),  # holds the gold answer among other words
        ("Ann Zemoor", "partial"),
        (None, "no_answer"),
    ],
)
def test_classify_answer_tells_the_asked_value_from_the_subject_other_values_and_inventions(answer, kind):
    assert classify_answer(answer, ["Zemoor"], "Ann Lee", ["Zemoor", "1901", "poet"]) == kind


class _TagModel:
    """A stand-in language model that, after the last ``<`` of its input, writes ``answer`` when the
    context holds a passage (a search result ``Doc 1(Title: ...)``) and ``search`` otherwise, with
    probability 1 at each of the name's tokens."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def eval(self):
        return self

    def __call__(self, input_ids):
        import types

        import torch

        ids = input_ids[0].tolist()
        opener = self.tokenizer.convert_tokens_to_ids("<")
        last = max(i for i, t in enumerate(ids) if t == opener)
        context = self.tokenizer.decode(ids[: last + 1])
        tag = "answer" if "Doc 1(Title:" in context else "search"
        wanted = self.tokenizer(context + tag, add_special_tokens=False).input_ids
        logits = torch.full((1, len(ids), len(self.tokenizer)), -1e4)
        for position in range(last, min(len(ids), len(wanted) - 1)):
            logits[0, position, wanted[position + 1]] = 0.0
        return types.SimpleNamespace(logits=logits)


def test_tag_choices_reads_the_whole_tag_name_after_the_prompt_and_after_the_passage(
    tiny_model_dir, monkeypatch
):
    import searchr1.models as models

    tokenizer = models.load_tokenizer(tiny_model_dir)
    monkeypatch.setattr(models, "load_model", lambda _: _TagModel(tokenizer))
    scripted = tag_choices(tiny_model_dir, seed=3, questions=5, world={"num_entities": 40})
    assert scripted.questions == 5
    assert scripted.first == pytest.approx({"answer": 0.0, "search": 1.0, "information": 0.0})
    assert scripted.after_passage == pytest.approx({"answer": 1.0, "search": 0.0, "information": 0.0})


def test_tag_choices_needs_a_tokenizer_that_splits_the_tag_opener(tmp_path):
    from searchr1.models import build_tiny_model, train_tokenizer

    whole_tags = train_tokenizer(["a b c <answer> d </answer>"] * 20, vocab_size=300, tag_tokens=True)
    whole_tags.save_pretrained(tmp_path)
    build_tiny_model(whole_tags).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="does not split '<'"):
        tag_choices(tmp_path, seed=3, questions=1, world={"num_entities": 40})


class _NextTokenModel:
    """A stand-in language model that, at every position, gives probability 0.6 to the token that
    actually follows in its input when ``knows`` says so (given that token's text) and 0.4 to token 0,
    else probability 1 to token 0."""

    def __init__(self, tokenizer, knows):
        self.tokenizer, self.knows = tokenizer, knows

    def eval(self):
        return self

    def __call__(self, input_ids):
        import types

        import torch

        ids = input_ids[0].tolist()
        logits = torch.full((1, len(ids), len(self.tokenizer)), -1e4)
        logits[0, :, 0] = 0.0
        for position, following in enumerate(ids[1:]):
            if following != 0 and self.knows(self.tokenizer.decode([following])):
                logits[0, position, 0] = math.log(0.4)
                logits[0, position, following] = math.log(0.6)
        return types.SimpleNamespace(logits=logits)


@pytest.mark.parametrize("knows", ["everything", "digits"])
def test_gold_given_passage_tells_starting_the_answer_from_copying_it(tiny_model_dir, monkeypatch, knows):
    """A model that gives the next token probability 0.6 (its most likely one) starts every gold answer
    with that probability and copies all of it; one that does so only for digits starts exactly the
    answers that begin with a digit (years) and copies their digits but no word piece."""
    import searchr1.models as models
    from searchr1.data.synth import SynthConfig, generate_world

    knobs = {"num_entities": 40, "hop_mix": {"single": 1.0}}
    asked = generate_world(SynthConfig(seed=3, **knobs)).splits["train"][:30]
    tokenizer = models.load_tokenizer(tiny_model_dir)
    rule = (lambda text: True) if knows == "everything" else (lambda text: text.strip().isdigit())
    monkeypatch.setattr(models, "load_model", lambda _: _NextTokenModel(tokenizer, rule))
    rows = gold_given_passage(tiny_model_dir, seed=3, questions=30, world=knobs)
    assert sum(r.questions for r in rows) == 30
    assert any(r.later_pieces.get("digit") for r in rows) and any(r.later_pieces.get("word") for r in rows)
    for row in rows:
        golds = [q["golden_answers"][0] for q in asked if q["metadata"]["relation"] == row.relation]
        assert row.questions == len(golds)
        if knows == "everything":
            assert row.first_piece == pytest.approx(0.6)
            assert all(v == 1.0 for v in row.later_accuracy.values())
        else:
            assert row.first_piece == pytest.approx(0.6 * sum(g[0].isdigit() for g in golds) / len(golds))
            if row.later_pieces.get("digit"):
                assert row.later_accuracy["digit"] == 1.0
            if row.later_pieces.get("word"):
                assert row.later_accuracy["word"] == 0.0
