"""The decision probe (searchr1.evaluation.probe) on the tiny model against a hand computation: full
forward passes, argmax decoding and log-softmax sums written out here, without the probe's helpers; and the
batched probe (the slot decoder) against the one-question-at-a-time reference."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from searchr1.evaluation import probe_decode
from searchr1.evaluation.probe import decision_point, decision_probe, probe_items, probe_question
from searchr1.retrieval.bm25 import BM25Retriever
from searchr1.retrieval.corpus import read_corpus
from searchr1.rollout.config import RolloutConfig
from searchr1.rollout.gold import GoldWriter


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from searchr1.models import load_model

    return load_model(tiny_model_dir).eval()


def test_the_decision_point_is_where_the_turn_opens_its_action(tiny_tokenizer):
    text = "<think> ok </think>\n<search> Alice Verdan </search>"
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    d = decision_point(ids, tiny_tokenizer)
    assert d.tag == "<search>"
    assert tiny_tokenizer.decode(d.ids) + d.lead == "<think> ok </think>\n"
    answer = tiny_tokenizer.encode("<answer> Borvik </answer> <search> x </search>", add_special_tokens=False)
    assert decision_point(answer, tiny_tokenizer).tag == "<answer>"
    none = [
        *tiny_tokenizer.encode("<think> ok </think>", add_special_tokens=False),
        tiny_tokenizer.eos_token_id,
        7,
    ]
    d = decision_point(none, tiny_tokenizer)
    assert d.tag is None and d.ids == none[:-2] and d.lead == ""  # the end of the turn, EOS and after cut


@torch.no_grad()
def _logprob_by_hand(model, ids: list[int], start: int) -> float:
    logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    total = 0.0
    for t in range(start, len(ids)):
        row = logits[t - 1]
        total += float(row[ids[t]] - torch.logsumexp(row, dim=0))
    return total


def _p_search_by_hand(model, tokenizer, context: list[int], max_tokens: int) -> tuple[float, str]:
    """Greedy decoding by hand (a full forward pass per token, argmax of the last position, up to a tag), then
    P(S) / (P(S) + P(A)) at the decision point with log-softmax sums; returns it and the decoded turn."""
    turn: list[int] = []
    with torch.no_grad():
        for _ in range(max_tokens):
            token = int(model(input_ids=torch.tensor([context + turn])).logits[0, -1].argmax())
            turn.append(token)
            if token == tokenizer.eos_token_id or any(t in tokenizer.decode(turn) for t in ("<search>", "<answer>")):
                break
    decision = decision_point(turn, tokenizer)
    at = context + decision.ids
    s = tokenizer.encode(decision.lead + "<search>", add_special_tokens=False)
    a = tokenizer.encode(decision.lead + "<answer>", add_special_tokens=False)
    log_s, log_a = _logprob_by_hand(model, at + s, len(at)), _logprob_by_hand(model, at + a, len(at))
    return math.exp(log_s) / (math.exp(log_s) + math.exp(log_a)), tokenizer.decode(turn)


def test_probe_question_against_a_hand_computation(model, tiny_tokenizer):
    context = tiny_tokenizer.encode(
        "Question: where was Alice Verdan born? <think> I should search. </think> <search> Alice Verdan </search>"
        " <information> Doc 1(Title: Alice Verdan) born in Borvik </information>",
        add_special_tokens=False,
    )
    got = probe_question(model, tiny_tokenizer, context, max_tokens=12)
    p_search, turn = _p_search_by_hand(model, tiny_tokenizer, context, 12)
    assert turn == got["turn"]
    assert got["p_search"] == pytest.approx(p_search, abs=1e-5)
    assert 0.0 < got["p_search"] < 1.0


PRESS = "The Quillon Press was founded by Alice Verdan."
BORN = "Alice Verdan was born in Borvik in 1901."


def test_each_question_is_probed_on_its_side_after_its_own_gold_prefix(model, tiny_tokenizer, tmp_path):
    """Two-hop questions on the search side (p = p_search), one-hop questions whose first passage holds the
    answer on the answer side (p = 1 - p_search), each from exactly prompt + the first gold search turn + its
    observation; a one-hop question whose passage lacks the answer, and a row without a gold path, on none."""
    corpus = tmp_path / "corpus.jsonl"
    docs = [("Quillon Press", PRESS), ("Alice Verdan", BORN)]
    corpus.write_text(
        "".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n" for i, (t, x) in enumerate(docs))
    )
    template = tmp_path / "template.txt"
    template.write_text("Question: {question}\n")
    retriever = BM25Retriever.from_documents(list(read_corpus(corpus)))
    writer = GoldWriter(tiny_tokenizer, RolloutConfig(max_turns=2, max_turn_tokens=8), retriever, topk=1)
    one_hop = {
        "question": "where was Alice Verdan born?",
        "golden_answers": ["Borvik"],
        "metadata": {"supporting_titles": ["Alice Verdan"]},
    }
    two_hop = {
        "question": "where was the founder of the Quillon Press born?",
        "golden_answers": ["Borvik"],
        "metadata": {"supporting_titles": ["Quillon Press", "Alice Verdan"]},
    }
    no_answer = {
        "question": "when was the Quillon Press founded?",
        "golden_answers": ["1890"],
        "metadata": {"supporting_titles": ["Quillon Press"]},
    }  # its passage never says 1890
    no_path = {"question": "where was Alice Verdan born?", "golden_answers": ["Borvik"]}  # fmt: skip
    samples = [no_path, one_hop, no_answer, two_hop]
    items, left_out = probe_items(samples, str(template), tiny_tokenizer, writer)
    contexts = [item.context for item in items]
    assert left_out == 1
    out = decision_probe(model, tiny_tokenizer, samples, str(template), writer)

    def encode(text: str) -> list[int]:
        return tiny_tokenizer.encode(text, add_special_tokens=False)

    def expected_context(question: str, title: str, passage: str) -> list[int]:
        turn = f"<think> I should search {title}. </think>\n<search> {title} </search>"
        observation = f"\n\n<information>Doc 1(Title: {title}) {passage}\n</information>\n\n"
        return encode(f"Question: {question}\n") + encode(turn) + encode(observation)

    expected = [expected_context(one_hop["question"], "Alice Verdan", BORN),
                expected_context(two_hop["question"], "Quillon Press", PRESS)]  # fmt: skip
    assert contexts == expected
    assert [(r["side"], r["question"]) for r in out["rows"]] == [
        ("answer", one_hop["question"]),
        ("search", two_hop["question"]),
    ]
    p_answer_q = 1.0 - _p_search_by_hand(model, tiny_tokenizer, expected[0], 8)[0]
    p_search_q = _p_search_by_hand(model, tiny_tokenizer, expected[1], 8)[0]
    assert [r["p"] for r in out["rows"]] == pytest.approx([p_answer_q, p_search_q], abs=1e-5)
    assert out["answer_side"]["questions"] == 1 and out["answer_side"]["left_out"] == 1
    assert out["search_side"]["questions"] == 1
    assert out["answer_side"]["p"] == pytest.approx(p_answer_q, abs=1e-5)
    assert out["search_side"]["p"] == pytest.approx(p_search_q, abs=1e-5) == out["second_search_p"]
    assert out["decision_accuracy"] == pytest.approx((p_answer_q + p_search_q) / 2, abs=1e-5)
    opened = [r["opened"] for r in out["rows"]]
    assert out["answer_side"]["greedy_share"] == float(opened[0] == "<answer>")
    assert out["search_side"]["greedy_share"] == float(opened[1] == "<search>")
    assert model.training is False


def test_a_side_without_questions_is_none_and_so_is_the_decision_accuracy(model, tiny_tokenizer, tmp_path):
    class NoSearch:
        def search(self, queries, topk):
            return [[] for _ in queries]

    template = tmp_path / "template.txt"
    template.write_text("Question: {question}\n")
    writer = GoldWriter(tiny_tokenizer, RolloutConfig(max_turns=2, max_turn_tokens=4), NoSearch(), topk=1)
    one_hop = {"question": "where was Alice Verdan born?", "golden_answers": ["Borvik"],
               "metadata": {"supporting_titles": ["Alice Verdan"]}}  # fmt: skip
    out = decision_probe(model, tiny_tokenizer, [one_hop], str(template), writer)
    assert out["answer_side"] == {"questions": 0, "p": None, "greedy_share": None, "left_out": 1}
    assert out["search_side"] == {"questions": 0, "p": None, "greedy_share": None}
    assert out["decision_accuracy"] is None and out["second_search_p"] is None and out["rows"] == []


WORLD = [
    ("Quillon Press", PRESS),
    ("Alice Verdan", BORN),
    ("Tarn Mill", "The Tarn Mill was built by Ost Harrow."),
    ("Ost Harrow", "Ost Harrow was born in Kelby."),
    ("Borvik", "Borvik is a city in Tarnland."),
]
INSTRUCTION = (
    "Answer the question. Think inside <think> and </think>, search with <search> query </search>, "
    "answer inside <answer> and </answer>.\nQuestion: {question}\n"
)


def _question(text: str, answer: str, *titles: str) -> dict:
    return {"question": text, "golden_answers": [answer], "metadata": {"supporting_titles": list(titles)}}


QUESTIONS = [  # both sides, questions of different lengths: the contexts after the shared instruction differ
    _question("where was Alice Verdan born?", "Borvik", "Alice Verdan"),
    _question("where was the founder of the Quillon Press born?", "Borvik", "Quillon Press", "Alice Verdan"),
    _question("Ost Harrow?", "Kelby", "Ost Harrow"),
    _question(
        "in which town was the man who built the Tarn Mill born, and where is it?",
        "Kelby",
        "Tarn Mill",
        "Ost Harrow",
    ),
    _question("which country is Borvik in?", "Tarnland", "Borvik"),
    _question(
        "where was the person born who founded the press called Quillon?",
        "Borvik",
        "Quillon Press",
        "Alice Verdan",
    ),
    _question("Kelby is the birthplace of which builder? where was Ost Harrow born?", "Kelby", "Ost Harrow"),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tokenizer whose ``<answer>`` is one token and ``<search>`` several (both candidate kinds), a tiny
    model with its own output head, the world's search and a template with a long shared instruction."""
    from tinymodel import build_tiny_model, train_tokenizer

    folder = tmp_path_factory.mktemp("probe-world")
    corpus = folder / "corpus.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n" for i, (t, x) in enumerate(WORLD)
        )
    )
    template = folder / "template.txt"
    template.write_text(INSTRUCTION)
    texts = [x for _, x in WORLD] + [INSTRUCTION, "<think> I should search. </think> <search> Ost Harrow </search>"]
    tokenizer = train_tokenizer(texts * 20, vocab_size=512, tag_tokens=False)
    tokenizer.add_tokens(["<answer>"])
    model = build_tiny_model(tokenizer, seed=0, tie_word_embeddings=False).eval()
    retriever = BM25Retriever.from_documents(list(read_corpus(corpus)))
    writer = GoldWriter(tokenizer, RolloutConfig(max_turns=2, max_turn_tokens=12), retriever, topk=1)
    return model, tokenizer, writer, str(template)


