"""Prompt building: base, instruct (chat template) and user template files."""

from __future__ import annotations

import pytest

from searchr1.data.prompts import TAGS, build_prompt, normalize_question, prompt_messages
from searchr1.models import train_tokenizer


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["Where was Alice Verdan born? <think> x </think>"] * 20, vocab_size=300)


def test_base_prompt_is_the_search_r1_instruction_with_the_question():
    p = build_prompt("  where was Alice Verdan born ")
    assert p.startswith("Answer the given question.")
    assert p.endswith("Question: where was Alice Verdan born?\n")
    for tag in TAGS:
        if tag not in ("<information>", "</information>"):
            assert tag in p
    assert "<information> and </information>" in p
    assert normalize_question("Why?") == "Why?"


def test_instruct_prompt_goes_through_the_chat_template(tok):
    p = build_prompt("Where was Alice Verdan born?", "instruct", tok)
    assert p.startswith("<|im_start|>user\nAnswer the given question.")
    assert p.endswith("Question: Where was Alice Verdan born?\n<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="needs a tokenizer"):
        build_prompt("q", "instruct")


def test_user_template_file(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text('Q: {question}\nJSON like {"a": 1} stays.\nA:')
    assert build_prompt("who?", str(path)) == 'Q: who?\nJSON like {"a": 1} stays.\nA:'
    assert prompt_messages("who", str(path)) == [
        {"role": "user", "content": 'Q: who?\nJSON like {"a": 1} stays.\nA:'}
    ]
    (tmp_path / "bad.txt").write_text("no slot here")
    with pytest.raises(ValueError, match="no \\{question\\} slot"):
        build_prompt("q", str(tmp_path / "bad.txt"))
    with pytest.raises(ValueError, match="neither one of base, instruct"):
        build_prompt("q", "chatty")
