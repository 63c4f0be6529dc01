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
    assert cfg.trainer.fused_update is fast and cfg.trainer.adaptive_threads is fast
    assert (cfg.model.lora_r > 0) is (row in ("fast", "fast+kl", "vllm", "vllm-lora"))
    assert (cfg.rollout.engine == "vllm") is row.startswith("vllm")
    assert cfg.algorithm.use_kl_loss is (row in ("baseline", "fast+kl"))


def test_compute_counter_counts_shared_prefix_once_and_splits_by_grad_mode(tiny_model_dir, monkeypatch):
    from searchr1.models import load_model
    from searchr1.trainer import fused_decoder, logprobs

    monkeypatch.setattr(logprobs, "final_hidden_states", logprobs.final_hidden_states)
    monkeypatch.setattr(logprobs, "weight_head_logprobs", logprobs.weight_head_logprobs)
    monkeypatch.setattr(fused_decoder, "weight_head_logprobs", fused_decoder.weight_head_logprobs)
    monkeypatch.setattr(fused_decoder.FusedDecoder, "hidden", fused_decoder.FusedDecoder.hidden)
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
    # the fused decoder: the prefix once (its own call), then each row's rest; LM-head rows counted once
    decoder = fused_decoder.FusedDecoder(model)
    target = torch.zeros_like(ids, dtype=torch.bool)
    target[:, 22:] = True
    step = fused_decoder.StepPrefix(decoder, ids[0, :20], torch.float32)
    fused_decoder.fused_token_logprobs(decoder, ids, mask, target_mask=target, step_prefix=step)
    assert counter.counts["update"] == [20 + 4 * 4, 4 * 2]


def test_rows_use_the_cores_this_process_may_run_on(monkeypatch):
    monkeypatch.setattr(rl_step.os, "sched_getaffinity", lambda pid: {1})
    assert rl_step.default_threads() == 1


def test_a_benchmark_without_a_ratio_writes_strict_json(tmp_path, capsys):
    """A headline with nothing to divide by (``--bm25 off``, ``--rows fast``) is NaN: stored as null."""
    import json

    from searchr1.bench import BenchResult, report

    result = BenchResult("nan_case", {"rows": ["fast"]}, [{"row": "fast", "step_s": 1.5, "ratio": float("inf")}],
                         float("nan"), "fast / baseline", extra={"fits": [float("nan"), 2.0]})  # fmt: skip
    path = report(result, tmp_path)
    data = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert data["headline"] is None and data["fits"] == [None, 2.0]
    assert data["measurements"] == [{"row": "fast", "step_s": 1.5, "ratio": None}]


def test_the_matmul_peak_is_the_median_of_its_probes_with_their_spread():
    """One probe read 362, 421 and 937 GFLOP/s on the same kind of machine: the share of the peak is taken
    against the median of every probe, and the JSON keeps the probes, the min and the max."""
    probes = [{"bf16": 400.0, "fp32": 190.0}, {"bf16": 937.0, "fp32": 180.0}, {"bf16": 421.0, "fp32": 200.0}]
    summary = rl_step.peak_summary(probes)
    assert summary["bf16"] == 421.0 and summary["fp32"] == 190.0
    assert (summary["bf16_min"], summary["bf16_max"]) == (400.0, 937.0)
    assert summary["probes"] == probes
