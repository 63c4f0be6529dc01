"""The Python API ``SearchR1Trainer`` over the same configuration as ``searchr1 train``."""

from __future__ import annotations

from pathlib import Path

import pytest
import rlworld
import torch

from searchr1 import SearchR1Trainer


def _fast(world) -> dict:
    return {
        "data.template": str(world["template"]),
        "rollout.max_turn_tokens": 6,
        "rollout.max_response_tokens": 40,
        "trainer.progress_bar": False,
        "trainer.log_backends": ["jsonl", "tensorboard"],
        "trainer.save_every": 0,
        "trainer.device": "cpu",
    }


def test_api_trains_with_the_seed_example(tiny_model_dir, tmp_path):
    from searchr1.retrieval.bm25 import BM25Retriever

    world = rlworld.write_world(tmp_path / "world")
    retriever = BM25Retriever.from_corpus(world["corpus"])
    trainer = SearchR1Trainer(
        model_name=str(tiny_model_dir),
        search_backend=retriever,
        rl_algorithm="rloo",
        reward_config={"correct_answer": 10.0, "search_penalty": -0.1, "invalid_format": -5.0},
        max_search_turns=1,
        group_size=2,
        learning_rate=1e-3,
        output_dir=tmp_path / "run",
        overrides=_fast(world),
    )
    summary = trainer.train(train_data=str(world["train"]), num_iterations=2, batch_size=2)
    assert summary["step"] == 2
    assert trainer.cfg.algorithm.advantage == "rloo" and trainer.cfg.rollout.max_turns == 1
    assert trainer.trainer.retriever is retriever
    last = summary["last"]
    for component in ("correct_answer", "search_penalty", "invalid_format"):
        assert f"reward/{component}" in last
    assert last["reward/mean"] == pytest.approx(
        last["reward/correct_answer"] + last["reward/search_penalty"] + last["reward/invalid_format"]
    )
    assert list((tmp_path / "run/tensorboard").glob("events.out.tfevents.*"))
    folder = trainer.save(tmp_path / "export")
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(folder)
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, trainer.model.state_dict()[key])
    from searchr1.data.trained_template import find_trained_template

    carried = find_trained_template(folder)  # the run's template file, copied in: eval and ask use it
    assert carried is not None and carried.recorded == str(world["template"])
    assert (
        Path(carried.template).parent == folder
        and Path(carried.template).read_text() == world["template"].read_text()
    )


def test_api_presets_and_errors(tmp_path):
    ppo = SearchR1Trainer(model_name="tiny", rl_algorithm="ppo", search_backend="http://127.0.0.1:8000")
    assert (ppo.cfg.algorithm.advantage, ppo.cfg.algorithm.use_kl_in_reward, ppo.cfg.rollout.n) == (
        "gae",
        True,
        1,
    )
    assert (ppo.cfg.retrieval.backend, ppo.cfg.retrieval.url) == ("http", "http://127.0.0.1:8000")
    grpo = SearchR1Trainer(config="grpo_qwen2.5_3b", overrides={"trainer.total_steps": 3})
    assert (grpo.cfg.model.path, grpo.cfg.trainer.total_steps, grpo.cfg.rollout.n) == (
        "Qwen/Qwen2.5-3B",
        3,
        5,
    )
    with pytest.raises(ValueError, match="rl_algorithm"):
        SearchR1Trainer(rl_algorithm="dpo")
    with pytest.raises(ValueError, match=r"reward\.components"):
        SearchR1Trainer(reward_config={"corect_answer": 1.0})
