"""The starting model of the learning demo: a tiny LM pre-trained, self-supervised, on other worlds.

A real base model (Qwen2.5-3B) arrives at Search-R1 training knowing its language: it has read
encyclopedia text, search-result pages and instructions, never the Search-R1 trajectories.
This module builds the tiny CPU analogue, deterministically, from nothing downloaded:

1. **Corpus** (``pretraining_corpus``): the passages of ``worlds`` small synthetic worlds generated
   with seeds that no demo world uses (``PRETRAIN_BASE_SEED + i``), so it learns how such passages
   are written but none of the facts of the world it is later trained and tested on (many small
   worlds: a name recurs only a few times, so it is predicted by copying, not from memory); the same
   passages as search-result pages (``Doc 1(Title: ...) ...``); lists of questions about those
   worlds, never answered; and marked-up pages (``markup_page``): a legend that declares 2-3
   tags (``Put a name between <kel> and </kel>``), named after any word piece of the vocabulary
   (``tag_vocabulary``) or invented, then lines each followed by a declared tag around a name or
   value of that line, the marking tags taking turns. That is the generic markup skill of a
   base model: copy a tag from a legend, mark a name of the text above. The demo's own tags
   (``search``, ``information``, ``answer``, ``think``) never occur: they reach the model only
   through the instruction, as for a real base model. No question is ever followed by its answer
   (a page with a question has no other line about the asked entity), and no trajectory
   (search -> information -> answer) is ever shown.
2. **Tokenizer**: byte-level BPE trained on that corpus (``searchr1.models.train_tokenizer`` with
   ``tag_tokens=False``: tags are split like text; ``<``, ``</`` and every space are tokens of their
   own, so a word is the same tokens after a space, after ``<`` and at a line's start).
3. **Model**: a Qwen2-style decoder (``searchr1.models.build_tiny_model``). A copy warm-up first
   (``copy_warmup_steps`` on random token strings written twice: in-context copying, the induction
   heads a base model has, which a 2-layer model otherwise needs far more text to form), then the
   next-token loss on the corpus in ``seq_len`` windows that start at a document's start, with a
   few copy rows in every step (AdamW, warm-up + cosine decay). Where the target is a tag name, the
   loss does not reach the output projection (``detach_tag_names``): the model learns to copy a tag
   name from the legend, not a list of which words are tag names.

Options, off by default and measured in the README's round-5 and round-6 tables (none lifted the
demo's result): ``phrase_marks``, ``mark_subject``, ``kind_legends``, ``two_marking_tags`` (marked-up
pages), ``markup_lines`` (lines per marked-up page), ``number_tokens`` (tokenizer), ``copy_spans`` and
``copy_alphabet`` (the copy task: the default one teaches copying from a fixed distance only,
``copy_accuracy`` measures it). ``markup_lines`` is a knob, not a default; the turn-taking of marking
tags, which it exercises, was learnt by no model measured (see the README's round 6).

The result is an ordinary Hugging Face folder with a ``pretrain.json`` manifest (settings, corpus
statistics, loss curve, the exact statement of what the model saw). ``prepare_starting_model``
reuses a folder whose manifest has the same key: the same settings and the same code
(``code_version``: the modules' syntax trees, so an edit of a comment or a docstring keeps the
cache); same settings and code -> identical weights.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import random
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.data.prompts import format_observation_docs
from searchr1.retrieval.base import Hit

if TYPE_CHECKING:
    import torch

DEMO_INSTRUCTION = (
    "Put the answer between <answer> and </answer>; put a search between <search> and </search>; "
    "the results come between <information> and </information>.\nQuestion: {question}\n"
)
"""The learning demo's prompt: Search-R1's instruction cut down to one line that declares the tags,
worded like the legends of the pre-training pages (a 2-layer model has no use for the rest);
its slot is ``{question}``."""

RESERVED_TAGS = frozenset({"search", "answer", "information", "think"})
"""Tag names that never occur in the pre-training corpus: the demo's tags reach the model only
through the instruction."""

PRETRAIN_BASE_SEED = 7_000_001
"""Seed of the first pre-training world; demo worlds use small seeds (0, 1, 2, ...)."""
MANIFEST = "pretrain.json"
COPY_RUN = 24
"""Length of the random token strings of the copy warm-up."""
COPY_WEIGHT = 0.3
"""Weight of the copy loss added to every corpus step."""


@dataclass
class PretrainSettings:
    """What the starting model is and what it reads (every field enters the cache key)."""

    worlds: int = 200
    """Differently seeded synthetic worlds whose passages form the corpus (many small worlds: a
    name is seen a few times only, so it is predicted by copying it from the context, not from
    memory)."""
    num_entities: int = 30
    """Entities per pre-training world."""
    filler_sentences: int = 0
    """Fact-free sentences per passage in the pre-training worlds."""
    result_pages: bool = True
    """Also render the passages as search-result pages (``Doc i(Title: t) text`` lines)."""
    quiz_pages: bool = True
    """Also write lists of questions about the pre-training worlds' entities (never answered)."""
    markup_pages: int = 30000
    """Marked-up pages: a legend declaring 2-3 tags, then lines of text each followed by a tag that
    marks a name or a value of that line (see ``markup_page``)."""
    markup_lines: tuple[int, int] = (1, 4)
    """Fewest and most lines of text on a marked-up page (each followed by its mark): with more
    lines, more of the marks come after another tag's mark (the tags take turns)."""
    vocab_size: int = 2048
    """BPE vocabulary (tags are split like any text: ``<``, ``name``, ``>``; spaces are tokens)."""
    number_tokens: bool = False
    """Every four-digit number of the corpus (years, and populations of a few thousand) is one
    token, added beyond ``vocab_size`` (``searchr1.models.train_tokenizer``): a 2-layer model copies
    one token far more reliably than four digits."""
    hidden_size: int = 128
    """Width of the decoder."""
    num_layers: int = 2
    """Decoder layers."""
    num_heads: int = 4
    """Attention heads (key/value heads: half of them)."""
    seq_len: int = 256
    """Tokens per training window (documents are packed, separated by EOS)."""
    batch_size: int = 16
    """Windows per optimizer step."""
    copy_warmup_steps: int = 120
    """First optimizer steps on random token strings written twice (``x y z x y z``): they teach the
    in-context copying (induction) a base model has, which the tiny model would otherwise need far
    more text to learn; they carry no word of any world."""
    steps: int = 900
    """Optimizer steps on the corpus, after the warm-up."""
    copy_rows: int = 24
    """Rows of random strings written twice added to every corpus step (keeps the copying); their
    loss enters with weight ``COPY_WEIGHT``."""
    copy_spans: bool = False
    """False: the copied strings are written twice, always ``COPY_RUN`` tokens apart (``copy_batch``;
    the shipped model learnt to copy from exactly that distance back, and copies nothing else);
    True: a span recurs at a random distance within random tokens and only its repeat is scored
    (``copy_span_batch``): only matching the tokens before it predicts it (an induction head). The
    copying forms late: in a 400-step warm-up its loss was 6.2 at step 300 and 1.6 at step 400, so
    pair it with ``copy_warmup_steps=400`` (120 steps of an earlier version of the task formed none)."""
    copy_alphabet: int = 0
    """0: the copied strings draw from every token of the corpus (a token rarely repeats within one,
    so the token after its earlier occurrence is the next one); k > 1: each string draws from at
    most 2..k tokens of its own, so the model must match the last few tokens, not the last one, to
    copy (as it must to copy a year's digits or a name's word pieces from a passage)."""
    phrase_marks: float = 0.0
    """Share of the marks of a marked-up page that enclose a phrase of the line (a name or value with
    1-6 words of its sentence, at most 3 on each side) instead of the name or value alone (see
    ``mark_text``; a phrase may hold the name the line is about; kind-legend marks are never phrases)."""
    kind_legends: float = 0.0
    """Chance that a marking tag is declared with a kind of value (``put a date between <kel> and
    </kel>``, see ``KIND_NOUNS``) and then marks values of that kind: granted only when every line the
    tag marks has a value of one kind besides the name the line is about, so the share of such tags is
    well below this number."""
    two_marking_tags: bool = False
    """Every marked-up page has two marking tags (which take turns; half the pages add a wrapping
    tag), as the demo has ``search`` and ``answer``; False: a quarter of the pages have one."""
    mark_subject: bool = True
    """Whether a mark may enclose the name a line is about (its first name: the title of a passage);
    False: a mark encloses one of the line's other distinct names and values, drawn uniformly (the
    line's first name only when it has no other)."""
    detach_tag_names: bool = True
    """Where the next token is a tag name (after ``<`` or ``</``), the loss trains the copying but
    does not reach the output projection, so that no token is learnt to be, or not to be, a tag name
    (with tied embeddings a token still learns as an input where it occurs)."""
    lr: float = 2e-3
    """Peak learning rate (linear warm-up over 5% of the steps, cosine decay to 10%)."""
    seed: int = 0
    """Seed of the weights, the corpus order and the batches (not of the worlds' facts)."""

    def __post_init__(self) -> None:
        if self.copy_alphabet < 0 or self.copy_alphabet == 1:
            raise ValueError(
                f"copy_alphabet must be 0 (the whole vocabulary) or at least 2, got {self.copy_alphabet}"
            )

    def key(self) -> str:
        """The cache key: these settings and the version of the code that builds the model."""
        blob = json.dumps({**asdict(self), "code": code_version()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


CODE_FILES = ("pretrain.py", "models.py", "data/synth.py", "data/prompts.py")
"""The modules (relative to the package) whose code decides the corpus, the tokenizer and the
model: a cached starting model built by other versions of them is never reused."""


def _is_bare_string(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def source_fingerprint(source: str) -> str:
    """A hash of what a module's text does: its syntax tree without bare string statements (module,
    class, function and attribute docstrings, in any block); comments and layout are not in the
    tree. An edit of a comment or docstring, or a reformatting, keeps the fingerprint; a change of the
    module's code changes it (a block left empty hashes as empty, not as ``pass``)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        for block in ("body", "orelse", "finalbody"):
            statements = getattr(node, block, None)
            if isinstance(statements, list):
                setattr(node, block, [s for s in statements if not _is_bare_string(s)])
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


def code_version() -> str:
    """A hash of the code of ``CODE_FILES`` (``source_fingerprint`` of each; the syntax tree's dump
    can differ between Python versions, which then rebuild once). Code the corpus uses from other
    modules (``format_observation_docs``, the world's ``Hit``) is not covered."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in CODE_FILES:
        text = (package / name).read_text(encoding="utf-8")
        digest.update(name.encode() + b"\0" + source_fingerprint(text).encode())
    return digest.hexdigest()[:12]


def _results_page(rows: list[tuple[str, str]]) -> str:
    return format_observation_docs([Hit(id=t, title=t, text=x, score=0.0) for t, x in rows])


# ---------------------------------------------------------------------------------------------
# marked-up pages: the generic markup skill of a base model (tags that mark names in text)
# ---------------------------------------------------------------------------------------------

_LEGEND_NOUNS = ["a name", "a place", "a date", "a term", "a key word", "a note", "a label", "an entry"]
KIND_NOUNS = {
    "date": ["a date", "a year"],
    "place": ["a place", "a city or a country"],
    "person": ["a person", "the name of a person"],
    "occupation": ["an occupation", "a job"],
    "number": ["a number"],
}
"""With ``kind_legends``: what a legend says a tag marks, per kind of value the tag then marks."""
_KIND_WORDS = {"date", "year", "place", "city", "country", "person", "occupation", "job", "number"}
"""With ``kind_legends``, a tag that marks any value is never declared with these words
(``put a city between <city>`` would promise a kind the tag does not keep)."""
_LEGEND_PLURALS = ["the lines", "the records", "the entries", "the notes", "the rows", "the items"]
_EVERYDAY = [
    "A search of the local archives found more about {n}.",
    "The results of that search are kept in the records.",
    "More information about {n} can be found in letters.",
    "No answer about {n} has been given.",
    "The answer is not known.",
    "Some information about {n} was lost.",
    "A later search gave no new results.",
    "The records answer some of these questions.",
]
"""Plain sentences appended to some passages, so that the words of the demo's instruction (search,
results, information, answer) are ordinary words of the language, never tag names."""
_LINE_LABELS = ["Line", "Entry", "Record", "Note", "Item", "Text", "Source"]


_SYLLABLE_ONSETS = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "st"]  # fmt: skip


def tag_name(rng: random.Random, words: list[str]) -> tuple[str, bool]:
    """A tag name for one page: two times in three one of ``words`` (as in ``<title>`` or ``<date>``:
    after ``<`` any word may come, so a tag is known only by copying it from the page's legend),
    else an invented lowercase word of 1-3 syllables; never one of ``RESERVED_TAGS``. Returns the
    name and whether it was drawn from ``words``."""
    if words and rng.random() < 2 / 3:
        return rng.choice(words), True
    while True:
        word = "".join(rng.choice(_SYLLABLE_ONSETS) + rng.choice("aeiou") for _ in range(rng.randint(1, 3)))
        word += rng.choice(["", "", "l", "n", "r", "s", "m", "k"])
        if word not in RESERVED_TAGS:
            return word, False


def tag_words(texts: list[str]) -> list[str]:
    """The lowercase words (3+ letters) of ``texts`` that may name a tag: all but ``RESERVED_TAGS``."""
    found = {w for t in texts for w in re.findall(r"\b[a-z]{3,}\b", t)}
    return sorted(found - RESERVED_TAGS)


def tag_vocabulary(tokenizer: Any) -> list[str]:
    """Every token of ``tokenizer`` that is a lowercase word piece of 2+ letters, but for
    ``RESERVED_TAGS``: the tag names of the marked-up pages the model is trained on. Drawn from the
    whole vocabulary, a tag name cannot be told from its look (a short list of tag words would be
    learnt by heart, and a tag outside it, like ``search``, never copied)."""
    names = {tokenizer.decode([i]) for i in range(len(tokenizer))}
    return sorted(n for n in names if re.fullmatch(r"[a-z]{2,}", n) and n not in RESERVED_TAGS)


def _legend_noun(tag: str, is_word: bool, rng: random.Random, generic: list[str]) -> str:
    """What the legend says a tag marks: half the time the tag's own word (``put a date between
    <date>``), else a noun of ``generic``."""
    if is_word and rng.random() < 0.5:
        return ("an " if tag[0] in "aeiou" else "a ") + tag
    return rng.choice(generic)


def _legend(
    tags: list[str],
    wrap: str | None,
    is_word: dict[str, bool],
    rng: random.Random,
    kinds: dict[str, str] | None = None,
) -> str:
    """One line declaring the page's tags, in the style of an instruction. ``kinds`` (a tag -> the
    kind of value it marks; ``None``: no kind legends on this corpus) declares those tags with a noun
    of their kind, and keeps the nouns of kinds away from the other tags (``put a job between <job>``
    would promise a kind that a generic tag does not keep)."""
    generic = (
        _LEGEND_NOUNS if kinds is None else [n for n in _LEGEND_NOUNS if n.split()[-1] not in _KIND_WORDS]
    )
    parts = []
    for t in tags:
        if kinds and t in kinds:
            noun = rng.choice(KIND_NOUNS[kinds[t]])
        else:
            noun = _legend_noun(t, is_word[t], rng, generic)
            if kinds is not None and noun.split()[-1] in _KIND_WORDS:
                noun = rng.choice(generic)
        parts.append(f"put {noun} between <{t}> and </{t}>")
    if wrap is not None:
        parts.insert(
            rng.randrange(len(parts) + 1),
            f"{rng.choice(_LEGEND_PLURALS)} come between <{wrap}> and </{wrap}>",
        )
    text = "; ".join(parts) + "."
    return text[0].upper() + text[1:]


def mentions_in(line: str, names: Iterable[str]) -> list[str]:
    """The names and values (longest first, no overlaps) that occur in ``line``."""
    found: list[tuple[int, str]] = []
    taken: list[tuple[int, int]] = []
    for name in names:  # sorted longest first
        start = line.find(name)
        while start >= 0:
            end = start + len(name)
            boundary = (start == 0 or not line[start - 1].isalnum()) and (
                end == len(line) or not line[end].isalnum()
            )
            if boundary and all(end <= a or start >= b for a, b in taken):
                taken.append((start, end))
                found.append((start, name))
            start = line.find(name, end)
    return [n for _, n in sorted(found)]


def mark_text(line: str, mention: str, phrase: bool, rng: random.Random) -> str:
    """What a mark encloses: ``mention`` itself, or (``phrase``) the piece of ``line`` from up to 3
    words before ``mention`` to up to 3 words after it (at least one word more), within its
    sentence and without the sentence's final stop: ``born in Zemoor in 1932``."""
    if not phrase:
        return mention
    start = line.find(mention)
    end = start + len(mention)
    stop = line.rfind(". ", 0, start)
    first = stop + 2 if stop >= 0 else 0
    stop = line.find(". ", end)
    last = stop if stop >= 0 else len(line)
    words = [(w.start(), w.end()) for w in re.finditer(r"\S+", line)]
    before = [a for a, b in words if b <= start and a >= first]
    after = [b for a, b in words if a >= end and b <= last + 1]
    left = rng.randint(0, min(3, len(before)))
    right = rng.randint(0, min(3, len(after)))
    if left + right == 0 and (before or after):
        left, right = (1, 0) if before else (0, 1)
    a = before[len(before) - left] if left else start
    b = after[right - 1] if right else end
    return line[a:b].rstrip(".,;?")


def markup_page(
    lines: list[tuple[str, dict[str, str]]],
    words: list[str],
    rng: random.Random,
    settings: PretrainSettings | None = None,
) -> str:
    """A legend declaring 2-3 tags (one of them may wrap whole lines), then each line followed
    by a declared tag around a name or value that occurs in that line; the marking tags take turns
    in the legend's order, from a random one on (``lines`` pairs a line with the names and values of
    its world; ``words`` are the words a tag may be named after; ``settings`` chooses the page
    options, default none)::

        Put a name between <kel> and </kel>; the notes come between <dor> and </dor>.
        <dor>Doc 1(Title: Grenon Foundry) Grenon Foundry is a foundry based in Zemoor.</dor>
        <kel> Zemoor </kel>

    Pages vary in layout as real pages do: lines are separated by one line break or by a blank line,
    and a wrapped line may keep its own line break before the closing tag.
    """
    style = settings or PretrainSettings()
    count = rng.randint(2, 3)
    page_tags: list[str] = []
    is_word: dict[str, bool] = {}
    while len(page_tags) < count:
        tag, is_word[tag] = tag_name(rng, words)
        if tag not in page_tags:
            page_tags.append(tag)
    if style.two_marking_tags:  # two tags mark, a third (on half the pages) wraps lines
        wrap = page_tags.pop() if len(page_tags) == 3 else None
    else:
        wrap = page_tags.pop() if len(page_tags) == 3 or rng.random() < 0.5 else None
    gap = rng.choice(["\n", "\n\n"])
    inner_break = rng.random() < 0.5
    turn = rng.randrange(len(page_tags))  # the marking tags take turns, from a random one on
    # each line that names something, with its mentions and the values besides the name it is about
    entries = [
        (line, names, found, sorted(set(found) - {found[0]}))
        for line, names in lines
        if (found := mentions_in(line, names))
    ]
    tagged = [page_tags[(turn + i) % len(page_tags)] for i in range(len(entries))]
    tag_kinds: dict[str, str] = {}
    if style.kind_legends > 0:
        for t in page_tags:
            if rng.random() >= style.kind_legends:
                continue
            kinds_per_line = [
                {names[m] for m in others}
                for (_, names, _, others), u in zip(entries, tagged, strict=True)
                if u == t
            ]
            shared = set.intersection(*kinds_per_line) & set(KIND_NOUNS) if kinds_per_line else set()
            if shared:  # a kind every line this tag marks has (besides the name the line is about)
                tag_kinds[t] = rng.choice(sorted(shared))
    out = [_legend(page_tags, wrap, is_word, rng, tag_kinds if style.kind_legends > 0 else None)]
    for (line, names, found, others), tag in zip(entries, tagged, strict=True):
        shown = line
        if rng.random() < 0.3:
            shown = f"{rng.choice(_LINE_LABELS)}: {shown}"
        if wrap is not None and rng.random() < 0.6:
            shown = f"<{wrap}>{shown}{chr(10) if inner_break else ''}</{wrap}>"
        out.append(shown)
        if tag in tag_kinds:
            mention = rng.choice([m for m in others if names[m] == tag_kinds[tag]])
        elif style.mark_subject:
            mention = rng.choice(found)
        else:
            mention = rng.choice(others) if others else found[0]
        phrase = tag not in tag_kinds and style.phrase_marks > 0 and rng.random() < style.phrase_marks
        out.append(f"<{tag}> {mark_text(line, mention, phrase, rng)} </{tag}>")
    return gap.join(out)


# ---------------------------------------------------------------------------------------------
# the corpus
# ---------------------------------------------------------------------------------------------


_ATTRIBUTE_KINDS = {
    "birth_city": "place", "headquarters": "place", "capital": "place", "country": "place",
    "birth_year": "date", "founded_year": "date", "year": "date",
    "founder": "person", "author": "person", "occupation": "occupation", "population": "number",
}  # fmt: skip
_ENTITY_KINDS = {"person": "person", "city": "place", "country": "place"}


def _world_names(world: Any) -> dict[str, str]:
    """The names and values of ``world`` (longest first) -> their kind (``KIND_NOUNS``'s keys, or
    ``other``; a value of two kinds, such as a population that equals a year, keeps the first seen)."""
    kinds: dict[str, str] = {}
    for e in world.entities.values():
        kinds[e.name] = _ENTITY_KINDS.get(e.kind, "other")
        for key, value in e.attrs.items():
            kinds.setdefault(str(value), _ATTRIBUTE_KINDS.get(key, "other"))
    return {v: kinds[v] for v in sorted(kinds, key=lambda v: (-len(v), v))}


@dataclass
class CorpusSources:
    """What the marked-up pages are drawn from, built once (the expensive part: generating worlds)."""

    docs: list[str]
    """Passages, result pages and question lists."""
    lines: list[tuple[str, dict[str, str]]]
    """Lines a marked-up page may quote, each with the names and values of its world."""
    asked: dict[str, str]
    """Question line -> the entity it asks about."""
    rng_state: Any
    """The corpus random stream after the sources: the marked-up pages continue it."""


def corpus_sources(settings: PretrainSettings) -> CorpusSources:
    """The passages, result pages and questions of ``settings.worlds`` pre-training worlds."""
    from searchr1.data.synth import SynthConfig, generate_world

    rng = random.Random(settings.seed)
    docs: list[str] = []
    lines: list[tuple[str, dict[str, str]]] = []
    asked: dict[str, str] = {}
    for i in range(settings.worlds):
        cfg = SynthConfig(
            num_entities=settings.num_entities,
            filler_sentences=settings.filler_sentences,
            seed=PRETRAIN_BASE_SEED + i,
            num_train=400,
            num_val=1,
            num_test=1,
            hop_mix={"single": 1.0},
        )
        world = generate_world(cfg)
        names = _world_names(world)
        rows = []
        for row in world.corpus:
            title, _, text = row["contents"].partition("\n")
            rows.append((title.strip('"'), text))
        docs.extend(
            f"{t}\n{x}" + (f" {rng.choice(_EVERYDAY).format(n=t)}" if rng.random() < 0.3 else "")
            for t, x in rows
        )
        lines.extend((x, names) for _, x in rows)
        if settings.result_pages:
            for k in range(len(rows)):
                page = [rows[k]] + [rows[rng.randrange(len(rows))] for _ in range(rng.randint(0, 2))]
                docs.append(_results_page(page).rstrip("\n"))
                lines.append((_results_page(page[:1]).rstrip("\n"), names))
        if settings.quiz_pages:
            questions = [q["question"] for q in world.splits["train"]]
            for start in range(0, len(questions), 8):
                docs.append("Questions:\n" + "\n".join(questions[start : start + 8]))
            lines.extend((f"Question: {q}", names) for q in questions)
            asked.update(
                {f"Question: {q['question']}": q["metadata"]["hops"][0] for q in world.splits["train"]}
            )
    return CorpusSources(docs, lines, asked, rng.getstate())


def pretraining_corpus(
    settings: PretrainSettings, tag_names: list[str] | None = None, sources: CorpusSources | None = None
) -> list[str]:
    """The documents of the pre-training corpus (see the module docstring), in a seeded order.

    ``tag_names`` are the words the marked-up pages may name a tag after (default: the lowercase
    words of the corpus); ``pretrain`` passes every all-letter token of its tokenizer
    (``tag_vocabulary``), so that any word may follow ``<`` and a tag is known only by copying it.
    ``sources`` (from ``corpus_sources(settings)``) saves generating the worlds again.
    """
    src = sources or corpus_sources(settings)
    rng = random.Random()
    rng.setstate(src.rng_state)
    docs = list(src.docs)
    words = tag_names if tag_names is not None else tag_words([x for x, _ in src.lines])
    for _ in range(settings.markup_pages):
        picks = [rng.choice(src.lines) for _ in range(rng.randint(*settings.markup_lines))]
        # a page with a question has no other line about the entity it asks about (and so never
        # its answer): a question is never followed by its answer
        about = {src.asked[x] for x, _ in picks if x in src.asked}
        picks = [(x, n) for x, n in picks if x in src.asked or not any(e in x for e in about)] or picks[:1]
        docs.append(markup_page(picks, words, rng, settings))
    # no document ends with a line break, so "\n" is never followed by the end-of-text token: a
    # prompt ending in "\n" does not read as a finished document
    docs = [d.rstrip("\n") for d in docs]
    rng.shuffle(docs)
    return docs


def describe_corpus(settings: PretrainSettings) -> str:
    """The exact statement of what the starting model saw (for the README and the run report)."""
    parts = []
    if settings.copy_warmup_steps or settings.copy_rows:
        drawn = "drawn uniformly from the tokens the corpus uses: no word order, no fact"
        if settings.copy_alphabet > 1:
            drawn = (
                f"each from its own 2-{settings.copy_alphabet} tokens of the corpus: no word order, no fact"
            )
        task = (
            f"rows of {2 * COPY_RUN} random tokens ({drawn}) in which a span of 4-{COPY_RUN} tokens recurs "
            "0-3 tokens after itself, only the repeat scored"
            if settings.copy_spans
            else f"random strings of {COPY_RUN} tokens ({drawn}) written twice"
        )
        parts.append(
            f"a copy warm-up: {settings.copy_warmup_steps} steps of {task}, and "
            f"{settings.copy_rows} such rows in every later step with weight {COPY_WEIGHT}"
        )
    parts.append(
        f"the passages of {settings.worlds} small synthetic worlds ({settings.num_entities} entities each) "
        "generated with seeds "
        f"{PRETRAIN_BASE_SEED}..{PRETRAIN_BASE_SEED + settings.worlds - 1} (never a demo world's seed: "
        "other invented people, cities, organisations and works; no fact of the demo world), 30% of them "
        "ending in one everyday sentence that uses the words search, results, information or answer"
    )
    if settings.result_pages:
        parts.append("the same passages as search-result pages ('Doc i(Title: t) text' lines, 1-3 passages)")
    if settings.quiz_pages:
        parts.append("lists of 8 questions about those worlds' entities, never with an answer")
    if settings.markup_pages:
        lines = "passages, result pages and questions" if settings.quiz_pages else "passages and result pages"
        parts.append(
            f"{settings.markup_pages} marked-up pages: a legend line declaring 2-3 tags ('Put a name "
            "between <kel> and </kel>'), named two times in three after a word piece of the tokenizer's "
            f"vocabulary, else an invented word; then {settings.markup_lines[0]}-{settings.markup_lines[1]} lines drawn from those {lines}, each followed "
            "by a declared tag around a name or value that occurs in that line (the marking tags take "
            "turns, from a random one on); one tag may wrap whole lines; lines are separated by a line "
            "break or a blank line; a page with a question has no other line about the asked entity. The "
            "demo's tags (search, information, answer, think) never occur. Training windows start at a "
            "document's start"
        )
        options = []
        if settings.two_marking_tags:
            options.append("every page has two marking tags")
        if settings.kind_legends:
            options.append(
                f"a marking tag is declared, with chance {settings.kind_legends:.0%} where every line it marks "
                "allows, with a kind of value ('a date', 'a place', 'a person', 'an occupation', 'a number') "
                "and then marks values of that kind"
            )
        if not settings.mark_subject:
            options.append("a mark never encloses the name a line is about when the line has another")
        if settings.phrase_marks:
            options.append(
                f"{settings.phrase_marks:.0%} of the other marks enclose a name or value with 1-6 words of its sentence"
            )
        if settings.detach_tag_names:
            parts[-1] += (
                "; where the next token is a tag name the loss does not reach the output projection "
                "(it learns to copy a tag name, not which words are tag names)"
            )
        if options:
            parts.append("in the marked-up pages, " + ", ".join(options))
    if settings.number_tokens:
        parts.append("the tokenizer has one token per four-digit number of the corpus (the years)")
    return (
        "Self-supervised next-token prediction on "
        + "; ".join(parts)
        + ". Never a question followed by its answer, never a search or a search/answer trajectory."
    )


def _token_stream(docs: list[str], tokenizer: Any) -> torch.Tensor:
    import torch

    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for batch_start in range(0, len(docs), 512):
        enc = tokenizer(docs[batch_start : batch_start + 512], add_special_tokens=False)["input_ids"]
        for e in enc:
            ids.extend(e)
            ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def window_starts(stream: torch.Tensor, eos: int, seq_len: int) -> torch.Tensor:
    """Where training windows of ``seq_len + 1`` tokens may start: at a document's first token, so a
    marked-up page is always read from its legend on (a window cut into a page would teach the
    model to write tags that no legend declared)."""
    import torch

    starts = torch.cat([torch.zeros(1, dtype=torch.long), (stream == eos).nonzero().flatten() + 1])
    return starts[starts + seq_len + 1 <= len(stream)]


def _lr_at(step: int, total: int, peak: float) -> float:
    warm = max(1, total // 20)
    if step < warm:
        return peak * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _random_tokens(
    rows: int, length: int, ids: torch.Tensor, gen: torch.Generator, alphabet: int = 0
) -> torch.Tensor:
    """``rows`` x ``length`` tokens drawn uniformly from ``ids``; ``alphabet`` > 1: each row from its
    own 2..``alphabet`` draws of ``ids`` (with replacement: at most that many distinct tokens, which
    repeat within the row)."""
    import torch

    if alphabet > 1:
        sizes = torch.randint(2, alphabet + 1, (rows, 1), generator=gen)
        letters = ids[torch.randint(0, len(ids), (rows, alphabet), generator=gen)]
        return letters.gather(1, (torch.rand(rows, length, generator=gen) * sizes).long())
    return ids[torch.randint(0, len(ids), (rows, length), generator=gen)]


def copy_batch(
    rows: int, run: int, ids: torch.Tensor, eos: int, gen: torch.Generator, alphabet: int = 0
) -> torch.Tensor:
    """``rows`` rows of a random string (``run`` tokens drawn uniformly from ``ids``, the tokens that
    occur in the corpus: no word order and no fact) written twice, then the end-of-text token.
    Every row repeats at the same distance, ``run`` tokens back: a model may learn that offset
    instead of matching tokens (see ``copy_span_batch``). ``alphabet``: see ``_random_tokens``."""
    import torch

    x = _random_tokens(rows, run, ids, gen, alphabet)
    return torch.cat([x, x, torch.full((rows, 1), eos)], dim=1)


def copy_span_batch(
    rows: int, run: int, ids: torch.Tensor, eos: int, gen: torch.Generator, alphabet: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``2 * run`` random tokens (see ``_random_tokens``) in which a span of 4..``run``
    tokens recurs right after itself or 1-3 tokens later, at a random place; then the end-of-text
    token (never scored: it only closes the row as a document). Returns the rows and the targets of
    the next-token loss (one per input position): the repeat's tokens after its first, ``-100``
    (ignored) elsewhere. ``run`` must be at least 6. The distance between the two copies varies from
    row to row, so only finding where the last tokens occurred before and copying what followed them
    (an induction head) predicts the repeat, as copying a name or a year from a passage needs."""
    import torch

    if run < 6:
        raise ValueError(f"copy_span_batch needs run >= 6 (a span of 4 tokens, twice, and a gap), got {run}")
    width = 2 * run
    x = _random_tokens(rows, width, ids, gen, alphabet)
    targets = torch.full((rows, width), -100, dtype=torch.long)
    gaps = torch.randint(0, 4, (rows,), generator=gen).tolist()
    for r, gap in enumerate(gaps):
        length = int(torch.randint(4, (width - gap) // 2 + 1, (1,), generator=gen))
        first = int(torch.randint(0, width - 2 * length - gap + 1, (1,), generator=gen))
        again = first + length + gap
        x[r, again : again + length] = x[r, first : first + length]
        # each repeated token after the first is the target at the position before it
        targets[r, again : again + length - 1] = x[r, again + 1 : again + length]
    return torch.cat([x, torch.full((rows, 1), eos)], dim=1), targets


def _next_token_loss(model: Any, batch: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
    """The next-token loss of ``batch``; ``targets`` (one per input position, ``-100`` ignored, as
    ``copy_span_batch`` returns) replace the batch's own next tokens."""
    import torch

    logits = model(input_ids=batch[:, :-1]).logits
    wanted = batch[:, 1:] if targets is None else targets
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), wanted.reshape(-1))


def _copy_step_loss(
    model: Any, settings: PretrainSettings, rows: int, ids: torch.Tensor, eos: int, gen: torch.Generator
) -> torch.Tensor:
    """The copy loss of one step: ``rows`` rows of the settings' copy task."""
    if settings.copy_spans:
        return _next_token_loss(
            model, *copy_span_batch(rows, COPY_RUN, ids, eos, gen, settings.copy_alphabet)
        )
    return _next_token_loss(model, copy_batch(rows, COPY_RUN, ids, eos, gen, settings.copy_alphabet))


def copy_accuracy(model: Any, ids: torch.Tensor, eos: int, rows: int = 256, seed: int = 0) -> float:
    """How often the model's most likely next token is right on the repeats of ``copy_span_batch``
    rows (a fixed seed): 1.0 copies any span from any distance, ~0 copies nothing."""
    import torch

    tokens, targets = copy_span_batch(rows, COPY_RUN, ids, eos, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        predicted = model(input_ids=tokens[:, :-1]).logits.argmax(-1)
    scored = targets != -100
    return float((predicted[scored] == targets[scored]).float().mean())


def _corpus_loss(model: Any, batch: torch.Tensor, tag_openers: torch.Tensor | None) -> torch.Tensor:
    """The next-token loss; where the input token is one of ``tag_openers`` (``<``, ``</``) the
    target is (the first token of) a tag name, and there the output projection is detached: the
    model learns to copy a tag name from the legend, not which tokens are tag names (a token never
    used as a tag, like the demo's ``answer``, would otherwise be learnt as one that never follows
    ``<``). The value equals the plain next-token loss."""
    import torch
    import torch.nn.functional as F

    if tag_openers is None:
        return _next_token_loss(model, batch)
    inputs, targets = batch[:, :-1], batch[:, 1:]
    hidden = model.model(input_ids=inputs).last_hidden_state
    weight = model.get_output_embeddings().weight
    at_tag = torch.isin(inputs, tag_openers)
    loss_text = F.cross_entropy(F.linear(hidden[~at_tag], weight), targets[~at_tag], reduction="sum")
    loss_tag = F.cross_entropy(F.linear(hidden[at_tag], weight.detach()), targets[at_tag], reduction="sum")
    return (loss_text + loss_tag) / targets.numel()


def pretrain(
    out_dir: str | Path, settings: PretrainSettings, log: Callable[[str], None] | None = None
) -> Path:
    """Build the tokenizer and the model, pre-train, and save both (plus the manifest) in ``out_dir``."""
    import torch

    from searchr1.models import build_tiny_model, train_tokenizer

    out = Path(out_dir)
    t0 = time.perf_counter()
    key, code = settings.key(), code_version()  # the code this run imported, not what is on disk at its end
    sources = corpus_sources(settings)
    tokenizer = train_tokenizer(
        pretraining_corpus(settings, sources=sources),
        vocab_size=settings.vocab_size,
        tag_tokens=False,
        number_tokens=settings.number_tokens,
    )
    docs = pretraining_corpus(settings, tag_names=tag_vocabulary(tokenizer), sources=sources)
    stream = _token_stream(docs, tokenizer)
    model = build_tiny_model(
        tokenizer,
        seed=settings.seed,
        hidden_size=settings.hidden_size,
        intermediate_size=settings.hidden_size * 3,
        num_hidden_layers=settings.num_layers,
        num_attention_heads=settings.num_heads,
        num_key_value_heads=max(1, settings.num_heads // 2),
        max_position_embeddings=2048,
    )
    gen = torch.Generator().manual_seed(settings.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.01, betas=(0.9, 0.98))
    eos = tokenizer.eos_token_id
    doc_starts = window_starts(stream, eos, settings.seq_len)
    losses: list[float] = []  # next-token loss on the corpus
    copy_losses: list[float] = []  # during the copy warm-up
    model.train()
    total = settings.copy_warmup_steps + settings.steps
    vocab_ids = torch.unique(stream[stream != eos])
    tag_openers = None
    if settings.detach_tag_names:
        opener_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<", "</")]
        opener_ids = [i for i in opener_ids if i is not None and i != tokenizer.unk_token_id]
        tag_openers = torch.tensor(opener_ids) if opener_ids else None  # no tags in the vocabulary
    warmup_rows = settings.batch_size * settings.seq_len // (2 * COPY_RUN + 1)  # same tokens as a corpus step
    for step in range(total):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, total, settings.lr)
        if step < settings.copy_warmup_steps:
            loss = _copy_step_loss(model, settings, warmup_rows, vocab_ids, eos, gen)
            copy_losses.append(float(loss.detach()))
            lm_loss = None
        else:
            starts = doc_starts[torch.randint(0, len(doc_starts), (settings.batch_size,), generator=gen)]
            batch = torch.stack([stream[s : s + settings.seq_len + 1] for s in starts.tolist()])
            loss = lm_loss = _corpus_loss(model, batch, tag_openers)
            if settings.copy_rows:
                copy_loss = _copy_step_loss(model, settings, settings.copy_rows, vocab_ids, eos, gen)
                loss = loss + COPY_WEIGHT * copy_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if lm_loss is not None:
            losses.append(float(lm_loss.detach()))
        if log and (step % 100 == 0 or step == total - 1):
            last = f"text loss {losses[-1]:.3f}" if losses else f"copy loss {copy_losses[-1]:.3f}"
            log(f"pretrain step {step}/{total} {last}")
    model.eval()
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    manifest = {
        "settings": asdict(settings),
        "key": key,
        "code_version": code,
        "documents": len(docs),
        "tokens": len(stream),
        "tokens_seen": total * settings.batch_size * settings.seq_len,
        "parameters": sum(p.numel() for p in model.parameters()),
        "loss_first": losses[0],
        "loss_last": sum(losses[-20:]) / len(losses[-20:]),
        "losses_every_10": losses[::10],
        "copy_warmup_loss_last": copy_losses[-1] if copy_losses else None,
        "copy_accuracy": copy_accuracy(model, vocab_ids, eos),
        "seconds": time.perf_counter() - t0,
        "what_it_saw": describe_corpus(settings),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


def prepare_starting_model(
    out_dir: str | Path, settings: PretrainSettings, log: Callable[[str], None] | None = None
) -> Path:
    """The pre-trained folder at ``out_dir``: reused when its manifest has the same settings."""
    out = Path(out_dir)
    manifest = out / MANIFEST
    if manifest.is_file():
        try:
            if json.loads(manifest.read_text()).get("key") == settings.key():
                return out
        except json.JSONDecodeError:
            pass
    return pretrain(out, settings, log=log)
