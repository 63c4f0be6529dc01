"""How a starting model behaves on the learning demo's own rollouts, before any RL.

RL with an outcome reward can only reinforce what the policy already does now and then: the
demo learns only if some sampled rollouts search, read a passage holding the answer, and answer
from it. ``probe_policy`` samples the demo's rollouts (its RL config: temperature 1, ``rollout.n``
samples per question) on training questions of one world and counts, as shares of all rollouts:

- ``first_search`` / ``first_answer``: the first turn begins with ``<search>`` / ``<answer>``;
- ``searched``: at least one search ran;
- ``retrieved_answer``: a search returned a passage that contains a gold answer;
- ``answered_after_search``: an ``<answer>`` (closed or not) follows a search's ``<information>`` block;
- ``rewarded``: reward > 0; ``mean_reward``; ``groups_with_signal``: the share of questions whose
  group has a rewarded rollout (GRPO's advantage is zero in the others).

Three more measures take the search out of the picture: ``tag_choices`` (the probabilities of the
tag names after ``<`` where the policy chooses: after the prompt, and after a search that returned the
asked entity's passage), ``answers_given_passage`` (per kind of question, how sampled answers
given that passage score, and what they are: ``classify_answer``) and ``gold_given_passage`` (the
gold answer read teacher-forced there: how likely the policy is to start it, and how well it copies
the rest once started).

    searchr1 demo --probe 32        # the demo's starting model, 32 questions x rollout.n
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ProbeResult:
    """Shares of all sampled rollouts (see the module docstring)."""

    rollouts: int
    first_search: float
    first_answer: float
    searched: float
    retrieved_answer: float
    answered_after_search: float
    rewarded: float
    mean_reward: float
    groups_with_signal: float

    def as_dict(self) -> dict[str, int | float]:
        return asdict(self)


def _first_action(text: str) -> str:
    """``search`` | ``answer`` | ``other``: what the first turn of a response begins with."""
    head = text.lstrip()
    for action in ("search", "answer"):
        if head.startswith(f"<{action}>"):
            return action
    return "other"


def summarise(trajectories: Sequence[Any], rewards: Sequence[float], groups: Sequence[int]) -> ProbeResult:
    """Count the behaviours of ``trajectories`` (with their ``response_text``, ``searches``,
    ``documents`` and ``meta['golden_answers']``), their ``rewards`` and group ids."""
    n = len(trajectories)
    if n == 0 or len(rewards) != n or len(groups) != n:
        raise ValueError(
            f"need as many rewards and groups as trajectories (got {n}, {len(rewards)}, {len(groups)})"
        )
    first = [_first_action(t.response_text) for t in trajectories]
    retrieved = answered = 0
    for t in trajectories:
        if not t.searches:
            continue
        gold = [str(g) for g in t.meta.get("golden_answers", [])]
        passages = " ".join(
            f"{hit.get('title', '')} {hit.get('text', '')}" for hits in t.documents for hit in hits
        )
        retrieved += any(g and g in passages for g in gold)
        _, block, after = t.response_text.partition("</information>")
        answered += bool(block) and "<answer>" in after
    signal = {g for g, r in zip(groups, rewards, strict=True) if r > 0}
    return ProbeResult(
        rollouts=n,
        first_search=first.count("search") / n,
        first_answer=first.count("answer") / n,
        searched=sum(1 for t in trajectories if t.searches) / n,
        retrieved_answer=retrieved / n,
        answered_after_search=answered / n,
        rewarded=sum(1 for r in rewards if r > 0) / n,
        mean_reward=sum(rewards) / n,
        groups_with_signal=len(signal) / len(set(groups)),
    )


def probe_policy(
    model_dir: str | Path, settings: Any = None, seed: int = 0, questions: int = 32
) -> ProbeResult:
    """Sample the demo's rollouts of the model in ``model_dir`` on ``questions`` training questions
    of world ``seed`` (``settings``: a ``DemoSettings``, default the demo's) and summarise them."""
    from searchr1.learning_demo import (
        DemoSettings,
        _read_jsonl,
        build_bm25,
        build_world,
        check_settings,
        demo_trainer,
    )
    from searchr1.trainer import adapters

    settings = settings or DemoSettings()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        prompt_path = check_settings(folder, settings)
        _, files = build_world(seed, settings, folder / "world")
        train = _read_jsonl(files["train"])
        if not 0 < questions <= len(train):
            raise ValueError(f"questions must be between 1 and {len(train)}, got {questions}")
        retriever = build_bm25(files["corpus"])
        trainer = demo_trainer(
            settings, seed, Path(model_dir), retriever, train, train[:1], folder / "run", prompt_path
        )
        trajectories, groups, _ = trainer.rollout(list(range(questions)), 0)
        decode = trainer.tokenizer.decode
        rewards = [r.total for r in adapters.score(trainer.reward_fn, trajectories, decode)]
    return summarise(trajectories, rewards, groups)


def format_probe(result: ProbeResult) -> str:
    rows = [
        ("first turn begins <search>", result.first_search),
        ("first turn begins <answer>", result.first_answer),
        ("a search ran", result.searched),
        ("a search returned a passage holding the answer", result.retrieved_answer),
        ("an <answer> follows a search", result.answered_after_search),
        ("reward > 0", result.rewarded),
        ("questions whose group has a rewarded rollout", result.groups_with_signal),
    ]
    lines = [f"{result.rollouts} sampled rollouts (temperature 1) of the starting model, before RL:"]
    lines += [f"  {name:48s} {share:6.1%}" for name, share in rows]
    lines.append(f"  {'mean reward':48s} {result.mean_reward:6.3f}")
    return "\n".join(lines)


@dataclass
class AnswerShare:
    """How often sampled answers to one kind of question are right when the right passage is shown."""

    relation: str
    questions: int
    mean_f1: float
    exact: float
    picked: dict[str, float] = field(default_factory=dict)
    """Shares of the sampled answers (``ANSWER_KINDS``): the asked value, a partial match of it, the
    name the question is about, another value of the passage, a value the passage does not hold, or
    no closed answer."""


ANSWER_KINDS = ("asked", "partial", "subject", "other_value", "invented", "no_answer")
"""What a sampled answer is, given the passage it was shown (``classify_answer``)."""


def classify_answer(answer: str | None, gold: Sequence[str], subject: str, values: Sequence[str]) -> str:
    """One of ``ANSWER_KINDS``: ``asked`` when ``answer`` matches a gold answer; ``subject`` when it is
    the name the question is about; ``other_value`` when it is another of the passage's ``values``;
    ``partial`` when it is none of these but shares a word with a gold answer (F1 > 0: the gold
    surname after a wrong first name, the value inside a phrase); ``invented`` for any other closed
    answer (a name or number the passage does not hold, a misspelt copy); ``no_answer`` when the turn
    did not close with ``</answer>``. Compared after SQuAD normalisation."""
    from searchr1.rewards.text import exact_match, f1_score, normalize_answer

    if answer is None:
        return "no_answer"
    if exact_match(answer, gold):
        return "asked"
    said = normalize_answer(answer)
    if said == normalize_answer(subject):
        return "subject"
    if any(said == normalize_answer(v) for v in values):
        return "other_value"
    return "partial" if f1_score(answer, gold) > 0 else "invented"


def _asked_with_passages(
    seed: int, questions: int, world: dict[str, Any] | None
) -> tuple[list[dict[str, Any]], dict[str, str], dict[str, list[str]]]:
    """The first ``questions`` single-hop training questions of world ``seed`` (``world``: its
    ``SynthConfig`` knobs, default the demo's), each entity's first passage (it holds the entity's
    attributes) and the values of its attributes that the passage states."""
    from searchr1.data.synth import SynthConfig, generate_world
    from searchr1.learning_demo import DemoSettings
    from searchr1.retrieval.corpus import split_contents

    generated = generate_world(SynthConfig(seed=seed, **(DemoSettings().world if world is None else world)))
    passage: dict[str, str] = {}
    for row in generated.corpus:
        title, text = split_contents(row["contents"])
        passage.setdefault(title, text)
    asked = [q for q in generated.splits["train"] if q["metadata"]["type"] == "single"][:questions]
    if not asked:
        raise ValueError("no single-hop training questions to ask")
    values = {
        name: [str(v) for v in entity.attrs.values() if isinstance(v, str | int) and str(v) in passage[name]]
        for name, entity in generated.entities.items()
        if name in passage
    }
    return asked, passage, values


def passage_context(template: str, question: str, entity: str, passage: str, then: str = "<answer>") -> str:
    """The demo's context after a first turn that was exactly ``<search> entity </search>`` and
    returned ``passage`` (titled ``entity``), ending with ``then`` put in the model's mouth (the
    ``<answer>`` tag by default; ``<`` to leave the tag's name to the model): the prompt, the search,
    the information block, ``then``."""
    from searchr1.data.prompts import fill_template, format_observation_docs, wrap_information
    from searchr1.retrieval.base import Hit

    docs = format_observation_docs([Hit(id=entity, title=entity, text=passage, score=0.0)])
    return f"{fill_template(template, question)}<search> {entity} </search>{wrap_information(docs)}{then}"


def answer_of(continuation: str) -> str | None:
    """The answer the demo's rollout and reward read from a turn that begins with ``<answer>`` and
    continues with ``continuation``: the turn ends at its first closing tag; ``None`` (no reward)
    when that is not ``</answer>`` or there is none."""
    from searchr1.rollout.actions import parse_action

    action = parse_action("<answer>" + continuation)
    return action.content if action.kind == "answer" else None


def answers_given_passage(
    model_dir: str | Path,
    seed: int = 0,
    questions: int = 200,
    samples: int = 8,
    max_turn_tokens: int = 20,
    world: dict[str, Any] | None = None,
) -> list[AnswerShare]:
    """Exploration per kind of question: for ``questions`` single-hop training questions of world
    ``seed``, show the model the passage of the asked entity as if its search had returned it, put
    ``<answer>`` in its mouth, sample ``samples`` continuations (temperature 1) of the rest of the
    turn (``max_turn_tokens`` less the tag's tokens, as in the demo) and score the answers against
    the gold answer (F1 and exact match; see ``answer_of``), averaged per relation (``birth_year``,
    ``occupation``, ...). RL can only learn a kind of question whose answers are sometimes right
    here. ``world``: the demo's ``SynthConfig`` knobs (default the demo's)."""
    import torch

    from searchr1.models import load_model, load_tokenizer
    from searchr1.pretrain import DEMO_INSTRUCTION
    from searchr1.rewards.text import f1_score

    model, tokenizer = load_model(model_dir), load_tokenizer(model_dir)
    model.eval()
    asked, passage, values = _asked_with_passages(seed, questions, world)
    budget = max_turn_tokens - len(tokenizer("<answer>", add_special_tokens=False).input_ids)
    scores: dict[str, list[tuple[float, str]]] = {}  # relation -> (F1, ANSWER_KINDS) per answer
    torch.manual_seed(seed)
    for q in asked:
        entity = q["metadata"]["hops"][0]
        context = passage_context(DEMO_INSTRUCTION, q["question"], entity, passage[entity])
        ids = tokenizer(context, return_tensors="pt").input_ids.repeat(samples, 1)
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=budget,
                pad_token_id=tokenizer.eos_token_id,
            )
        for row in out[:, ids.shape[1] :]:
            answer = answer_of(tokenizer.decode(row, skip_special_tokens=True))
            gold = q["golden_answers"]
            scores.setdefault(q["metadata"]["relation"], []).append(
                (f1_score(answer, gold), classify_answer(answer, gold, entity, values[entity]))
            )
    shares = []
    for rel, v in sorted(scores.items()):
        picked = {k: sum(1 for _, c in v if c == k) / len(v) for k in ANSWER_KINDS}
        # an exact match is the "asked" kind
        shares.append(
            AnswerShare(rel, len(v) // samples, sum(f for f, _ in v) / len(v), picked["asked"], picked)
        )
    return shares


def format_answer_shares(rows: Sequence[AnswerShare], samples: int) -> str:
    """The per-kind table that ``searchr1 demo --probe`` prints."""
    lines = [
        f"answers sampled ({samples} per question) when the asked entity's passage is shown "
        f"(shares: {' / '.join(ANSWER_KINDS)}):"
    ]
    lines += [
        f"  {r.relation:16s} {r.questions:4d} questions  F1 {r.mean_f1:.3f}  exact {r.exact:6.1%}  "
        + " / ".join(f"{r.picked.get(k, 0.0):.2f}" for k in ANSWER_KINDS)
        for r in rows
    ]
    return "\n".join(lines)


@dataclass
class GoldReading:
    """The gold answer read teacher-forced after ``<answer>`` (the asked entity's passage shown), for
    one kind of question: choosing the value apart from copying it."""

    relation: str
    questions: int
    first_piece: float
    """Mean probability of the gold answer's first word piece: how often the policy starts the value
    that is asked (the choice RL has to learn). A year's first piece is a digit that nearly every year
    shares, so for years it says only how often the policy starts a year; which year is then decided
    by the later digits."""
    later_accuracy: dict[str, float] = field(default_factory=dict)
    """Share of the gold answer's later pieces (each given the pieces before it) that are the model's
    most likely next token, per ``PIECE_KINDS``: how well it copies a value it has started."""
    later_pieces: dict[str, int] = field(default_factory=dict)
    """How many later pieces of each kind were read."""


PIECE_KINDS = ("word", "digit")
"""Kinds of a gold answer's later pieces: a word piece, or digits (a year is several digit tokens)."""


def gold_given_passage(
    model_dir: str | Path, seed: int = 0, questions: int = 200, world: dict[str, Any] | None = None
) -> list[GoldReading]:
    """Per kind of question, over the first ``questions`` single-hop training questions of world
    ``seed`` (``world``: the demo's ``SynthConfig`` knobs by default): the context of
    ``passage_context`` (prompt, ``<search> entity </search>``, the entity's passage, ``<answer>``)
    followed by a space and the first gold answer, in one forward pass. Whitespace pieces are
    skipped; the first other piece is the choice (``first_piece``), the rest are copies
    (``later_accuracy``)."""
    import torch

    from searchr1.models import load_model, load_tokenizer
    from searchr1.pretrain import DEMO_INSTRUCTION

    model, tokenizer = load_model(model_dir), load_tokenizer(model_dir)
    model.eval()
    asked, passage, _ = _asked_with_passages(seed, questions, world)
    first: dict[str, list[float]] = {}
    later: dict[str, dict[str, list[bool]]] = {}
    for q in asked:
        entity = q["metadata"]["hops"][0]
        context = passage_context(DEMO_INSTRUCTION, q["question"], entity, passage[entity])
        head = tokenizer(context, add_special_tokens=False).input_ids
        ids = tokenizer(f"{context} {q['golden_answers'][0]}", add_special_tokens=False).input_ids
        if ids[: len(head)] != head:
            raise ValueError("the tokenizer merges the end of '<answer>' with the answer after it")
        with torch.no_grad():
            probs = model(input_ids=torch.tensor([ids])).logits[0].float().softmax(-1)
        relation = q["metadata"]["relation"]
        texts = {i: tokenizer.decode(ids[i : i + 1]).strip() for i in range(len(head), len(ids))}
        pieces = [i for i, text in texts.items() if text]  # whitespace pieces skipped
        if not pieces:
            continue
        first.setdefault(relation, []).append(float(probs[pieces[0] - 1, ids[pieces[0]]]))
        kinds = later.setdefault(relation, {k: [] for k in PIECE_KINDS})
        for i in pieces[1:]:
            kinds["digit" if texts[i].isdigit() else "word"].append(int(probs[i - 1].argmax()) == ids[i])
    return [
        GoldReading(
            relation,
            len(first[relation]),
            sum(first[relation]) / len(first[relation]),
            {k: sum(v) / len(v) for k, v in later[relation].items() if v},
            {k: len(v) for k, v in later[relation].items()},
        )
        for relation in sorted(first)
    ]


def format_gold_readings(rows: Sequence[GoldReading]) -> str:
    """The per-kind table of ``gold_given_passage`` that ``searchr1 demo --probe`` prints."""
    lines = [
        "the gold answer read after '<answer>' (passage shown): P(its first piece), and how many of its later pieces are the most likely token:"
    ]
    for r in rows:
        copies = "  ".join(
            f"{k} {r.later_accuracy[k]:.2f} of {r.later_pieces[k]}"
            for k in PIECE_KINDS
            if r.later_pieces.get(k)
        )
        lines.append(
            f"  {r.relation:16s} {r.questions:4d} questions  first piece {r.first_piece:.3f}  {copies or '(one piece)'}"
        )
    return "\n".join(lines)


DECISION_TAGS = ("answer", "search", "information")
"""The demo's declared tags, whose names ``tag_choices`` reads the probabilities of."""


@dataclass
class TagChoices:
    """Mean probability of each of the demo's tag names right after a ``<`` at the two places where
    the policy chooses: a ``<`` straight after the prompt, and the ``<`` after a search that returned
    the asked entity's passage (there ``answer`` is the move that can earn reward)."""

    questions: int
    first: dict[str, float]
    after_passage: dict[str, float]


def tag_choices(
    model_dir: str | Path, seed: int = 0, questions: int = 40, world: dict[str, Any] | None = None
) -> TagChoices:
    """``TagChoices`` of the model in ``model_dir`` over the first ``questions`` single-hop training
    questions of world ``seed``: the demo's prompt, then ``<`` straight after it (a rollout may also
    put a space or a line break first); and the prompt, exactly ``<search> entity </search>``, its
    passage, ``<``. The probability of a name is that of all its tokens in turn (teacher-forced).
    Needs a tokenizer that splits ``<`` from the name after it and from ``>``, as the demo's does
    (one whose tags are tokens of their own writes them otherwise)."""
    import torch

    from searchr1.data.prompts import fill_template
    from searchr1.models import load_model, load_tokenizer
    from searchr1.pretrain import DEMO_INSTRUCTION

    model, tokenizer = load_model(model_dir), load_tokenizer(model_dir)
    model.eval()
    asked, passage, _ = _asked_with_passages(seed, questions, world)
    totals = {"first": dict.fromkeys(DECISION_TAGS, 0.0), "after_passage": dict.fromkeys(DECISION_TAGS, 0.0)}
    for q in asked:
        entity = q["metadata"]["hops"][0]
        contexts = {
            "first": fill_template(DEMO_INSTRUCTION, q["question"]) + "<",
            "after_passage": passage_context(DEMO_INSTRUCTION, q["question"], entity, passage[entity], "<"),
        }
        for place, context in contexts.items():
            head = tokenizer(context, add_special_tokens=False).input_ids
            for tag in DECISION_TAGS:
                ids = tokenizer(context + tag, add_special_tokens=False).input_ids
                closed = tokenizer(context + tag + ">", add_special_tokens=False).input_ids
                if (
                    ids[: len(head)] != head
                    or closed[: len(ids)] != ids
                    or tokenizer.decode(head[-1:]) != "<"
                ):
                    raise ValueError(f"the tokenizer does not split '<' from the tag name {tag!r}")
                with torch.no_grad():
                    logp = model(input_ids=torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
                name = torch.tensor(ids[len(head) :])
                steps = torch.arange(len(head) - 1, len(ids) - 1)
                totals[place][tag] += float(logp[steps, name].sum().exp()) / len(asked)
    return TagChoices(len(asked), totals["first"], totals["after_passage"])


def format_tag_choices(result: TagChoices) -> str:
    lines = [f"P(tag name) after '<', mean over {result.questions} questions:"]
    for place, label in (("first", "first '<' after the prompt"), ("after_passage", "after the passage")):
        shares = getattr(result, place)
        lines.append(f"  {label:28s} " + "  ".join(f"{t} {shares[t]:.2f}" for t in DECISION_TAGS))
    return "\n".join(lines)
