"""The trainer's only contact points with the other packages (rollout, rewards, data, critic, KL).

Each function is a thin call into the owning package, so the loop reads as the data path and a
change of another package's signature is fixed here, in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from searchr1.algorithms.kl import kl_loss_matrix, kl_penalty
from searchr1.data.formats import load_samples as read_samples
from searchr1.data.prompts import build_prompt
from searchr1.data.synth import SynthConfig, generate_world, write_world
from searchr1.rewards.composite import build_reward as build_composite_reward
from searchr1.rollout.registry import build_engine
from searchr1.rollout.sampling import SamplingParams
from searchr1.trainer.critic import ValueModel
from searchr1.trainer.policy import PolicyLogprobs, _scatter  # noqa: F401 - moved there


def build_value_model(path: Any, dtype: str = "float32") -> nn.Module:
    """The PPO critic: a value head on a causal LM's decoder (``searchr1.trainer.critic``);
    ``values[b, t]`` is the value of the state before token ``t`` (aligned with the log-probs)."""

    return ValueModel.from_pretrained(str(path), dtype=dtype)


# ----------------------------------------------------------------------------------------------
# KL between policy and reference on sampled tokens.


def token_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` (``algorithm.kl_estimator``) from the algorithms registry."""

    return kl_penalty(logprobs, ref_logprobs, estimator)


def vocab_kl_matrix(
    algo: Any,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    logits: torch.Tensor,
    ref_logits: torch.Tensor,
    input_ids: torch.Tensor,
    valid: torch.Tensor,
) -> torch.Tensor:
    """``[B, T]`` KL over the vocabulary (full or top-k, ``algorithm.kl_loss_type``) at the valid
    positions, from the ``[N, V]`` logits of policy and reference there."""

    tokens = input_ids[valid]
    kl_rows = kl_loss_matrix(
        algo,
        log_prob=logprobs[valid][None],
        ref_log_prob=ref_logprobs[valid][None],
        old_log_prob=old_logprobs[valid][None],
        logits=logits[None],
        ref_logits=ref_logits[None],
        tokens=tokens[None],
    )[0]
    return _scatter(valid, kl_rows)


# ----------------------------------------------------------------------------------------------
# Rollout.


def make_engine(cfg: Any, model: nn.Module, tokenizer: Any, retriever: Any) -> Any:
    """The rollout engine named by ``rollout.engine`` (``searchr1.rollout.registry``)."""
    return build_engine(cfg, model, tokenizer, retriever)


def sampling_params(rollout_cfg: Any, greedy: bool = False) -> Any:
    return SamplingParams.greedy_eval(rollout_cfg) if greedy else SamplingParams.from_config(rollout_cfg)


def generate(
    engine: Any, prompt_ids: list[list[int]], metas: list[dict], sampling: Any, seed: int
) -> list[Any]:
    return engine.generate(prompt_ids, metas, sampling=sampling, seed=seed)


# ----------------------------------------------------------------------------------------------
# Rewards.


def build_reward(reward_cfg: Any) -> Any:
    return build_composite_reward(reward_cfg)


def score(reward_fn: Any, trajectories: Sequence[Any], decode: Any) -> list[Any]:
    """``RewardOutput(total, components, ...)`` per trajectory (batched when the reward supports it)."""
    if hasattr(reward_fn, "score_trajectories"):
        return reward_fn.score_trajectories(list(trajectories), decode)
    return [reward_fn(t, decode) for t in trajectories]


# ----------------------------------------------------------------------------------------------
# Data.


def load_samples(paths: Sequence[str]) -> list[Any]:
    """``Sample(id, question, golden_answers, data_source, ...)`` rows of jsonl / parquet files."""

    rows: list[Any] = []
    for path in paths:
        rows.extend(read_samples(path))
    return rows


def prompt_text(sample: Any, template: str, tokenizer: Any) -> str:
    """The prompt the policy continues (stored chat messages of a parquet row, else the template)."""
    if hasattr(sample, "prompt"):
        return sample.prompt(template, tokenizer)

    return build_prompt(sample_meta(sample, 0)["question"], template, tokenizer)


def sample_meta(sample: Any, index: int) -> dict[str, Any]:
    """What travels with a trajectory: question, golden answers, source, ids."""
    if hasattr(sample, "meta"):
        meta = dict(sample.meta())
    else:
        meta = {
            "id": sample.get("id", str(index)),
            "question": sample.get("question", ""),
            "golden_answers": list(sample.get("golden_answers", []) or []),
            "data_source": sample.get("data_source"),
        }
    meta["data_source"] = meta.get("data_source") or "default"
    meta["sample_index"] = index
    return meta


def synthetic_world(out_dir: Any, seed: int) -> dict[str, Any]:
    """Generate (once) the embedded synthetic world under ``out_dir``; returns its file paths."""
    from pathlib import Path

    out = Path(out_dir)
    marker = out / ".complete"
    if not marker.is_file():
        world = generate_world(SynthConfig(seed=seed))
        write_world(world, out)
        marker.write_text("ok\n")
    return {p.stem: p for p in out.glob("*.jsonl")}
