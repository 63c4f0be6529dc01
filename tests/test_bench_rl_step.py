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


# -- --device cuda (searchr1/bench/_gpu_step.py) -------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda_is_refused_in_one_line(capsys):
    from searchr1.cli import main

    assert main(["bench", "rl-step", "--device", "cuda", "--out-dir", "/nonexistent/never-written"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and err[0].startswith("error: bench rl-step --device cuda: no CUDA device")


@pytest.mark.parametrize("micro", ["5", "12", "0"])
def test_a_micro_batch_that_splits_a_group_or_the_step_is_refused_in_one_line(capsys, micro):
    """--micro-batch must be whole groups of --samples (8) dividing the step's 64 trajectories (TRL takes whole
    groups per micro-step); refused before CUDA is looked for, so this holds on any machine."""
    from searchr1.cli import main

    argv = ["bench", "rl-step", "--device", "cuda", "--micro-batch", micro, "--out-dir", "/nonexistent/never"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and "--micro-batch" in err[0] and "no CUDA" not in err[0]


def test_the_micro_batch_reaches_both_rows_workload():
    import argparse

    from searchr1.bench import _gpu_step as gpu
    from searchr1.bench.rl_step import gpu_workload

    flags = dict(quick=False, questions=None, samples=None, gen_tokens=None, seed=0)
    assert gpu_workload(argparse.Namespace(micro_batch=None, **flags)).micro_batch == 8
    for samples, questions, want in ((4, 8, 8), (16, 8, 16), (3, 1, 3), (4, 3, 4)):  # the default always runs
        other = {**flags, "samples": samples, "questions": questions}
        assert gpu_workload(argparse.Namespace(micro_batch=None, **other)).micro_batch == want
    work = gpu_workload(argparse.Namespace(micro_batch=64, **flags))
    assert work.micro_batch == 64 and work.trajectories == 64
    import json

    spec = json.loads(json.dumps(gpu.child_spec("trl", "tiny", work)))  # what the child process reads
    rebuilt = gpu.Workload(**spec["work"])
    assert rebuilt == work
    assert gpu.trl_batch_settings(rebuilt) == {"per_device_train_batch_size": 64, "gradient_accumulation_steps": 1}
    eight = gpu_workload(argparse.Namespace(micro_batch=None, **flags))
    assert gpu.trl_batch_settings(eight) == {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 8}


def test_share_of_peak_and_the_cards_peaks():
    from searchr1.bench import _gpu_step as gpu

    # LoRA: 4 x params x positions; 1e9 params x 1e4 positions in 1 s on a 989 TFLOP/s card
    assert gpu.update_share_of_peak(10**9, 10**4, 1.0, True, 989.0) == pytest.approx(100 * 4e13 / 989e12)
    assert gpu.update_share_of_peak(10**9, 10**4, 2.0, False, 989.0) == pytest.approx(100 * 3e13 / 989e12)
    assert gpu.update_share_of_peak(10**9, 10**4, 1.0, True, None) is None
    names = ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200", "Tesla T4"]
    assert [gpu.card_peak_tflops(n) for n in names] == [989.0, 756.0, 835.0, 989.0, None]


def test_the_bench_tokenizer_gives_the_prompt_ids_back():
    from searchr1.bench import _gpu_step as gpu

    work = gpu.Workload(questions=3, samples=2, prompt_tokens=20, shared_tokens=12)
    prompts = gpu.prompt_ids(work, 151936)
    assert len(prompts) == 6 and prompts[0] == prompts[1] and prompts[0] != prompts[2]
    assert all(p[:12] == prompts[0][:12] and len(p) == 20 and min(p) >= 2 for p in prompts)
    tok = gpu.bench_tokenizer(151936)
    for p in prompts[::2]:
        text = " ".join(f"t{i}" for i in p)
        assert tok(text, add_special_tokens=False)["input_ids"] == p and tok.decode(p) == text


def test_update_params_count_the_decoder_and_a_tied_head_once():
    from searchr1.bench import _gpu_step as gpu

    model = gpu.build_model("tiny", "cpu", seed=0)
    embed = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is embed  # tied, as both shapes
    total = sum(p.numel() for p in model.parameters())  # the tied matrix once
    assert gpu.update_params(model) == total


def test_ours_and_trl_generate_the_same_number_of_tokens(monkeypatch):
    """The TRL row's measured completions match ours: both exactly ``generated_tokens(work)`` (tiny shape, CPU)."""
    pytest.importorskip("trl")
    from searchr1.bench import _gpu_step as gpu
    from searchr1.trainer import fused_decoder, logprobs

    for module, name in ((logprobs, "final_hidden_states"), (logprobs, "weight_head_logprobs"),
                         (fused_decoder, "weight_head_logprobs"), (fused_decoder.FusedDecoder, "hidden")):  # fmt: skip
        monkeypatch.setattr(module, name, getattr(module, name))  # the counter's wrappers are undone after
    torch.set_num_threads(1)
    work = gpu.Workload(
        questions=2, samples=2, prompt_tokens=24, shared_tokens=16, gen_tokens=5, micro_batch=2
    )
    assert gpu.trl_generation_settings(work)["max_completion_length"] == work.gen_tokens
    ours = gpu.run_ours_row("tiny", work, "cpu", graphs=False)
    trl = gpu.run_trl_row("tiny", work, "cpu")
    assert ours["generated_tokens"] == trl["generated_tokens"] == gpu.generated_tokens(work) == 20
    assert ours["decode"] == "eager" and ours["update_%peak"] is None  # no card, no share
    assert 16 + 4 * (24 + 5 - 16) <= ours["update_positions"] < 4 * (24 + 5)  # the shared prefix once
