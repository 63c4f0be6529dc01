"""The starting-model probe: what its counts mean, and the probe run on a tiny model."""

from __future__ import annotations

import json

import pytest
from tiny_pretrain import TINY_PRETRAIN

from searchr1.demo_probe import probe_policy, summarise
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
        _traj("<search> U </search>\n\n<information>Doc 1(Title: U) U is a city.</information>", 1, ("U is a city.",)),
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
    assert result.groups_with_signal in (0.0, 0.5, 1.0) and (result.rewarded > 0) == (result.groups_with_signal > 0)
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
    assert "reward > 0" in capsys.readouterr().out
