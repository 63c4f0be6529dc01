"""The rollout engine receives the policy's weights in the form it asks for (``weight_format``): before the
first rollout and after every update, so that an engine holding its own copy generates with the new
policy without ever touching the trainer's model object."""

from __future__ import annotations

import pytest
import rlworld
import torch

from searchr1.models import load_model, load_tokenizer, plain_state_dict
from searchr1.rollout.engine import PolicyWeights
from searchr1.rollout.registry import build_engine
from searchr1.trainer.distributed import DistInfo
from searchr1.trainer.engine_weights import check_weight_format, policy_weights
from searchr1.trainer.loop import RLTrainer


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return rlworld.write_world(tmp_path_factory.mktemp("world"))


class OwnCopyEngine:
    """An engine with a model of its own (as a server process would have): it generates with its copy
    through the HF engine, and takes new weights only through ``update_weights``."""

    def __init__(self, cfg, model_dir, tokenizer, retriever, weight_format):
        self.weight_format = weight_format
        self.copy = load_model(model_dir)
        self.inner = build_engine(cfg, self.copy, tokenizer, retriever)
        self.received: list[PolicyWeights] = []

    def generate(self, *args, **kwargs):
        return self.inner.generate(*args, **kwargs)

    def update_weights(self, weights):
        self.received.append(weights)
        if weights.state_dict is not None:
            self.copy.load_state_dict(weights.state_dict)
        elif weights.path is not None:
            self.copy.load_state_dict(load_model(weights.path).state_dict())

    def close(self):
        self.inner.close()


@pytest.mark.parametrize("weight_format", ["state_dict", "path"])
def test_an_engine_with_its_own_copy_generates_with_the_updated_policy(
    weight_format, world, tiny_model_dir, tmp_path
):
    cfg = rlworld.load(world, tiny_model_dir, tmp_path / "run", trainer__total_steps=1,
                       trainer__actor_lr=1e-2, rollout__dtype="model")  # fmt: skip
    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir)
    from searchr1.retrieval.bm25 import BM25Retriever

    engine = OwnCopyEngine(
        cfg, tiny_model_dir, tokenizer, BM25Retriever.from_corpus(world["corpus"]), weight_format
    )
    trainer = RLTrainer(cfg, model=model, tokenizer=tokenizer, engine=engine)
    trainer.setup()
    assert [w.step for w in engine.received] == [0]  # before the first rollout
    trainer.train_step()
    assert [w.step for w in engine.received] == [0, 1]
    assert engine.copy is not trainer.policy
    policy = plain_state_dict(trainer.policy)
    original = load_model(tiny_model_dir).state_dict()
    assert any(not torch.equal(v, policy[k]) for k, v in original.items()), "the step changed the policy"
    for key, value in engine.copy.state_dict().items():
        assert torch.equal(value, policy[key]), key
    if weight_format == "path":
        assert engine.received[-1].path == tmp_path / "run" / "engine_weights" / "model"
    engine.close()


def test_the_forms_of_the_weights(tiny_model_dir, tmp_path):
    model = load_model(tiny_model_dir)
    tok = load_tokenizer(tiny_model_dir)
    single = DistInfo()
    kw = dict(step=3, tokenizer=tok, lora=False, dist=single, out_dir=tmp_path)
    assert policy_weights("module", model, **kw).module is model
    sd = policy_weights("state_dict", model, **kw).state_dict
    assert sd.keys() == model.state_dict().keys()
    path = policy_weights("path", model, **kw).path
    assert (path / "config.json").is_file() and (path / "tokenizer_config.json").is_file()
    again = policy_weights("path", model, **kw).path  # rewritten in place at the next update
    assert again == path and not (tmp_path / "engine_weights.tmp").exists()


def test_a_weight_form_the_run_cannot_give_fails_before_training():
    class AdapterEngine:
        weight_format = "adapter"

    class Unknown:
        weight_format = "pickle"

    with pytest.raises(ValueError, match=r"takes LoRA adapters, but model\.lora_r = 0"):
        check_weight_format(AdapterEngine(), lora=False)
    check_weight_format(AdapterEngine(), lora=True)
    with pytest.raises(ValueError, match=r"weight_format must be module \| state_dict \| path \| adapter, got 'pickle'"):
        check_weight_format(Unknown(), lora=False)
