"""The starting model of the learning demo: what it reads, determinism, caching, its tokenizer."""

from __future__ import annotations

import itertools
import json
import re

import pytest
import torch
from tiny_pretrain import TINY

from searchr1.data.prompts import TAGS
from searchr1.data.synth import SynthConfig, generate_world
from searchr1.pretrain import (
    PRETRAIN_BASE_SEED,
    RESERVED_TAGS,
    PretrainSettings,
    copy_accuracy,
    copy_batch,
    copy_span_batch,
    describe_corpus,
    mark_text,
    prepare_starting_model,
    pretraining_corpus,
    source_fingerprint,
    tag_vocabulary,
    window_starts,
)

SMALL = dict(worlds=1, num_entities=60, markup_pages=400)
_TAG_LINE = re.compile(r"^<([a-z]+)> (.+) </([a-z]+)>$")


def _pretraining_questions() -> dict[str, str]:
    world = generate_world(
        SynthConfig(num_entities=60, filler_sentences=0, seed=PRETRAIN_BASE_SEED, num_train=400,
                    num_val=1, num_test=1, hop_mix={"single": 1.0})
    )  # fmt: skip
    return {q["question"]: q["metadata"]["hops"][0] for q in world.splits["train"]}


def _question_of(line: str) -> str:
    """The question a line holds (without a label or wrapping tags), else the line."""
    line = re.sub(r"^<[a-z]+>|</[a-z]+>$", "", line)
    return line.rsplit(": ", 1)[-1]


def _text_lines(doc: str) -> list[str]:
    """A page's lines of text: without blank lines and a wrapped line's own closing tag."""
    return [x for x in doc.split("\n") if x and not re.fullmatch(r"</[a-z]+>", x)]


def test_the_demo_tags_never_occur_and_no_question_meets_its_answer():
    docs = pretraining_corpus(PretrainSettings(**SMALL))
    assert not any(tag in doc for doc in docs for tag in TAGS)
    asked = _pretraining_questions()
    pages_with_questions = 0
    for doc in docs:
        lines = _text_lines(doc)
        questions = [_question_of(line) for line in lines]
        for question in questions:
            if question not in asked:
                continue
            pages_with_questions += 1
            entity = asked[question]
            # the lines naming the asked entity are questions, or the tag right after the question
            # (which marks a name of the question): no line says anything about that entity
            for j, other in enumerate(lines):
                if entity in other and questions[j] not in asked:
                    after_question = j > 0 and asked.get(questions[j - 1]) == entity
                    assert after_question and _TAG_LINE.match(other), (doc, entity)
    assert pages_with_questions > 20


def test_markup_tags_are_declared_never_reserved_and_mark_a_name_of_the_line_above():
    docs = [d for d in pretraining_corpus(PretrainSettings(**SMALL)) if " between <" in d.split("\n")[0]]
    assert len(docs) == SMALL["markup_pages"]
    tag_lines = 0
    layouts = set()
    for doc in docs:
        legend, *lines = doc.split("\n")
        declared = set(re.findall(r"<([a-z]+)>", legend))
        assert 2 <= len(declared) <= 3 and not declared & RESERVED_TAGS
        text = _text_lines("\n".join(lines))
        layouts.add(("\n\n" in doc, any(re.fullmatch(r"</[a-z]+>", x) for x in lines)))
        for above, line in itertools.pairwise(text):
            m = _TAG_LINE.match(line)
            if m is None:
                continue
            tag_lines += 1
            assert m.group(1) == m.group(3) and m.group(1) in declared
            assert m.group(2) in above
    assert tag_lines >= len(docs)
    assert layouts == {(False, False), (False, True), (True, False), (True, True)}


def test_a_phrase_mark_is_a_piece_of_its_sentence_around_the_name():
    import random

    line = "Doc 1(Title: Alice Verdan) Alice Verdan was a painter. Alice Verdan was born in Zemoor in 1932."
    rng = random.Random(0)
    assert mark_text(line, "Zemoor", False, rng) == "Zemoor"
    pieces = {mark_text(line, value, True, rng) for value in ("Zemoor", "1932", "painter") for _ in range(40)}
    for piece in pieces:
        assert piece in line and ". " not in piece and not piece.endswith(".")
        assert any(v in piece and piece != v for v in ("Zemoor", "1932", "painter"))
    assert {"born in Zemoor in 1932", "in 1932", "Zemoor in"} <= pieces