def _steer(model, tokenizer, contexts: list[list[int]], max_tokens: int) -> None:
    """Make the random model open ``<answer>`` in some greedy turns and end others early, and leave some as
    they were: two tokens X and Y of its greedy turns get twins whose output rows are 1.001 theirs (a twin wins
    where its token won), ``<answer>`` for X and the end-of-sequence token for Y, chosen so that a turn emits
    X after its first token and before Y, another Y before X, and a third, cut at the limit, neither."""
    turns = [d.turn for d in probe_decode.decide(model, tokenizer, contexts, max_tokens, batch_size=1)]

    def at(turn: list[int], token: int) -> int:
        return turn.index(token) if token in turn else len(turn)

    tokens = sorted({token for turn in turns for token in turn})
    for x, y in itertools.permutations(tokens, 2):
        opens = any(0 < at(t, x) < min(at(t, y), len(t) - 1) for t in turns)
        ends = any(0 < at(t, y) < at(t, x) for t in turns)
        untouched = any(x not in t and y not in t and len(t) == max_tokens for t in turns)
        if opens and ends and untouched:
            break
    else:
        raise AssertionError("no two tokens of the greedy turns to steer by")
    head = model.get_output_embeddings().weight
    with torch.no_grad():
        head[tokenizer.convert_tokens_to_ids("<answer>")] = 1.001 * head[x]
        head[tokenizer.eos_token_id] = 1.001 * head[y]


