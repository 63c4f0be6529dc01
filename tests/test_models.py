from __future__ import annotations

import pytest
import torch

from searchr1.data.prompts import TAGS
from searchr1.models import load_model, load_tokenizer


def test_tiny_folder_loads_through_from_pretrained(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir)
    ids = tok("Alice Verdan <search> Borvik </search>", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))


def test_every_tag_is_one_token_and_survives_decoding(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    for tag in TAGS:
        ids = tok(tag, add_special_tokens=False).input_ids
        assert len(ids) == 1, tag
        assert tok.decode(ids, skip_special_tokens=True) == tag


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_model(tmp_path / "nope")
    with pytest.raises(ValueError, match=r"model\.dtype"):
        load_model(tmp_path, dtype="float8")


def test_number_tokens_make_each_year_one_token():
    from searchr1.models import train_tokenizer

    years = [str(y) for y in range(1800, 1960, 7)]
    texts = [f"Ilse was born in {y}; the town has 507000 inhabitants." for y in years] * 2
    whole = train_tokenizer(texts, vocab_size=280, tag_tokens=False, number_tokens=True)
    for year in years:
        assert [whole.decode([i]) for i in whole(f"in {year}.", add_special_tokens=False).input_ids][-2:] == [
            year,
            ".",
        ]
    assert "507000" not in whole.get_added_vocab() and set(years) <= set(whole.get_added_vocab())
    plain = train_tokenizer(texts, vocab_size=280, tag_tokens=False)
    assert sum(len(plain(y, add_special_tokens=False).input_ids) > 1 for y in years) > len(years) // 2
    for text in ("born in 1801.", "507000 people", "<answer> 1947 </answer>"):
        assert whole.decode(whole(text, add_special_tokens=False).input_ids) == text
