"""``data.max_train_samples``: a run trains on the first N questions only, so that they come back."""

from __future__ import annotations

import pytest
import rlworld

from searchr1.trainer.loop import RLTrainer


def test_a_small_pool_brings_its_questions_back(tiny_model_dir, tmp_path):
    world = rlworld.write_world(tmp_path / "world")
    cfg = rlworld.load(
        world, tiny_model_dir, tmp_path / "run", data__max_train_samples=3, trainer__total_steps=3,
        trainer__batch_size=2, trainer__mini_batch_size=2,
    )  # fmt: skip
    trainer = RLTrainer(cfg)
    trainer.setup()
    first = [q for q, _ in rlworld.QUESTIONS[:3]]  # the file's first three questions, in order
    assert [s.question for s in trainer.train_samples] == first
    seen = []
    for _ in range(3):
        trainer.train_step()
        seen += [(t.meta["sample_index"], t.meta["question"]) for t in trainer._last_trajs]
    assert len(seen) == 3 * 2 * cfg.rollout.n  # 6 questions drawn from a pool of 3
    assert all(question == first[index] for index, question in seen)  # each index is the pool's question
    assert {question for _, question in seen} == set(first)  # and every pool question came back
    trainer.close()


def test_a_negative_pool_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"data\.max_train_samples: must be >= 0"):
        rlworld.load(rlworld.write_world(tmp_path / "w"), tiny_model_dir, tmp_path / "r", data__max_train_samples=-1)
