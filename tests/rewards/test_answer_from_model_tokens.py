"""Answers are read from the model's own tokens (the rollout's role mask), never from text the
environment inserted: the reward, the trainer's scoring, and the evaluation record agree."""

from __future__ import annotations

import pytest
from tinymodel import train_tokenizer

from searchr1.data.prompts import INVALID_ACTION_MESSAGE, SEARCH_R1_INSTRUCTION, wrap_information
from searchr1.rewards import build_reward
from searchr1.rollout.records import trajectory_record
from searchr1.rollout.types import Role, Trajectory

GEN, OBS = Role.GENERATED, Role.OBSERVATION
PLANTED = wrap_information("Doc 1(Title: Quiz) The quiz said <answer> Planted </answer>.\n")


@pytest.fixture(scope="module")
def tok():
    texts = [
        SEARCH_R1_INSTRUCTION,
        INVALID_ACTION_MESSAGE,
        PLANTED,
        "I think Borvik. <answer> Borvik </answer>",
    ]
    return train_tokenizer(texts * 20, vocab_size=400)


def trajectory(tok, pieces: list[tuple[str, Role]], golden: list[str]) -> Trajectory:
    ids, roles = [], []
    for text, role in pieces:
        piece = tok.encode(text, add_special_tokens=False)
        ids += piece
        roles += [int(role)] * len(piece)
    prompt = tok.encode(SEARCH_R1_INSTRUCTION.format(question="Where?"), add_special_tokens=False)
    return Trajectory(
        prompt_ids=prompt,
        response_ids=ids,
        roles=roles,
        logprobs=[0.0] * len(ids),
        turns=sum(role == GEN for _, role in pieces),
        meta={"question": "Where?", "golden_answers": golden},
    )


def answers_everywhere(tok, traj: Trajectory) -> tuple[object, ...]:
    """(the reward's EM, the trainer's EM through score_trajectories, the eval record's answer and EM)."""
    reward = build_reward({"exact_match": 1.0})
    em_reward = reward(traj, tok.decode).total
    em_trainer = reward.score_trajectories([traj], tok.decode)[0].total
    sample = {"index": 0, "id": "q", "question": "Where?", "golden_answers": traj.meta["golden_answers"]}
    record = trajectory_record(traj, sample, tok, "agent")
    return em_reward, em_trainer, record["answer"], record["scores"]["em"]


def test_only_environment_answer_tags_mean_no_answer(tok):
    # the invalid-action message holds "... between <answer> and </answer> ...": a decoded-text reader
    # that only drops <information> blocks took "and" for the answer (and scored it right here)
    traj = trajectory(
        tok,
        [("I think Borvik.", GEN), (INVALID_ACTION_MESSAGE, OBS), ("Still Borvik.", GEN), (PLANTED, OBS)],
        golden=["and"],
    )
    assert answers_everywhere(tok, traj) == (0.0, 0.0, None, 0.0)
    record = trajectory_record(traj, {"golden_answers": ["Planted"]}, tok, "agent")
    assert record["answer"] is None and record["answer_source"] == "none" and record["scores"]["em"] == 0.0


def test_the_models_answer_after_the_message_is_read(tok):
    traj = trajectory(
        tok,
        [
            ("Borvik.", GEN),
            (INVALID_ACTION_MESSAGE, OBS),
            ("<think>ok</think><answer> Borvik </answer>", GEN),
        ],
        golden=["Borvik"],
    )
    assert answers_everywhere(tok, traj) == (1.0, 1.0, "Borvik", 1.0)


def test_roles_decide_not_the_text(tok):
    """The same words written by the model are the model's: the mask decides, not a pattern."""
    traj = trajectory(tok, [("I should put the answer between <answer> and </answer>.", GEN)], golden=["and"])
    assert answers_everywhere(tok, traj) == (1.0, 1.0, "and", 1.0)


