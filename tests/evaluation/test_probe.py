"""The second-search probe (searchr1.evaluation.probe) on the tiny model against a hand computation: full
forward passes, argmax decoding and log-softmax sums written out here, without the probe's helpers."""

from __future__ import annotations

import math

import pytest
import torch

from searchr1.evaluation.probe import decision_point, probe_question, second_search_probe
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


def test_probe_question_against_a_hand_computation(model, tiny_tokenizer):
    context = tiny_tokenizer.encode(
        "Question: where was Alice Verdan born? <think> I should search. </think> <search> Alice Verdan </search>"
        " <information> Doc 1(Title: Alice Verdan) born in Borvik </information>",
        add_special_tokens=False,
    )
    got = probe_question(model, tiny_tokenizer, context, max_tokens=12)
    # greedy by hand: a full forward pass per token, argmax of the last position
    turn: list[int] = []
    with torch.no_grad():
        for _ in range(12):
            token = int(model(input_ids=torch.tensor([context + turn])).logits[0, -1].argmax())
            turn.append(token)
            if token == tiny_tokenizer.eos_token_id:
                break
    assert tiny_tokenizer.decode(turn) == got["turn"]
    decision = decision_point(turn, tiny_tokenizer)
    at = context + decision.ids
    s = tiny_tokenizer.encode(decision.lead + "<search>", add_special_tokens=False)
    a = tiny_tokenizer.encode(decision.lead + "<answer>", add_special_tokens=False)
    log_s, log_a = _logprob_by_hand(model, at + s, len(at)), _logprob_by_hand(model, at + a, len(at))
    assert got["p_search"] == pytest.approx(math.exp(log_s) / (math.exp(log_s) + math.exp(log_a)), abs=1e-5)
    assert 0.0 < got["p_search"] < 1.0


def test_the_probe_covers_the_two_hop_questions_only(model, tiny_tokenizer, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        '{"id": "0", "contents": "\\"Quillon Press\\"\\nThe Quillon Press was founded by Alice Verdan."}\n'
        '{"id": "1", "contents": "\\"Alice Verdan\\"\\nAlice Verdan was born in Borvik in 1901."}\n'
    )
    template = tmp_path / "template.txt"
    template.write_text("Question: {question}\n")
    retriever = BM25Retriever.from_documents(list(read_corpus(corpus)))
    writer = GoldWriter(tiny_tokenizer, RolloutConfig(max_turns=2, max_turn_tokens=8), retriever, topk=1)
    two_hop = {"question": "where was the founder of the Quillon Press born", "golden_answers": ["Borvik"],
               "metadata": {"supporting_titles": ["Quillon Press", "Alice Verdan"]}}  # fmt: skip
    one_hop = {"question": "where was Alice Verdan born", "golden_answers": ["Borvik"],
               "metadata": {"supporting_titles": ["Alice Verdan"]}}  # fmt: skip
    out = second_search_probe(
        model, tiny_tokenizer, [one_hop, two_hop, one_hop], str(template), writer
    )
    assert out["questions"] == 1 and out["rows"][0]["second_query"] == "Alice Verdan"
    assert out["second_search_p"] == pytest.approx(out["rows"][0]["p_search"])
    assert model.training is False
