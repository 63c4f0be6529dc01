"""``searchr1 bench rl-step``: its rows are valid configurations that differ where they say, and its
compute counter counts the decoder positions a pass really computes (the FLOP/s column rests on it)."""

from __future__ import annotations

import pytest
import torch

from searchr1.bench import rl_step
from searchr1.config import load_config


@pytest.mark.parametrize("row", sorted(rl_step.PATHS))
def test_every_row_is_a_valid_config_of_the_same_work(row, tmp_path):
    cfg = load_config(None, [*rl_step.step_overrides(8, 8, str(tmp_path), 0), *rl_step.PATHS[row]])
    assert (cfg.trainer.batch_size, cfg.rollout.n, cfg.rollout.max_turns) == (8, 8, 2)
    assert cfg.model.path == "smollm2-135m-instruct" and cfg.data.template == "instruct_1shot"
    fast = row != "baseline"
    assert cfg.rollout.fast_decode is fast and cfg.trainer.on_policy_logprobs is fast
    assert (cfg.model.lora_r > 0) is (row in ("fast", "fast+kl", "vllm", "vllm-lora"))
    assert (cfg.rollout.engine == "vllm") is row.startswith("vllm")
    assert cfg.algorithm.use_kl_loss is (row in ("baseline", "fast+kl"))


def test_compute_counter_counts_shared_prefix_once_and_splits_by_grad_mode(tiny_model_dir, monkeypatch):
    from searchr1.models import load_model
    from searchr1.trainer import logprobs

    monkeypatch.setattr(logprobs, "final_hidden_states", logprobs.final_hidden_states)
    monkeypatch.setattr(logprobs, "chunked_head_logprobs", logprobs.chunked_head_logprobs)
    model = load_model(str(tiny_model_dir))
    counter = rl_step.ComputeCounter()
    counter.install()
    ids = torch.randint(3, 50, (4, 24))
    ids[:, :20] = ids[0, :20]  # a 20-token prefix common to the 4 rows
    mask = torch.ones_like(ids)
    with torch.no_grad():
        logprobs.final_hidden_states(model, ids, mask)
    logprobs.final_hidden_states(model, ids, mask, shared_prefix=20)
    assert counter.counts["logprobs"][0] == 4 * 24
    assert counter.counts["update"][0] == 20 + 4 * 4
    counter.reset()
    assert counter.counts == {"update": [0, 0], "logprobs": [0, 0]}