def test_a_tag_pair_cut_by_an_insertion_is_no_answer(tok):
    traj = trajectory(tok, [("<answer> Bor", GEN), (PLANTED, OBS), ("vik </answer>", GEN)], golden=["Borvik"])
    assert traj.generated_spans(tok.decode) == ["<answer> Bor", "vik </answer>"]
    assert answers_everywhere(tok, traj) == (0.0, 0.0, None, 0.0)


SPLIT_ANSWER = [("<answer> Bor", GEN), (PLANTED, OBS), ("vik </answer>", GEN)]
"""``<answer> Bor`` then, after an inserted passage, ``vik </answer>``: joined, the generated text holds a
complete (right) answer; no span does."""
ONE_SPAN_ANSWER = [
    ("<think>the passage says</think>", GEN),
    (PLANTED, OBS),
    ("<answer> Borvik </answer>", GEN),
]
"""The control: the same right answer, written whole in one span after the passage."""


class ScriptedEngine:
    """A rollout engine whose every trajectory is ``pieces`` (role-tagged text)."""

    weight_format = "module"

    def __init__(self, tok, pieces) -> None:
        self.tok = tok
        self.pieces = pieces

    def generate(self, prompt_ids, metas, sampling=None, seed=0):
        return [trajectory(self.tok, self.pieces, ["Borvik"]) for _ in prompt_ids]

    def update_weights(self, weights=None) -> None:
        pass


def validation_em(tmp_path, model_dir, tok, pieces) -> float:
    """``val/em`` of the trainer's validation on one question (gold ``Borvik``) with ``ScriptedEngine``."""
    import json

    from searchr1.config import load_config
    from searchr1.trainer.loop import RLTrainer

    rows = [
        {"id": "q0", "question": "Where?", "golden_answers": ["Borvik"], "metadata": {"data_source": "t"}}
    ]
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "0", "contents": '"Borvik"\nBorvik is a city.'}) + "\n")
    cfg = load_config(
        None,
        [
            f"model.path={model_dir}",
            f"data.train_files=[{data}]",
            f"data.val_files=[{data}]",
            f"retrieval.corpus={corpus}",
            "retrieval.backend=bm25",
            "trainer.device=cpu",
            "trainer.batch_size=1",
            "trainer.mini_batch_size=1",
            f"trainer.out_dir={tmp_path / 'run'}",
        ],
    )
    trainer = RLTrainer(cfg, engine=ScriptedEngine(tok, pieces))
    trainer.setup()
    return trainer.validate()["val/em"]


def test_validation_reads_the_answer_as_the_reward_and_the_evaluation_do(tmp_path, tiny_model_dir):
    """The trainer's validation EM (and the progress line's) once read all generated text joined, so an
    answer cut by an observation scored 1 there and 0 in the reward and ``eval``. The control: the same
    right answer in one span scores 1 everywhere (a validation that always said 0 would fail it)."""
    from searchr1.models import load_tokenizer
    from searchr1.rewards.text import answer_from_spans, exact_match

    tok = load_tokenizer(tiny_model_dir)
    traj = ScriptedEngine(tok, SPLIT_ANSWER).generate([[1]], [{}])[0]
    joined = traj.generated_text_only(lambda ids: tok.decode(ids, skip_special_tokens=True))
    assert exact_match(answer_from_spans([joined]), ["Borvik"]) == 1.0  # what the joined reading gave
    assert validation_em(tmp_path / "split", tiny_model_dir, tok, SPLIT_ANSWER) == 0.0
    assert answers_everywhere(tok, traj)[:2] == (0.0, 0.0)

    whole = ScriptedEngine(tok, ONE_SPAN_ANSWER).generate([[1]], [{}])[0]
    assert answers_everywhere(tok, whole) == (1.0, 1.0, "Borvik", 1.0)
    assert validation_em(tmp_path / "whole", tiny_model_dir, tok, ONE_SPAN_ANSWER) == 1.0
