"""The starting model of the learning demo: what it reads, determinism, caching."""

from __future__ import annotations

import json

import torch

from searchr1.data.prompts import TAGS
from searchr1.data.synth import SynthConfig, generate_world
from searchr1.pretrain import (
    DEMO_INSTRUCTION,
    PRETRAIN_BASE_SEED,
    PretrainSettings,
    describe_corpus,
    instruction_document,
    prepare_starting_model,
    pretraining_corpus,
)

TINY = dict(
    worlds=1, num_entities=40, steps=3, hidden_size=16, num_heads=2, seq_len=32, batch_size=2, vocab_size=300
)


def test_tags_only_in_the_instruction_and_no_question_is_answered():
    settings = PretrainSettings(worlds=1, num_entities=60)
    docs = pretraining_corpus(settings)
    empty_instruction = instruction_document(DEMO_INSTRUCTION).rstrip("\n")
    head = DEMO_INSTRUCTION.split("<search>")[0]
    with_tags = [doc for doc in docs if any(tag in doc for tag in TAGS)]
    assert with_tags and all(head in doc and doc.endswith("</answer>") for doc in with_tags)
    assert len(with_tags) == settings.instruction_copies
    empty = sum(doc == empty_instruction for doc in with_tags)
    assert empty == settings.instruction_copies - round(
        settings.instruction_copies * settings.instruction_examples
    )
    assert not any("?" in doc for doc in docs)  # no question at all, so no question followed by its answer


def test_corpus_is_from_other_worlds_than_the_demo():
    docs = "\n".join(pretraining_corpus(PretrainSettings(worlds=2, num_entities=60, result_pages=False)))
    demo = generate_world(SynthConfig(seed=0, num_entities=60))
    facts = [row["contents"].split("\n", 1)[1] for row in demo.corpus]
    # no sentence stating a demo-world fact appears (names may repeat by chance, facts do not)
    sentences = {s.strip() for f in facts for s in f.split(". ") if " born in " in s or " founded " in s}
    assert sentences and not any(s in docs for s in sentences)
    assert str(PRETRAIN_BASE_SEED) in describe_corpus(PretrainSettings())


def test_same_settings_same_weights_and_cache_reuse(tmp_path):
    from safetensors.torch import load_file

    a = prepare_starting_model(tmp_path / "a", PretrainSettings(**TINY))
    b = prepare_starting_model(tmp_path / "b", PretrainSettings(**TINY))
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    manifest = json.loads((a / "pretrain.json").read_text())
    assert manifest["loss_last"] < manifest["loss_first"]
    stamp = (a / "model.safetensors").stat().st_mtime_ns
    assert prepare_starting_model(tmp_path / "a", PretrainSettings(**TINY)) == a
    assert (a / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    other = prepare_starting_model(tmp_path / "a", PretrainSettings(**{**TINY, "seed": 1}))
    assert json.loads((other / "pretrain.json").read_text())["settings"]["seed"] == 1


def test_tags_are_single_tokens_of_the_starting_tokenizer(tmp_path):
    from searchr1.models import load_tokenizer

    tok = load_tokenizer(prepare_starting_model(tmp_path / "m", PretrainSettings(**TINY)))
    for tag in TAGS:
        assert len(tok(tag, add_special_tokens=False)["input_ids"]) == 1