def test_phrase_marks_enclose_phrases_of_the_line_above():
    docs = pretraining_corpus(PretrainSettings(**SMALL, phrase_marks=1.0))
    marks = 0
    for doc in (d for d in docs if " between <" in d.split("\n")[0]):
        for above, line in itertools.pairwise(_text_lines("\n".join(doc.split("\n")[1:]))):
            m = _TAG_LINE.match(line)
            if m and m.group(1) == m.group(3):
                marks += 1
                assert m.group(2) in above and len(m.group(2).split()) >= 2, (above, line)
    assert marks > SMALL["markup_pages"]


def _pretraining_world_kinds() -> dict[str, str]:
    from searchr1.pretrain import _world_names

    return _world_names(
        generate_world(
            SynthConfig(num_entities=60, filler_sentences=0, seed=PRETRAIN_BASE_SEED, num_train=400,
                        num_val=1, num_test=1, hop_mix={"single": 1.0})
        )
    )  # fmt: skip


def _marks(doc: str) -> list[tuple[str, str, str]]:
    """(legend, line above, tag line) for each mark of a marked-up page."""
    legend, *rest = doc.split("\n")
    text = _text_lines("\n".join(rest))
    return [(legend, above, line) for above, line in itertools.pairwise(text) if _TAG_LINE.match(line)]


def test_a_kind_legend_tag_marks_values_of_that_kind():
    from searchr1.pretrain import KIND_NOUNS, mentions_in

    kinds = _pretraining_world_kinds()
    noun_kind = {noun: kind for kind, nouns in KIND_NOUNS.items() for noun in nouns}
    docs = pretraining_corpus(PretrainSettings(**SMALL, kind_legends=1.0))
    checked: dict[str, int] = {}
    for doc in (d for d in docs if " between <" in d.split("\n")[0]):
        for legend, above, line in _marks(doc):
            tag, value = _TAG_LINE.match(line).group(1, 2)
            noun = re.search(rf"put (.+?) between <{tag}>", legend, re.IGNORECASE)
            if noun and noun.group(1) in noun_kind:
                assert kinds[value] == noun_kind[noun.group(1)], (legend, above, line)
                assert value != mentions_in(_question_of(above), kinds)[0]  # not the name the line is about
                checked[noun_kind[noun.group(1)]] = checked.get(noun_kind[noun.group(1)], 0) + 1
    assert set(checked) == set(KIND_NOUNS) and sum(checked.values()) > 100, checked
    plain = pretraining_corpus(PretrainSettings(**SMALL))
    assert not any(re.search(r"put (a city or a country|the name of a person) between", d) for d in plain)


def test_without_mark_subject_a_mark_skips_the_name_a_line_is_about():
    from searchr1.pretrain import mentions_in

    kinds = _pretraining_world_kinds()
    docs = pretraining_corpus(PretrainSettings(**SMALL, mark_subject=False))
    subject_marks = other_marks = 0
    for doc in (d for d in docs if " between <" in d.split("\n")[0]):
        for _, above, line in _marks(doc):
            found = mentions_in(above, kinds)
            value = _TAG_LINE.match(line).group(2)
            if len(set(found)) > 1:
                assert value != found[0], (above, line)
                other_marks += 1
            else:
                subject_marks += value == found[0]
    assert other_marks > 100 and subject_marks > 20


def test_two_marking_tags_on_every_page_when_asked():
    def marking_tags(settings: PretrainSettings) -> list[int]:
        legends = [d.split("\n")[0] for d in pretraining_corpus(settings) if " between <" in d.split("\n")[0]]
        return [len(re.findall(r"put .+? between <", x, re.IGNORECASE)) for x in legends]

    assert set(marking_tags(PretrainSettings(**SMALL, two_marking_tags=True))) == {2}
    assert set(marking_tags(PretrainSettings(**SMALL))) == {1, 2}


def test_markup_lines_sets_how_many_lines_a_page_marks():
    def marks_per_page(settings: PretrainSettings) -> list[int]:
        pages = [d for d in pretraining_corpus(settings) if " between <" in d.split("\n")[0]]
        return [sum(bool(_TAG_LINE.match(x)) for x in _text_lines(page)) for page in pages]

    default, longer = (
        marks_per_page(PretrainSettings(**SMALL)),
        marks_per_page(PretrainSettings(**SMALL, markup_lines=(5, 6))),
    )
    assert max(default) <= 4 and max(longer) <= 6
    # a page with a question drops the other lines about its entity, so a few pages mark fewer
    assert sum(n >= 5 for n in longer) > 0.8 * len(longer) and sum(n >= 5 for n in default) == 0


