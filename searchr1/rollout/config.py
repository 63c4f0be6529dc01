"""Configuration of multi-turn generation (section ``rollout``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class RolloutConfig:
    engine: str = "hf"
    """Generation engine by registered name (``searchr1.rollout.registry``): hf (KV-cached, async search) |
    turn_sync (reference: re-encodes every turn) | single_turn (one reply, no search) | a plugin's."""
    dtype: str = "auto"
    """Generation dtype of the HF engines: auto (bfloat16 where the GPU or CPU has bfloat16 units, else the
    model's) | model | float32 | bfloat16 | float16. Another dtype than the model's, or LoRA, makes the
    engine generate with its own merged copy of the policy, refreshed after every update."""
    fast_decode: bool = True
    """KV cache layers with spare capacity, one prompt computation for fresh rows fed the same prompt, and
    matmul attention for single-token steps; false: transformers' DynamicCache and SDPA (the benchmark baseline)."""
    n: int = 5
    """Trajectories sampled per prompt (the GRPO group size)."""
    max_turns: int = 4
    """Turns in which a search is executed; one more answer-only turn follows (Search-R1's max_turns)."""
    max_turn_tokens: int = 500
    """Tokens generated per turn at most (a turn ends at </search>, </answer>, EOS or this limit)."""
    max_obs_tokens: int = 500
    """Tokens of one <information> block at most (longer ones are truncated and counted)."""
    max_response_tokens: int = 4096
    """Tokens after the prompt (generated + observations) at most; beyond it the trajectory is truncated."""
    max_context: int = 0
    """Prompt + response tokens at most; 0 = the model's max_position_embeddings."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts; stored log-probs are log_softmax(logits / temperature)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with this much probability (1.0 = off)."""
    top_k: int = 0
    """Sample among the k most likely tokens only (0 = off)."""
    val_greedy: bool = True
    """Validation and evaluation decode greedily (False: they sample like training)."""
    invalid_action_message: bool = True
    """Append Search-R1's invalid-action message after a turn that neither searched nor answered."""
    eos_ends_trajectory: bool = False
    """EOS without an action ends the trajectory (False: Search-R1's rule, it is an invalid turn)."""
    max_query_chars: int = 512
    """Longer search queries are cut to this many characters before they reach the backend."""
    search_timeout_s: float = 30.0
    """Seconds one search attempt may take before it counts as failed."""
    search_retries: int = 2
    """Extra attempts after a failed or timed-out search; then the observation says the search failed."""
    max_search_failure_rate: float = 0.5
    """Stop training (checkpoint, non-zero exit) when more than this share of the searches of the last
    `search_failure_window` steps failed; 1.0 = never stop. The first failures print one warning."""
    search_failure_window: int = 5
    """Steps over which rollout.max_search_failure_rate is measured (the run stops no earlier)."""
    search_workers: int = 8
    """Threads that run searches while the HF engine keeps decoding other rows."""
    max_batch_rows: int = 64
    """Rows decoded together; further prompts take the slots of finished rows (continuous batching)."""

    def validate(self, root: Any) -> None:
        if self.dtype not in ("auto", "model", "float32", "bfloat16", "float16"):
            raise ValueError(
                f"rollout.dtype: expected auto | model | float32 | bfloat16 | float16, got {self.dtype!r}"
            )
        positive = ("n", "max_turn_tokens", "max_obs_tokens", "max_response_tokens", "max_query_chars")
        for name in (*positive, "search_workers", "max_batch_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("max_turns", "max_context", "search_retries", "top_k"):
            if getattr(self, name) < 0:
                raise ValueError(f"rollout.{name}: must be >= 0, got {getattr(self, name)}")
        if not self.temperature > 0:
            raise ValueError(
                f"rollout.temperature: must be > 0 (use greedy decoding instead), got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout.top_p: must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.max_search_failure_rate <= 1.0:
            raise ValueError(
                f"rollout.max_search_failure_rate: must be in [0, 1] (1.0 = never stop), got {self.max_search_failure_rate}"
            )
        if self.search_failure_window < 1:
            raise ValueError(f"rollout.search_failure_window: must be >= 1, got {self.search_failure_window}")
        if not self.search_timeout_s > 0:
            raise ValueError(f"rollout.search_timeout_s: must be > 0, got {self.search_timeout_s}")
