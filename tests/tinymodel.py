"""Test fixtures only: a tiny randomly initialised Qwen2-style model and a byte-level BPE tokenizer
trained on a few local texts, saved as an ordinary Hugging Face folder so that tests go through the
same loading code as a real model. They know no language: tests that need language ability use the
real model (``smollm2-135m-instruct``). Importable in the pytest process (``tests/`` is on the path).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from searchr1.data.prompts import TAGS

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512, tag_tokens: bool = True) -> Any:
    """A byte-level BPE tokenizer trained on ``texts``, with a ChatML chat template; with ``tag_tokens``
    every Search-R1 tag is one (ordinary, added) token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN, PAD_TOKEN, "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    if tag_tokens:
        fast.add_tokens(list(TAGS))
    fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_config(vocab_size: int, **overrides: Any) -> Any:
    """A Qwen2-style config of a few layers (hidden 64)."""
    from transformers import Qwen2Config

    params: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    )
    params.update(overrides)
    return Qwen2Config(**params)


def build_tiny_model(tokenizer: Any, seed: int = 0, **config_overrides: Any) -> Any:
    """A randomly initialised tiny causal LM sized to ``tokenizer`` (seeded)."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(len(tokenizer), **config_overrides)
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_tiny_checkpoint(
    out_dir: str | Path, texts: Iterable[str], seed: int = 0, vocab_size: int = 512, **config_overrides: Any
) -> Path:
    """Train a tokenizer on ``texts``, build a tiny model, and save both as a Hugging Face folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
    model = build_tiny_model(tokenizer, seed=seed, **config_overrides)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
