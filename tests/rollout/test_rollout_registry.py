"""Rollout engines are chosen by name through ``searchr1.rollout.registry``: the built-ins are
registered there, a user engine is one decorated factory, and the config checks names against it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from rollout_doubles import ScriptedRetriever

from searchr1.config import ConfigError, SearchR1Config, load_config
from searchr1.rollout import registry
from searchr1.rollout.registry import build_engine, register_engine


def test_builtins_are_registered_by_name():
    assert {"hf", "turn_sync", "single_turn"} <= set(registry.ENGINES.names())
    with pytest.raises(ValueError, match=r"rollout\.engine: unknown rollout engine 'vllm2'; known: .*hf"):
        registry.ENGINES.lookup("vllm2")
    with pytest.raises(ConfigError, match=r"rollout\.engine: unknown rollout engine 'vllm2'.*turn_sync"):
        load_config(overrides=["rollout.engine=vllm2"])


def test_a_user_engine_is_selected_by_config():
    calls = []

    @register_engine("test_echo")
    def echo(cfg, model, tokenizer, retriever, **kwargs):
        calls.append((cfg.rollout.engine, model, tokenizer, retriever, kwargs))
        return "engine"

    try:
        cfg = load_config(overrides=["rollout.engine=test_echo"])
        assert build_engine(cfg, "m", "t", "r", steer=None) == "engine"
        assert calls == [("test_echo", "m", "t", "r", {"steer": None})]
        with pytest.raises(ValueError, match="already registered"):
            register_engine("test_echo")(lambda *a, **k: None)
    finally:
        registry.ENGINES.remove("test_echo")


def test_builtin_factories_build_their_engines(tiny):
    from searchr1.rollout.hf import HFRolloutEngine, TurnSyncRolloutEngine
    from searchr1.rollout.single_turn import SingleTurnEngine

    model, tok = tiny
    cfg = SearchR1Config()
    cfg.rollout.dtype = "model"
    cfg.retrieval.topk = 2
    with build_engine(cfg, model, tok, ScriptedRetriever()) as eng:
        assert type(eng) is HFRolloutEngine and eng.topk == 2
    with build_engine(cfg, model, tok, ScriptedRetriever(), name="turn_sync", topk=1) as eng:
        assert type(eng) is TurnSyncRolloutEngine and eng.topk == 1
    with build_engine(cfg, model, tok, name="single_turn", max_new_tokens=7) as eng:
        assert type(eng) is SingleTurnEngine and eng.max_new_tokens == 7


def test_the_registry_and_the_rollout_config_import_no_torch():
    code = (
        "import sys, searchr1.rollout.registry, searchr1.rollout.config; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
