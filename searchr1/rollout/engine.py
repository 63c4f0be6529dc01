"""The rollout interface the trainer and the evaluation call; engines plug in behind it.

    engine = build_engine(cfg, model, tokenizer, retriever)   # searchr1.rollout.registry; rollout.engine names it
    engine.update_weights(PolicyWeights(step, module=policy))  # before the first rollout, after every update
    trajs = engine.generate(prompt_ids, metas, sampling=SamplingParams.from_config(cfg.rollout), seed=step)
    val = engine.generate(prompt_ids, metas, sampling=SamplingParams.greedy_eval(cfg.rollout), seed=0,
                          on_tokens=show_progress)

What an engine implements, and all the trainer and the evaluation ever ask of it:

* ``generate``: one ``Trajectory`` per prompt, in order (token ids as sampled, a role per token, the
  sampling log-prob of each generated token, turns, queries, hits). Searches go to the retriever the
  engine was built with (``build_engine(..., retriever)``); nobody replaces it afterwards. ``on_tokens``,
  when given, is told the tokens as they are chosen (progress, streaming); it cannot change them.
* ``update_weights(weights)``: generate with the policy's new weights from now on. ``weight_format``
  says in which form the engine takes them, so an engine in another process (an inference server)
  never touches the trainer's model object: ``module`` (the trainer's model itself, in-process),
  ``state_dict`` (a plain causal-LM state dict, LoRA merged), ``path`` (a ``from_pretrained`` folder
  the trainer writes, LoRA merged) or ``adapter`` (the LoRA adapter folder, with ``model.lora_r > 0``).
  The trainer calls it once before the first rollout of a run and after every update.
* ``close``: release threads, memory, connections or the server.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

from searchr1.rollout.sampling import SamplingParams
from searchr1.rollout.types import Trajectory

WeightFormat = Literal["module", "state_dict", "path", "adapter"]
"""How an engine takes the policy's weights (``RolloutEngine.weight_format``)."""


@dataclass(frozen=True)
class PolicyWeights:
    """The policy's weights after ``step`` updates, in the one form the engine asked for."""

    step: int
    module: Any = None
    """``module``: the trainer's policy object (maybe a peft model); valid while the call lasts."""
    state_dict: Mapping[str, Any] | None = None
    """``state_dict``: the plain causal LM's tensors (Hugging Face names, LoRA merged in)."""
    path: Path | None = None
    """``path``: a Hugging Face folder (config, safetensors, tokenizer; LoRA merged) that ``from_pretrained``
    loads; the trainer rewrites it at the next update, so load it before returning."""
    adapter_path: Path | None = None
    """``adapter``: a PEFT LoRA adapter folder (``adapter_config.json`` + weights) over the base model."""


class NewToken(NamedTuple):
    """One token just chosen for one row of a ``generate`` call."""

    row: int
    """Index of the prompt in the call."""
    turn: int
    """Turns the row completed before this one (0: the first)."""
    token: int


TokenListener = Callable[[Sequence[NewToken]], None]
"""Receives the tokens of each decoding step (``generate(..., on_tokens=)``): progress and streaming."""


class RolloutEngine(ABC):
    """Turns prompts (token ids) into multi-turn trajectories."""

    weight_format: ClassVar[WeightFormat] = "state_dict"
    """The form ``update_weights`` receives the policy's weights in (see ``PolicyWeights``)."""
    last_stats: dict[str, float]
    """Engine-side measurements of the latest ``generate`` call (wall time, forward calls, ...), if any."""

    @abstractmethod
    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        metas: Sequence[Mapping[str, Any]] | None = None,
        *,
        sampling: SamplingParams | None = None,
        seed: int | None = None,
        on_tokens: TokenListener | None = None,
    ) -> list[Trajectory]:
        """One trajectory per prompt, in order; ``metas[i]`` is copied into ``trajectories[i].meta``.
        ``on_tokens`` (optional) receives each step's new tokens; an engine that cannot tell them one by
        one may call it less often (say once per finished turn), never more than once per token."""

    def update_weights(self, weights: PolicyWeights) -> None:
        """Generate with ``weights`` from now on (in the form ``weight_format`` names)."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot take new weights (an evaluation-only engine)"
        )

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release threads, memory, connections."""

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
