"""Prompt building: base, instruct (chat template) and user template files."""

from __future__ import annotations

import pytest
from tinymodel import train_tokenizer

from searchr1.config import load_config
from searchr1.data.formats import Sample
from searchr1.data.prompts import (
    TAGS,
    build_prompt,
    describe_template,
    load_template,
    normalize_question,
    prompt_messages,
    resolve_template,
)
from searchr1.demo.settings import write_prompt


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


def test_one_shot_template_puts_the_instruction_in_the_system_message(tok):
    p = build_prompt("Who founded Berak Institute", "instruct_1shot", tok)
    assert p.startswith("<|im_start|>system\nAnswer the given question.")
    assert "Question: {question}" not in p
    assert "<search> Pim Aldera </search>" in p and "<answer> Tarsk </answer>" in p
    assert p.endswith("<|im_start|>user\nWho founded Berak Institute?<|im_end|>\n<|im_start|>assistant\n")


def test_the_worked_examples_name_nothing_a_synthetic_world_can_contain():
    from searchr1.data.prompts import BRIDGE_TRAJECTORY, EXAMPLE_TRAJECTORY, TWO_HOP_TRAJECTORY
    from searchr1.data.synth import SynthConfig, generate_world

    names = {
        EXAMPLE_TRAJECTORY: ("Pim", "Aldera", "Tarsk"),
        TWO_HOP_TRAJECTORY: ("Ulmera", "Edda", "Ostin", "Orvale"),
        BRIDGE_TRAJECTORY: ("Ilka", "Pim", "Aldera", "Tarsk"),  # "Lantern" is a common word of titles
    }
    for seed in range(6):
        world = generate_world(SynthConfig(seed=seed, num_entities=300))
        text = " ".join(row["contents"] + " " + row.get("title", "") for row in world.corpus)
        for trajectory, words in names.items():
            for name in words:
                assert name in trajectory and name not in text


def test_two_shot_template_adds_a_two_search_example_before_the_question(tok):
    from searchr1.rewards import check_format

    p = build_prompt("Who founded Berak Institute", "instruct_2shot", tok)
    first, second = p.index("<answer> Tarsk </answer>"), p.index("<answer> 1838 </answer>")
    assert first < second < p.index("Who founded Berak Institute?")
    assert (
        p.count("<search> Edda Ostin </search>") == 1 and p.count("<search>") == 4
    )  # 1 + 2, and the instruction's
    from searchr1.data.prompts import TWO_HOP_TRAJECTORY

    assert check_format(TWO_HOP_TRAJECTORY).valid  # the example is what the structure reward asks for


def test_two_hop_template_shows_two_searches_in_each_example(tok):
    from searchr1.data.prompts import BRIDGE_TRAJECTORY
    from searchr1.rewards import check_format

    p = build_prompt("Who founded Berak Institute", "instruct_2hop", tok)
    first, second = p.index("<answer> Tarsk </answer>"), p.index("<answer> 1838 </answer>")
    assert first < second < p.index("Who founded Berak Institute?")
    # each example searches twice, the second time for the name its first passage gave
    assert p.index("<search> The Ilka Lantern </search>") < p.index("<search> Pim Aldera </search>") < first
    assert p.count("<search>") == 5  # 2 + 2, and the instruction's
    assert check_format(BRIDGE_TRAJECTORY).valid


def test_chat_message_file_template(tmp_path, tok):
    path = tmp_path / "p.json"
    path.write_text(
        '[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q: {question}"}]'
    )
    assert prompt_messages("who", str(path)) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Q: who?"},
    ]
    assert build_prompt("who", str(path), tok).endswith(
        "<|im_start|>user\nQ: who?<|im_end|>\n<|im_start|>assistant\n"
    )
    path.write_text("[not json")
    with pytest.raises(ValueError, match="not valid json"):
        build_prompt("q", str(path), tok)


@pytest.mark.parametrize("template", ["instruct_2hop", "base"])
def test_a_written_prompt_file_gives_back_each_question_with_one_question_mark(tmp_path, tok, template):
    """The demo writes its template to prompt.json and runs every question through that file: the slot
    stays open there, so "When was X founded?" is asked as written (it read "founded??" before)."""
    path = write_prompt(tmp_path, template)
    assert "{question}?" not in path.read_text()
    messages = prompt_messages("When was Gubed Works founded?", str(path))
    assert messages == prompt_messages("When was Gubed Works founded?", template)
    assert "When was Gubed Works founded?" in messages[-1]["content"]
    assert "??" not in messages[-1]["content"]


def test_auto_is_the_chat_template_when_the_tokenizer_has_one_else_base(tok):
    assert load_config().data.template == "auto"  # the default of data.template and --template
    plain = train_tokenizer(["Where was Alice Verdan born?"] * 20, vocab_size=300)
    plain.chat_template = None
    assert resolve_template("auto", tok) == "instruct" and resolve_template("auto", plain) == "base"
    assert resolve_template("instruct_1shot", plain) == "instruct_1shot"  # asked for: kept
    assert build_prompt("q", "auto", tok) == build_prompt("q", "instruct", tok)
    assert build_prompt("q", "auto", plain) == build_prompt("q", "base")
    sample = Sample(id="1", question="q", golden_answers=["a"])
    assert sample.prompt("auto", tok) == build_prompt("q", "instruct", tok)
    assert describe_template("auto", "instruct") == "instruct (auto: the model has a chat template)"
    assert describe_template("auto", "base") == "base (auto: the model has no chat template)"
    assert describe_template("base", "base") == "base"
    with pytest.raises(ValueError, match="resolve_template"):
        load_template("auto")
