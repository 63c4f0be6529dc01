"""Models and tokenizers: the real ``from_pretrained`` path, and tiny ones built locally.

Hub ids and local folders load through ``load_model`` / ``load_tokenizer`` (Hugging Face
``from_pretrained``). Machines without a hub build a tiny Qwen2-style model from a config and a
byte-level BPE tokenizer trained on local text; ``save_tiny_checkpoint`` writes them as an ordinary
Hugging Face folder, so tests and the demo go through the same loading code as a real model.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from searchr1.data.prompts import TAGS

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"

# A minimal ChatML template (the Qwen2.5 shape) for tokenizers trained here.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 2048,
    min_frequency: int = 2,
    tag_tokens: bool = True,
    number_tokens: bool = False,
) -> Any:
    """Train a byte-level BPE tokenizer on ``texts``.

    With ``tag_tokens`` every Search-R1 tag is one token: an ordinary (non-special) added token, never
    split, that survives ``decode(..., skip_special_tokens=True)``. Without it the tags are split
    like any other text (``<``, ``search``, ``>``), as a real base model's tokenizer splits them;
    ``<``, ``</`` and every space are tokens of their own, so a word is the same tokens after a space,
    after ``<`` and at the start of a line: ``search`` in ``put a search`` is the ``search`` of
    ``<search>``, and a model can copy a tag or a name from an instruction token for token.

    With ``number_tokens`` every whole number of four digits that occurs at least ``min_frequency`` times in
    ``texts`` is one token (added after training, beyond ``vocab_size``; as GPT-2's vocabulary holds
    most years): a year is then copied in one step, not digit by digit. A longer number may be split
    after its first four digits (``190000`` -> ``1900`` ``0`` ``0``).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if tag_tokens:
        tok.pre_tokenizer = byte_level
    else:
        from tokenizers import Regex

        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex("</?| "), behavior="isolated"), byte_level]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN, PAD_TOKEN, "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    if number_tokens:
        texts = list(texts)  # read twice: by the trainer and for the numbers
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    if tag_tokens:
        fast.add_tokens(list(TAGS))
    if number_tokens:
        fast.add_tokens(_number_tokens(texts, min_frequency))
    fast.chat_template = CHATML_TEMPLATE
    return fast


def _number_tokens(texts: list[str], min_frequency: int) -> list[Any]:
    """Whole numbers of four digits seen ``min_frequency`` times, as tokens."""
    import re
    from collections import Counter

    from tokenizers import AddedToken

    counts = Counter(n for t in texts for n in re.findall(r"(?<!\d)\d{4}(?!\d)", t))
    numbers = sorted(n for n, c in counts.items() if c >= min_frequency)
    return [AddedToken(n, normalized=False) for n in numbers]


def tiny_config(vocab_size: int, **overrides: Any) -> Any:
    """A Qwen2-style config of a few layers: the tiny CPU model of tests and the demo."""
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
    out_dir: str | Path,
    texts: Iterable[str],
    seed: int = 0,
    vocab_size: int = 2048,
    **config_overrides: Any,
) -> Path:
    """Train a tokenizer on ``texts``, build a tiny model, and save both as a Hugging Face folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
    model = build_tiny_model(tokenizer, seed=seed, **config_overrides)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def load_tokenizer(path_or_id: str | Path) -> Any:
    """``AutoTokenizer.from_pretrained`` with a pad token guaranteed (left unchanged if present)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path_or_id))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(path_or_id: str | Path, dtype: str = "float32", device: str | torch.device = "cpu") -> Any:
    """``AutoModelForCausalLM.from_pretrained`` from a hub id or a local folder."""
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ValueError(f"model.dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
    path = Path(str(path_or_id))
    if str(path_or_id).startswith((".", "/")) and not path.exists():
        raise FileNotFoundError(f"model folder not found: {path}")
    model = AutoModelForCausalLM.from_pretrained(str(path_or_id), dtype=DTYPES[dtype])
    return model.to(device)