def test_the_default_corpus_is_the_one_the_shipped_model_was_built_from():
    """The optional page settings (off by default) leave the default corpus byte for byte as it was
    when the shipped starting model was measured (commit b9cef50); change this hash only with a new
    recipe, measured."""
    import hashlib

    docs = pretraining_corpus(PretrainSettings(worlds=4, markup_pages=3000))
    assert hashlib.sha256("\x00".join(docs).encode()).hexdigest()[:16] == "9a690eff0ed1959d"


def test_tag_names_come_from_the_whole_vocabulary_never_a_reserved_tag():
    from searchr1.models import train_tokenizer

    texts = ["the search for an answer gave information about Borvik and Zemoor"] * 40
    names = tag_vocabulary(train_tokenizer(texts, vocab_size=300, tag_tokens=False))
    assert "about" in names and "gave" in names
    assert not set(names) & RESERVED_TAGS and all(re.fullmatch(r"[a-z]{2,}", n) for n in names)
    docs = pretraining_corpus(PretrainSettings(**SMALL), tag_names=["zzword"])
    legends = [d.split("\n")[0] for d in docs if " between <" in d.split("\n")[0]]
    assert sum("<zzword>" in x for x in legends) > len(legends) / 2  # two tags in three are words


def test_training_windows_start_at_a_document():
    stream = torch.tensor([5, 6, 0, 7, 8, 9, 0, 4, 0, 3, 3, 3, 3])
    starts = window_starts(stream, eos=0, seq_len=3)
    assert starts.tolist() == [0, 3, 7, 9]
    assert all(s == 0 or stream[s - 1] == 0 for s in starts.tolist())
    assert all(s + 4 <= len(stream) for s in starts.tolist())