def test_the_batched_probe_equals_one_question_at_a_time(world, monkeypatch, one_thread):
    """Batched on the slot decoder (all questions at once, and three at a time: waves that reuse the slots)
    the probe finds the same greedy turns, the same decision points and the same log P(<search>),
    log P(<answer>) as the reference that probes one question at a time on the Hugging Face modules; the
    turns cover a tag opened mid-turn, a turn ended by the end-of-sequence token and one cut at the limit."""
    model, tokenizer, writer, template = world
    max_tokens = int(writer.config.max_turn_tokens)
    items, _ = probe_items(QUESTIONS, template, tokenizer, writer)
    contexts = [item.context for item in items]
    assert {item.side for item in items} == {"search", "answer"} and len(items) == len(QUESTIONS)
    assert len({len(c) for c in contexts}) == len(contexts)  # every context its own length
    assert probe_decode.common_prefix(contexts) >= 16  # the instruction: stored once by the slot decoder
    _steer(model, tokenizer, contexts, max_tokens)
    reference = probe_decode.decide(model, tokenizer, contexts, max_tokens, batch_size=1)
    opened = [d for d in reference if d.decision.tag == "<answer>"]
    assert opened and all(len(d.decision.ids) > 0 for d in opened)  # opened mid-turn
    assert all(len(d.turn) == len(d.decision.ids) + 1 for d in opened)  # and the turn stops at the tag's token
    assert any(d.decision.tag is None and len(d.turn) < max_tokens for d in reference)  # ended by EOS
    assert any(d.decision.tag is None and len(d.turn) == max_tokens for d in reference)  # cut at the limit
    assert all(len(c) > 1 for d in reference for c in probe_decode.candidates(d.decision, tokenizer)[:1])

    def unused(*args, **kwargs):
        raise AssertionError("the batched path must not probe one question at a time")

    monkeypatch.setattr(probe_decode, "decide_one", unused)
    for batch_size in (64, 3):
        batched = probe_decode.decide(model, tokenizer, contexts, max_tokens, batch_size=batch_size)
        assert [d.turn for d in batched] == [d.turn for d in reference]
        assert [d.decision for d in batched] == [d.decision for d in reference]
        for got, want in zip(batched, reference, strict=True):
            assert got.log_search == pytest.approx(want.log_search, abs=1e-4)
            assert got.log_answer == pytest.approx(want.log_answer, abs=1e-4)
            assert got.p_search == pytest.approx(want.p_search, rel=1e-4, abs=1e-9)
    monkeypatch.undo()
    one = decision_probe(model, tokenizer, QUESTIONS, template, writer, batch_size=1)
    model.train()  # the probe decodes in eval mode and gives the model back as it found it
    many = decision_probe(model, tokenizer, QUESTIONS, template, writer)
    assert model.training is True
    model.eval()
    assert [{k: v for k, v in r.items() if k not in ("p", "p_search")} for r in many["rows"]] == [
        {k: v for k, v in r.items() if k not in ("p", "p_search")} for r in one["rows"]
    ]
    for key in ("p", "p_search"):
        assert [r[key] for r in many["rows"]] == pytest.approx([r[key] for r in one["rows"]], abs=1e-6)
    assert many["decision_accuracy"] == pytest.approx(one["decision_accuracy"], abs=1e-6)
