"""Rollout engines by name: ``rollout.engine`` selects one, a user adds one with a decorator.

    from searchr1.rollout.registry import register_engine

    @register_engine("vllm")
    def _vllm(cfg, model, tokenizer, retriever, **kwargs):       # cfg: the whole SearchR1Config
        return MyVLLMEngine(model, tokenizer, retriever, cfg.rollout, **kwargs)

Then ``rollout.engine=vllm`` selects it; the trainer and the evaluation build every engine through
``build_engine`` and never name a class. The entry is a factory, like ``RETRIEVERS``' (a class whose
constructor takes ``(cfg, model, tokenizer, retriever, **kwargs)`` is one too). ``rollout.dtype`` is the
generation dtype of every engine; one that can serve only some dtypes says which
(``register_engine("x", dtypes=fn)``, ``fn("cpu" | "cuda") -> names``), and ``check_dtype`` refuses
another in one line before any model loads. Built-ins:

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from searchr1.registry import Registry

if TYPE_CHECKING:
    from searchr1.rollout.engine import RolloutEngine

EngineFactory = Callable[..., "RolloutEngine"]

GENERATION_DTYPES = ("float32", "bfloat16", "float16")
"""The explicit values of ``rollout.dtype`` (besides auto and model)."""


@dataclass(frozen=True)
class EngineTraits:
    """What the rest of the code must know about an engine."""

    dtypes: Callable[[str], tuple[str, ...]] | None = None
    """The generation dtypes it can serve on a device type ("cpu", "cuda"); None: every one."""


ENGINES: Registry[EngineFactory] = Registry("rollout engine", "rollout.engine", traits=EngineTraits)
"""Engine name -> factory ``(cfg, model, tokenizer, retriever, **kwargs) -> RolloutEngine``."""

register_engine = ENGINES.register
"""Decorator: make an engine factory selectable by ``rollout.engine=name``."""


def build_engine(
    cfg: Any, model: Any, tokenizer: Any, retriever: Any = None, *, name: str | None = None, **kwargs: Any
) -> RolloutEngine:
    """The engine named ``name`` (default ``cfg.rollout.engine``; ``cfg`` is the whole ``SearchR1Config``),
    on ``model``; ``kwargs`` go to the engine (``steer=``, ``topk=``, ``max_new_tokens=`` ...)."""
    return ENGINES.lookup(name or cfg.rollout.engine)(cfg, model, tokenizer, retriever, **kwargs)


def check_dtype(cfg: Any, device_type: str, flag: str = "rollout.dtype") -> None:
    """Before any model loads: ``ValueError`` in one line when the engine ``cfg.rollout.engine`` cannot
    generate in the explicit ``cfg.rollout.dtype`` on ``device_type``, naming the engine and the dtypes it
    takes (``flag``: how the user gave the dtype, e.g. ``--dtype``)."""
    asked, engine = cfg.rollout.dtype, cfg.rollout.engine
    traits = ENGINES.traits_of(engine)
    if asked in ("auto", "model") or traits.dtypes is None:
        return
    taken = traits.dtypes(device_type)
    if asked not in taken:
        where = "GPU" if device_type == "cuda" else device_type.upper()
        raise ValueError(
            f"{flag} {asked}: the {engine} engine on this {where} generates in auto | {' | '.join(taken)}"
        )


def generation_dtype(cfg: Any, device_type: str, flag: str = "rollout.dtype") -> str:
    """The dtype the engine will generate in on ``device_type`` for ``cfg.rollout.dtype`` (auto and model
    resolved as the engines resolve them, ``precision.compute_dtype``, for a model loaded in float32),
    after ``check_dtype``. Imports torch."""
    check_dtype(cfg, device_type, flag)
    import torch

    from searchr1.precision import DTYPE_NAMES, compute_dtype

    dtype = compute_dtype(cfg.rollout.dtype, torch.device(device_type), torch.float32, flag)
    return next(name for name, value in DTYPE_NAMES.items() if value == dtype)


def _torch_dtypes(device_type: str) -> tuple[str, ...]:
    return GENERATION_DTYPES  # torch computes in each of them on a CPU and a GPU (bfloat16 may be slow)


def _vllm_dtypes(device_type: str) -> tuple[str, ...]:
    from searchr1.rollout.vllm import served_dtypes  # torch

    return served_dtypes(device_type)


# -- built-ins (torch and transformers are imported when an engine is built) -----------------------


@register_engine("hf", dtypes=_torch_dtypes)
def _hf(cfg: Any, model: Any, tokenizer: Any, retriever: Any, **kwargs: Any) -> RolloutEngine:
    from searchr1.rollout.hf import HFRolloutEngine

    kwargs.setdefault("topk", cfg.retrieval.topk)
    return HFRolloutEngine(model, tokenizer, retriever, cfg.rollout, **kwargs)


@register_engine("turn_sync", dtypes=_torch_dtypes)
def _turn_sync(cfg: Any, model: Any, tokenizer: Any, retriever: Any, **kwargs: Any) -> RolloutEngine:
    from searchr1.rollout.hf import TurnSyncRolloutEngine

    kwargs.setdefault("topk", cfg.retrieval.topk)
    return TurnSyncRolloutEngine(model, tokenizer, retriever, cfg.rollout, **kwargs)


@register_engine("vllm", dtypes=_vllm_dtypes)
def _vllm(cfg: Any, model: Any, tokenizer: Any, retriever: Any, **kwargs: Any) -> RolloutEngine:
    from searchr1.rollout.vllm import VLLMRolloutEngine

    kwargs.setdefault("topk", cfg.retrieval.topk)
    return VLLMRolloutEngine(cfg, model, tokenizer, retriever, **kwargs)


@register_engine("single_turn", dtypes=_torch_dtypes)
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