def test_corpus_is_from_other_worlds_than_the_demo():
    docs = "\n".join(pretraining_corpus(PretrainSettings(worlds=2, num_entities=60, markup_pages=50)))
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
    assert 0.0 <= manifest["copy_accuracy"] <= 1.0
    stamp = (a / "model.safetensors").stat().st_mtime_ns
    assert prepare_starting_model(tmp_path / "a", PretrainSettings(**TINY)) == a
    assert (a / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    other = prepare_starting_model(tmp_path / "a", PretrainSettings(**{**TINY, "seed": 1}))
    assert json.loads((other / "pretrain.json").read_text())["settings"]["seed"] == 1
    spans = prepare_starting_model(tmp_path / "c", PretrainSettings(**{**TINY, "copy_spans": True}))
    ws = load_file(str(spans / "model.safetensors"))
    assert any(not torch.equal(wa[k], ws[k]) for k in wa)  # the copy task reaches the weights
    assert "recurs" in json.loads((spans / "pretrain.json").read_text())["what_it_saw"]


def test_a_model_cached_by_other_code_is_rebuilt(tmp_path, monkeypatch):
    import searchr1.pretrain as pretrain_module

    settings = PretrainSettings(**TINY)
    built = prepare_starting_model(tmp_path / "m", settings)
    stamp = (built / "model.safetensors").stat().st_mtime_ns
    key = settings.key()
    monkeypatch.setattr(pretrain_module, "code_version", lambda: "edited-code")
    assert settings.key() != key  # same settings, other code: another cache folder
    prepare_starting_model(tmp_path / "m", settings)
    assert (built / "model.safetensors").stat().st_mtime_ns != stamp  # rebuilt, not reused
    assert json.loads((built / "pretrain.json").read_text())["code_version"] == "edited-code"


_MODULE = '''"""A module."""

STEPS = 3
"""How many steps."""


def run(x):
    """Run."""
    try:
        return x * STEPS
    finally:
        pass
'''


def test_docstring_comment_and_layout_edits_keep_the_code_fingerprint():
    base = source_fingerprint(_MODULE)
    edited_prose = (
        _MODULE.replace('"""Run."""', '"""Run it twice, as the README says."""')
        .replace('"""How many steps."""', "")
        .replace("STEPS = 3", "STEPS = 3  # three: measured")
        .replace("        return x * STEPS", "\n        return (x\n                * STEPS)")
        .replace(
            "        pass", '        """Nothing to undo."""\n        pass'
        )  # a string in a finally block
    )
    assert source_fingerprint(edited_prose) == base
    assert source_fingerprint(_MODULE.replace("STEPS = 3", "STEPS = 4")) != base
    assert source_fingerprint(_MODULE.replace("x * STEPS", "STEPS * x")) != base
    assert source_fingerprint(_MODULE.replace("return x", "return 'x'")) != base  # a string that is code


def test_tags_are_split_and_read_the_same_inside_a_line_and_at_its_start(tmp_path):
    from searchr1.models import load_tokenizer

    tok = load_tokenizer(prepare_starting_model(tmp_path / "m", PretrainSettings(**TINY)))

    def pieces(text: str) -> list[str]:
        return [tok.decode([i]) for i in tok(text, add_special_tokens=False)["input_ids"]]

    assert len(pieces("<search>")) > 1  # no tag is a token of its own
    inline = pieces("Put a name between <kel> and </kel>.")
    start = pieces("<kel> Borvik </kel>")
    assert "<" in inline and "</" in inline and start[0] == "<" and "</" in start
    # a word is the same tokens after a space, after "<" and at a line's start
    word = pieces("kel")
    assert (
        inline[inline.index("<") + 1 : inline.index("<") + 1 + len(word)] == word == start[1 : 1 + len(word)]
    )
    assert " " in inline
    assert (
        tok.decode(tok("a <kel> b </kel>\n", add_special_tokens=False)["input_ids"]) == "a <kel> b </kel>\n"
    )


def test_the_marking_tags_of_a_page_take_turns():
    docs = [d for d in pretraining_corpus(PretrainSettings(**SMALL)) if " between <" in d.split("\n")[0]]
    pages_with_turns = 0
    for doc in docs:
        legend, *lines = doc.split("\n")
        wrap = set(re.findall(r"come between <([a-z]+)>", legend))
        marking = [t for t in re.findall(r"between <([a-z]+)>", legend) if t not in wrap]
        used = [m.group(1) for x in lines if (m := _TAG_LINE.match(x))]
        start = marking.index(used[0])
        assert used == [marking[(start + i) % len(marking)] for i in range(len(used))], doc
        pages_with_turns += len(marking) == 2 and len(used) >= 2
    assert pages_with_turns > 50


@pytest.mark.parametrize("tied", [False, True])
def test_tag_name_targets_train_the_copying_not_the_output_embeddings(tied):
    import torch.nn.functional as F

    from searchr1.models import build_tiny_model, train_tokenizer
    from searchr1.pretrain import _corpus_loss, _next_token_loss

    text = "Put a name between <kel> and </kel>.\nBorvik is a city.\n<kel> Borvik </kel>"
    tokenizer = train_tokenizer([text, "the answer was found"] * 20, vocab_size=300, tag_tokens=False)
    model = build_tiny_model(tokenizer, seed=0, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied)  # fmt: skip
    batch = torch.tensor([tokenizer(text)["input_ids"]])
    openers = torch.tensor([tokenizer.convert_tokens_to_ids(t) for t in ("<", "</")])
    head = model.get_output_embeddings().weight

    def head_grad(loss: torch.Tensor) -> torch.Tensor:
        model.zero_grad()
        loss.backward()
        return head.grad.clone()

    loss = _corpus_loss(model, batch, openers)
    assert torch.allclose(loss, _next_token_loss(model, batch))  # the same loss value
    corpus = head_grad(loss)
    # the output projection learns from the text positions only: the text-only loss's gradient (for
    # tied embeddings: on the rows of tokens that are not in the input, like "answer" here)
    logits = model(input_ids=batch[:, :-1]).logits[0]
    text_only = ~torch.isin(batch[0, :-1], openers)
    text_loss = (
        F.cross_entropy(logits[text_only], batch[0, 1:][text_only], reduction="sum") / text_only.numel()
    )
    rows = torch.ones(len(head), dtype=torch.bool)
    if tied:
        rows[batch[0]] = False
    answer = tokenizer.convert_tokens_to_ids("answer")
    assert answer is not None and rows[answer]
    assert torch.allclose(corpus[rows], head_grad(text_loss)[rows], atol=1e-6)
    assert not torch.allclose(corpus[rows], head_grad(_next_token_loss(model, batch))[rows], atol=1e-6)


def test_the_worlds_are_built_once_for_both_corpora():
    from searchr1.pretrain import corpus_sources

    settings = PretrainSettings(**SMALL)
    sources = corpus_sources(settings)
    # the sources carry the random stream where the marked-up pages start: reusing them (as pretrain
    # does for the tokenizer's corpus and the training corpus) gives the corpus built from scratch
    for tags in (None, ["kel", "dor"]):
        fresh = pretraining_corpus(settings, tag_names=tags)
        assert pretraining_corpus(settings, tag_names=tags, sources=sources) == fresh
        assert pretraining_corpus(settings, tag_names=tags, sources=sources) == fresh


def test_number_tokens_reach_the_starting_model(tmp_path):
    from searchr1.models import load_model, load_tokenizer

    folder = prepare_starting_model(tmp_path / "m", PretrainSettings(**TINY, number_tokens=True))
    tokenizer, model = load_tokenizer(folder), load_model(folder)
    years = [t for t in tokenizer.get_added_vocab() if re.fullmatch(r"\d{4}", t)]
    assert len(years) > 10 and model.get_input_embeddings().num_embeddings >= len(tokenizer)
    year = years[0]
    assert tokenizer.decode(tokenizer(f"in {year}.", add_special_tokens=False).input_ids) == f"in {year}."


def test_copy_strings_from_a_small_alphabet_repeat_tokens_and_are_written_twice():
    ids = torch.arange(100, 600)
    gen = torch.Generator().manual_seed(0)
    batch = copy_batch(64, 24, ids, eos=1, gen=gen, alphabet=5)
    assert batch.shape == (64, 49)
    first, second = batch[:, :24], batch[:, 24:48]
    assert torch.equal(first, second) and bool((batch[:, 48] == 1).all())
    sizes = [len(set(row.tolist())) for row in first]
    assert max(sizes) <= 5 and set(first.flatten().tolist()) <= set(ids.tolist())
    assert sum(size >= 2 for size in sizes) > 48  # almost every row mixes tokens, each repeated
    # the whole vocabulary (the default): tokens rarely repeat within a string
    wide = copy_batch(64, 24, ids, eos=1, gen=gen)[:, :24]
    assert sum(len(set(row.tolist())) for row in wide) / 64 > 20
    with pytest.raises(ValueError, match="copy_alphabet"):
        PretrainSettings(copy_alphabet=1)


GOLDEN_COPY_ROWS = [
    [1844, 1339, 233, 860, 263, 1844, 1339, 233, 860, 263, 1],
    [1779, 827, 603, 1097, 883, 1779, 827, 603, 1097, 883, 1],
]  # copy_batch before the copy options existed (commit ee47792), seed 0


def test_the_default_copy_rows_are_the_ones_the_shipped_model_was_built_from():
    """A change detector: the shipped starting model's warm-up drew exactly these rows."""
    batch = copy_batch(2, 5, torch.arange(100, 2000), eos=1, gen=torch.Generator().manual_seed(0))
    assert batch.tolist() == GOLDEN_COPY_ROWS


def test_copy_spans_recur_at_varying_distances_and_only_the_repeat_is_scored():
    ids = torch.arange(100, 2000)
    tokens, targets = copy_span_batch(200, 24, ids, eos=1, gen=torch.Generator().manual_seed(0))
    assert tokens.shape == (200, 49) and targets.shape == (200, 48) and bool((tokens[:, -1] == 1).all())
    distances = set()
    for row, target in zip(tokens.tolist(), targets.tolist(), strict=True):
        scored = [i for i, t in enumerate(target) if t != -100]
        assert scored == list(range(scored[0], scored[-1] + 1)) and len(scored) >= 3
        assert all(target[i] == row[i + 1] for i in scored)  # the target is the next token
        start, end = scored[0], scored[-1] + 2  # the repeat: its first token and the scored ones
        span = row[start:end]
        earlier = [d for d in range(len(span), start + 1) if row[start - d : end - d] == span]
        assert earlier and min(earlier) - len(span) <= 3  # right after the first copy, or 1-3 later
        distances.add(min(earlier))
    assert len(distances) > 10  # no fixed offset predicts the repeats


class _Copier(torch.nn.Module):
    """Scores one next token per position: the token after the last earlier occurrence of the
    current one (an ideal induction head), or with ``offset`` the token ``offset - 1`` back (what a
    model trained only on strings written twice ``offset`` tokens apart may learn instead)."""

    def __init__(self, vocab: int, offset: int = 0) -> None:
        super().__init__()
        self.vocab, self.offset = vocab, offset

    def forward(self, input_ids):
        logits = torch.zeros(*input_ids.shape, self.vocab)
        for r, row in enumerate(input_ids.tolist()):
            last: dict[int, int] = {}
            for i, t in enumerate(row):
                if self.offset and i >= self.offset - 1:
                    logits[r, i, row[i - self.offset + 1]] = 1.0
                elif not self.offset and t in last:
                    logits[r, i, row[last[t] + 1]] = 1.0
                last[t] = i
        return type("Out", (), {"logits": logits})()


def test_copy_accuracy_tells_an_induction_head_from_a_fixed_offset():
    ids = torch.arange(100, 2000)
    assert copy_accuracy(_Copier(2000), ids, eos=1, rows=64) > 0.95
    assert copy_accuracy(_Copier(2000, offset=24), ids, eos=1, rows=64) < 0.2
