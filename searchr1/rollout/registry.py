"""Rollout engines by name: ``rollout.engine`` selects one, a user adds one with a decorator.

    from searchr1.rollout.registry import register_engine

    @register_engine("vllm")
    def _vllm(cfg, model, tokenizer, retriever, **kwargs):       # cfg: the whole SearchR1Config
        return MyVLLMEngine(model, tokenizer, retriever, cfg.rollout, **kwargs)

Then ``rollout.engine=vllm`` selects it; the trainer and the evaluation build every engine through
``build_engine`` and never name a class. The entry is a factory, like ``RETRIEVERS``' (a class whose
constructor takes ``(cfg, model, tokenizer, retriever, **kwargs)`` is one too). Built-ins:

    hf           HFRolloutEngine: one KV cache across turns, searches run while other rows decode
    turn_sync    TurnSyncRolloutEngine: Search-R1's loop, re-encodes every turn (the reference)
    vllm         VLLMRolloutEngine: the same loop on a vLLM server it starts (rollout.vllm; scripts/setup-vllm.sh)
    single_turn  SingleTurnEngine: one reply, no search (the evaluation's direct / cot / rag baselines;
                 ``max_new_tokens=`` sets the reply length, default ``rollout.max_turn_tokens``)

This module imports no torch: the built-in factories import their engine when called, so the config
checks ``rollout.engine`` against ``ENGINES`` without loading a model library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from searchr1.registry import Registry

if TYPE_CHECKING:
    from searchr1.rollout.engine import RolloutEngine

EngineFactory = Callable[..., "RolloutEngine"]

ENGINES: Registry[EngineFactory] = Registry("rollout engine", "rollout.engine")
"""Engine name -> factory ``(cfg, model, tokenizer, retriever, **kwargs) -> RolloutEngine``."""

register_engine = ENGINES.register
"""Decorator: make an engine factory selectable by ``rollout.engine=name``."""


def build_engine(
    cfg: Any, model: Any, tokenizer: Any, retriever: Any = None, *, name: str | None = None, **kwargs: Any
) -> RolloutEngine:
    """The engine named ``name`` (default ``cfg.rollout.engine``; ``cfg`` is the whole ``SearchR1Config``),
    on ``model``; ``kwargs`` go to the engine (``steer=``, ``topk=``, ``max_new_tokens=`` ...)."""
    return ENGINES.lookup(name or cfg.rollout.engine)(cfg, model, tokenizer, retriever, **kwargs)


# -- built-ins (torch and transformers are imported when an engine is built) -----------------------


@register_engine("hf")
def _hf(cfg: Any, model: Any, tokenizer: Any, retriever: Any, **kwargs: Any) -> RolloutEngine:
    from searchr1.rollout.hf import HFRolloutEngine

    kwargs.setdefault("topk", cfg.retrieval.topk)
    return HFRolloutEngine(model, tokenizer, retriever, cfg.rollout, **kwargs)


@register_engine("turn_sync")
def _turn_sync(cfg: Any, model: Any, tokenizer: Any, retriever: Any, **kwargs: Any) -> RolloutEngine:
    from searchr1.rollout.hf import TurnSyncRolloutEngine

    kwargs.setdefault("topk", cfg.retrieval.topk)
    return TurnSyncRolloutEngine(model, tokenizer, retriever, cfg.rollout, **kwargs)


@register_engine("vllm")
def _vllm(cfg: Any, model: Any, tokenizer: Any, retriever: Any, **kwargs: Any) -> RolloutEngine:
    from searchr1.rollout.vllm import VLLMRolloutEngine

    kwargs.setdefault("topk", cfg.retrieval.topk)
    return VLLMRolloutEngine(cfg, model, tokenizer, retriever, **kwargs)


@register_engine("single_turn")
def _single_turn(
    cfg: Any,
    model: Any,
    tokenizer: Any,
    retriever: Any = None,
    *,
    max_new_tokens: int | None = None,
    **kwargs: Any,
) -> RolloutEngine:
    from searchr1.rollout.single_turn import SingleTurnEngine

    kwargs.pop("topk", None)  # it never searches
    reply = max_new_tokens if max_new_tokens is not None else cfg.rollout.max_turn_tokens
    return SingleTurnEngine(model, tokenizer, reply, config=cfg.rollout, **kwargs)
