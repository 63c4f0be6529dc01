"""The demo's budgets fit two searches and an answer at their limits, and the last search's observation tells
the model that the next turn may only answer (``rollout.last_search_notice``), in the rollout and in the gold
trajectories alike."""

from __future__ import annotations

import pytest

from searchr1.config import load_config, shipped_config
from searchr1.data.prompts import LAST_SEARCH_NOTICE
from searchr1.retrieval.base import Hit
from searchr1.rollout.actions import StopDetector
from searchr1.rollout.episode import Episode, EpisodeContext
from searchr1.rollout.gold import GoldPath, GoldWriter
from searchr1.rollout.types import Role


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from searchr1.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def demo_rollout(**overrides):
    cfg = load_config(shipped_config("demo_learning"), [f"rollout.{k}={v}" for k, v in overrides.items()])
    return cfg.rollout


def turn_of(tokenizer, length: int, action: str, content: str) -> list[int]:
    """A turn of exactly ``length`` tokens: <think>, filler, </think>, then the action's tags."""
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    tail = enc(f"</think>\n<{action}> {content} </{action}>")
    head = enc("<think>")
    filler = enc(" a")[-1:]
    return head + filler * (length - len(head) - len(tail)) + tail


def long_hit(title: str) -> Hit:
    return Hit(id=title, title=title, text=" ".join(["word"] * 400), score=1.0)


def play(tokenizer, cfg, turns: list[list[int]]) -> Episode:
    """Feed the scripted turns to one episode; each search gets a passage longer than max_obs_tokens."""
    eos = {tokenizer.eos_token_id}
    ctx = EpisodeContext(
        tokenizer, cfg, StopDetector(tokenizer, eos), cfg.max_turn_tokens, max_context=100_000
    )
    ep = Episode.start(0, [1, 2, 3], {}, ctx)
    for turn in turns:
        for token in turn:
            if ep.add_token(token, 0.0):
                break
        end = ep.end_turn()
        if end.kind == "done":
            break
        if end.kind == "search" and not ep.receive([long_hit(end.query)]):
            break
    return ep


def test_two_searches_and_an_answer_at_their_limits_fit_the_demo_budget(tokenizer):
    cfg = demo_rollout()
    n = cfg.max_turn_tokens
    turns = [turn_of(tokenizer, n, "search", "Quillon Press"), turn_of(tokenizer, n, "search", "Alice Verdan"),
             turn_of(tokenizer, n, "answer", "Borvik")]  # fmt: skip
    assert all(len(t) == n for t in turns)
    ep = play(tokenizer, cfg, turns)
    traj = ep.traj
    assert traj.finish_reason == "answer" and not traj.truncated
    assert traj.searches == 2 and traj.obs_truncations == 2  # both passages filled max_obs_tokens
    notice = tokenizer.encode(LAST_SEARCH_NOTICE, add_special_tokens=False)
    obs_runs, run = [], []
    for token, role in zip(traj.response_ids, traj.roles, strict=True):
        if role == Role.OBSERVATION:
            run.append(token)
        elif run:
            obs_runs.append(run)
            run = []
    assert len(obs_runs) == 2
    assert obs_runs[0][-len(notice) :] != notice  # a search is still allowed after the first passage
    assert obs_runs[1][-len(notice) :] == notice  # the second passage says the next turn answers
    # control: the former budget (320 tokens, no notice) cuts the same trajectory before its answer
    old = play(tokenizer, demo_rollout(max_response_tokens=320, last_search_notice=False), turns)
    assert old.traj.truncated and old.traj.finish_reason == "truncated"


def test_the_gold_trajectory_carries_the_notice_where_the_rollout_does(tokenizer):
    class Passages:
        def search(self, queries, topk):
            return [[Hit(id=q, title=q, text=f"{q} was born in Borvik.", score=1.0)] for q in queries]

    cfg = demo_rollout()
    writer = GoldWriter(tokenizer, cfg, Passages(), topk=1)
    gold = writer.trajectory([1], GoldPath(("Quillon Press", "Alice Verdan"), "Borvik"), {}).trajectory
    notice = tokenizer.encode(LAST_SEARCH_NOTICE, add_special_tokens=False)
    first_obs_end = gold.search_spans[1][0]
    assert gold.response_ids[first_obs_end - len(notice) : first_obs_end] != notice
    answer_start = max(i for i, r in enumerate(gold.roles) if r == Role.OBSERVATION) + 1
    assert gold.response_ids[answer_start - len(notice) : answer_start] == notice
    assert gold.finish_reason == "answer" and gold.searches == 2
    off = GoldWriter(tokenizer, demo_rollout(last_search_notice=False), Passages(), topk=1)
    plain = off.trajectory([1], GoldPath(("Quillon Press", "Alice Verdan"), "Borvik"), {}).trajectory
    assert len(plain.response_ids) == len(gold.response_ids) - len(notice)
