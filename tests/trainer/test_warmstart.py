"""The warm start (searchr1.trainer.warmstart): supervised LoRA on gold trajectories before RL. Its loss is on
generated tokens only, a killed stage resumes bit-identically, rows without a gold path are named and
skipped, data without any is refused in one line, and `searchr1 train` starts RL from its policy."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import rlworld
import torch

from searchr1.config import load_config
from searchr1.retrieval.bm25 import BM25Retriever
from searchr1.retrieval.corpus import read_corpus
from searchr1.rollout.gold import GoldWriter, gold_path
from searchr1.rollout.types import Role
from searchr1.trainer.experience import build_experience
from searchr1.trainer.policy import PolicyLogprobs
from searchr1.trainer.warmstart import (
    STATE_FILE,
    WarmStart,
    WarmStartError,
    gold_examples,
    sft_loss,
    step_order,
)

SINGLE = {
    "id": "s1",
    "question": "where was Mira Lund born",
    "golden_answers": ["Kessa"],
    "metadata": {"type": "single", "data_source": "synth", "supporting_titles": ["Mira Lund"]},
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    files = rlworld.write_world(tmp_path_factory.mktemp("world"))
    rows = [json.loads(line) for line in files["train"].read_text().splitlines()]
    # rows 1 and 4 (1-based) have gold paths; the others name none
    files["train"].write_text(
        "".join(json.dumps(r) + "\n" for r in [rlworld.BRIDGE, *rows[:2], SINGLE, *rows[2:6]])
    )
    return files


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from searchr1.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def bm25(world):
    return BM25Retriever.from_documents(list(read_corpus(world["corpus"])))


def config(world, model_dir, out: Path, **extra):
    extra = {"model__lora_r": 4, "rollout__max_turns": 2, "warmstart__epochs": 2, "warmstart__batch_size": 2,
             "warmstart__micro_batch_size": 1, "warmstart__lr": 1e-2, "warmstart__save_every": 1,
             "rollout__max_obs_tokens": 60, "rollout__max_response_tokens": 200, **extra}  # fmt: skip
    return rlworld.load(world, model_dir, out, **extra)


def samples(world):
    return [json.loads(line) for line in world["train"].read_text().splitlines()]


def test_rows_without_a_gold_path_are_named_and_skipped(world, tokenizer, bm25, tiny_model_dir, tmp_path):
    cfg = config(world, tiny_model_dir, tmp_path)
    writer = GoldWriter(tokenizer, cfg.rollout, bm25, 1)
    ex = gold_examples(samples(world), tokenizer, str(world["template"]), writer)
    assert ex.skipped == [2, 3, 5, 6, 7, 8] and ex.kinds == ["multi-hop", "single-hop"]
    assert [t.queries for t in ex.trajectories] == [["Quillon Press", "Alice Verdan"], ["Mira Lund"]]
    assert all(t.finish_reason == "answer" for t in ex.trajectories) and ex.cut == 0
    with pytest.raises(WarmStartError, match="supporting_titles"):
        gold_examples([samples(world)[i] for i in (1, 2)], tokenizer, str(world["template"]), writer)


def test_a_gold_trajectory_over_the_budget_is_cut_at_a_turn_and_counted(
    world, tokenizer, bm25, tiny_model_dir, tmp_path
):
    cfg = config(world, tiny_model_dir, tmp_path, rollout__max_response_tokens=80)
    writer = GoldWriter(tokenizer, cfg.rollout, bm25, 1)
    ex = gold_examples(samples(world), tokenizer, str(world["template"]), writer)
    assert ex.cut == 2
    full = gold_examples(samples(world), tokenizer, str(world["template"]), GoldWriter(tokenizer, config(
        world, tiny_model_dir, tmp_path).rollout, bm25, 1)).trajectories  # fmt: skip
    for traj, whole in zip(ex.trajectories, full, strict=True):
        assert len(traj.response_ids) <= 80 < len(whole.response_ids)
        # cut at a turn boundary: a prefix of whole turns (then the answer turn if it still fits)
        kept = traj.search_spans[-1][1] if traj.searches else 0
        assert (traj.response_ids[:kept] == whole.response_ids[:kept] and traj.searches < whole.searches) or (
            traj.truncated and traj.roles[-1] == Role.OBSERVATION
        )


def test_step_order_takes_fresh_permutations_per_pass():
    steps = step_order(5, 1.6, 3, seed=7)
    flat = [i for s in steps for i in s]
    assert [len(s) for s in steps] == [3, 3, 2] and len(flat) == 8
    assert sorted(flat[:5]) == list(range(5))  # the first pass is a permutation
    assert step_order(5, 1.6, 3, seed=7) == steps and step_order(5, 1.6, 3, seed=8) != steps


def _hand_loss(model, traj) -> torch.Tensor:
    """-mean log p of the generated tokens, from the model's full logits."""
    ids = torch.tensor([traj.prompt_ids + traj.response_ids])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
    targets = ids[0, 1:]
    gen = torch.tensor([0] * len(traj.prompt_ids) + [int(r == Role.GENERATED) for r in traj.roles])[1:].bool()
    return -logp[gen].gather(-1, targets[gen][:, None]).mean()


def test_the_loss_is_the_mean_nll_of_generated_tokens_only(world, tokenizer, bm25, tiny_model_dir):
    from searchr1.models import load_model

    model = load_model(tiny_model_dir)
    cfg = config(world, tiny_model_dir, Path("unused"), rollout__max_response_tokens=120)
    writer = GoldWriter(tokenizer, cfg.rollout, bm25, 1)
    traj = writer.trajectory(tokenizer.encode("Question: x\n"), gold_path(rlworld.BRIDGE), {}).trajectory
    assert traj.roles[-1] == Role.OBSERVATION  # cut after the first passage: it ends with observation tokens
    actor = PolicyLogprobs(model)
    exp = build_experience([traj], [0.0], [0], tokenizer.pad_token_id)
    loss = sft_loss(actor, exp, [0], float(exp.train_mask.sum()), torch.device("cpu"))
    assert loss.item() == pytest.approx(_hand_loss(model, traj).item(), rel=1e-5)

    def grads(t):
        model.zero_grad()
        e = build_experience([t], [0.0], [0], tokenizer.pad_token_id)
        sft_loss(actor, e, [0], float(e.train_mask.sum()), torch.device("cpu")).backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    base = grads(traj)
    changed = traj.__class__(**{**traj.__dict__, "response_ids": [*traj.response_ids[:-1], 7]})
    assert all(torch.equal(a, b) for a, b in zip(base, grads(changed), strict=True))  # an observation target
    gen_at = max(i for i, r in enumerate(traj.roles) if r == Role.GENERATED)
    other = list(traj.response_ids)
    other[gen_at] = 7 if other[gen_at] != 7 else 8
    changed = traj.__class__(**{**traj.__dict__, "response_ids": other})
    assert not all(torch.equal(a, b) for a, b in zip(base, grads(changed), strict=True))  # a generated one


def _stage(cfg, model_dir, tokenizer, bm25, world, out):
    from searchr1.models import load_model
    from searchr1.trainer.components import _apply_lora

    torch.manual_seed(cfg.seed)
    policy = _apply_lora(load_model(model_dir), cfg.model, None, top_layers=cfg.warmstart.lora_layers)
    writer = GoldWriter(tokenizer, cfg.rollout, bm25, 1)
    ex = gold_examples(samples(world) * 3, tokenizer, str(world["template"]), writer)
    return WarmStart(cfg, policy, tokenizer, ex, out, log=lambda line: None)


def _adapter(stage):
    return {n: p.detach().clone() for n, p in stage.policy.named_parameters() if p.requires_grad}


def test_a_killed_warm_start_resumes_bit_identically(world, tokenizer, bm25, tiny_model_dir, tmp_path):
    cfg = config(world, tiny_model_dir, tmp_path, model__lora_dropout=0.1)  # the random state is resumed too
    whole = _stage(cfg, tiny_model_dir, tokenizer, bm25, world, tmp_path / "whole")
    whole.run(progress=False)
    assert whole.step == len(whole.steps) == 6
    killed = _stage(cfg, tiny_model_dir, tokenizer, bm25, world, tmp_path / "killed")
    killed.run(progress=False, stop_after=4)
    assert (tmp_path / "killed" / STATE_FILE).is_file() and killed.step == 4
    resumed = _stage(cfg, tiny_model_dir, tokenizer, bm25, world, tmp_path / "killed")
    assert resumed.resume() and resumed.step == 4
    resumed.run(progress=False)
    a, b = _adapter(whole), _adapter(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.losses == whole.losses
    first = _adapter(_stage(cfg, tiny_model_dir, tokenizer, bm25, world, tmp_path / "fresh"))
    assert not all(torch.equal(a[k], first[k]) for k in a)  # training moved the adapter


def test_a_checkpoint_of_other_settings_or_a_truncated_one_is_refused_in_one_line(
    world, tokenizer, bm25, tiny_model_dir, tmp_path
):
    cfg = config(world, tiny_model_dir, tmp_path)
    stage = _stage(cfg, tiny_model_dir, tokenizer, bm25, world, tmp_path / "ws")
    stage.run(progress=False, stop_after=1)
    other = _stage(config(world, tiny_model_dir, tmp_path, warmstart__lr=5e-3), tiny_model_dir, tokenizer, bm25,
                   world, tmp_path / "ws")  # fmt: skip
    with pytest.raises(WarmStartError, match="other settings"):
        other.resume()
    path = tmp_path / "ws" / STATE_FILE
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(WarmStartError, match="cannot be read"):
        stage.resume()


def test_run_warm_start_writes_a_model_that_train_starts_from(world, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    args = rlworld.overrides(world, tiny_model_dir, out, model__lora_r=4, warmstart__epochs=1, warmstart__batch_size=2,
                             trainer__total_steps=1, trainer__batch_size=2, trainer__mini_batch_size=2,
                             rollout__n=2, rollout__max_response_tokens=120)  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-m", "searchr1", "train", *args], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "warmstart" / "warmstart.json").read_text())
    assert (
        summary["done"]
        and summary["examples"] == 2
        and summary["skipped_rows"] == 6
        and summary["steps"] == 1
    )
    saved = load_config(out / "config.yaml", [])
    assert Path(saved.model.path) == out / "warmstart" / "model"  # RL started from the warm start's policy
    from searchr1.data.trained_settings import find_trained_settings

    trained = find_trained_settings(out / "warmstart" / "model")  # eval / ask of the warm start alone
    assert trained is not None and trained.source == out / "warmstart" / "config.yaml"
    assert trained.values["rollout.max_response_tokens"] == 120
    from safetensors.torch import load_file

    warm = load_file(str(out / "warmstart" / "model" / "model.safetensors"))
    base = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    assert any(not torch.equal(warm[k], base[k]) for k in base if k in warm)  # the adapter was merged in
    again = subprocess.run([sys.executable, "-m", "searchr1", "warmstart", *args, "--no-progress"],
                           capture_output=True, text=True, env=env)  # fmt: skip
    assert again.returncode == 0 and "done before" in again.stderr


def test_warm_start_on_data_without_gold_paths_is_one_line_and_exit_2(world, tiny_model_dir, tmp_path):
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(line + "\n" for line in world["train"].read_text().splitlines()[1:3]))
    args = rlworld.overrides(world, tiny_model_dir, tmp_path / "run", model__lora_r=4, warmstart__epochs=1,
                             data__train_files=[str(plain)])  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "searchr1", "warmstart", *args], capture_output=True, text=True,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))  # fmt: skip
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "gold path" in lines[0] and "supporting_titles" in lines[0]


def test_hotpotqa_rows_give_gold_trajectories_through_their_supporting_titles(tokenizer):
    from searchr1.data.hotpotqa import flashrag_row, hotpotqa_corpus
    from searchr1.retrieval.corpus import Document, split_contents
    from searchr1.rollout.config import RolloutConfig

    row = {
        "id": "h1", "question": "Where was the founder of Quillon Press born?", "answer": "Borvik", "type": "bridge",
        "supporting_facts": [["Quillon Press", 0], ["Alice Verdan", 1]],
        "context": [["Quillon Press", ["Quillon Press was founded by Alice Verdan."]],
                    ["Alice Verdan", ["Alice Verdan was a poet.", " She was born in Borvik."]]],
    }  # fmt: skip
    corpus = [Document(p["id"], *split_contents(p["contents"])) for p in hotpotqa_corpus([row])]
    writer = GoldWriter(tokenizer, RolloutConfig(max_turns=2, max_obs_tokens=80, max_response_tokens=400),
                        BM25Retriever.from_documents(corpus), 1)  # fmt: skip
    ex = gold_examples([flashrag_row(row)], tokenizer, "base", writer)
    traj = ex.trajectories[0]
    assert ex.kinds == ["multi-hop"] and traj.queries == ["Quillon Press", "Alice Verdan"]
    assert [d[0]["title"] for d in traj.documents] == ["Quillon Press", "Alice Verdan"]
    assert tokenizer.decode(traj.response_ids).rstrip().endswith("<answer> Borvik </answer>")


# --- the held-out decision check (searchr1.trainer.warmstart_check) -------------------------------------


def _kind_rows(n_single: int, n_multi: int) -> list[dict]:
    rows = []
    for i in range(n_single):
        rows.append({**SINGLE, "id": f"s{i}"})
    for i in range(n_multi):
        rows.append({**rlworld.BRIDGE, "id": f"m{i}"})
    rows.append({"id": "plain", "question": "x", "golden_answers": ["y"], "metadata": {}})  # no gold path
    return rows


def test_the_held_out_slice_is_balanced_seeded_and_never_trained():
    from searchr1.data.formats import sample_kind
    from searchr1.trainer.warmstart_check import holdout_split

    rows = _kind_rows(30, 10)
    held, trained = holdout_split(rows, 8, seed=3)
    assert (
        len(held) == 8 and not set(held) & set(trained) and sorted(held + trained) == list(range(len(rows)))
    )
    assert sorted(sample_kind(rows[i]) for i in held) == ["multi-hop"] * 4 + ["single-hop"] * 4
    assert len(rows) - 1 in trained  # a row without a gold path is never held out
    assert holdout_split(rows, 8, seed=3) == (held, trained) and holdout_split(rows, 8, seed=4)[0] != held
    few = _kind_rows(10, 2)
    held, _ = holdout_split(few, 8, seed=0)
    assert (
        sum(sample_kind(few[i]) == "multi-hop" for i in held) == 2 and len(held) == 8
    )  # the rest: single-hop
    assert holdout_split(rows, 0, seed=0) == ([], list(range(len(rows))))
    with pytest.raises(ValueError, match=r"warmstart\.holdout=40"):
        holdout_split(rows, 40, seed=0)


def _check(world, tokenizer, bm25, tiny_model_dir, tmp_path):
    from searchr1.trainer.warmstart_check import DecisionCheck

    cfg = config(world, tiny_model_dir, tmp_path)
    writer = GoldWriter(tokenizer, cfg.rollout, bm25, 1)
    return DecisionCheck.build(
        [rlworld.BRIDGE, SINGLE], tokenizer, str(world["template"]), writer, batch_size=3
    )


def test_the_decision_check_scores_both_candidates_as_one_unpadded_pass_does(
    world, tokenizer, bm25, tiny_model_dir, tmp_path
):
    from searchr1.models import load_model
    from searchr1.trainer.warmstart_check import ANSWER_CONTINUATION, SEARCH_CONTINUATION

    check = _check(world, tokenizer, bm25, tiny_model_dir, tmp_path)
    assert [it.side for it in check.items] == ["search", "answer"]
    # the search side's context ends with the sentence that names the next title, after the first passage
    assert tokenizer.decode(check.items[0].context).rstrip().endswith("Alice Verdan.")
    assert check.items[0].search_ids == tokenizer.encode(SEARCH_CONTINUATION, add_special_tokens=False)
    assert check.items[1].answer_ids == tokenizer.encode(ANSWER_CONTINUATION, add_special_tokens=False)
    model = load_model(tiny_model_dir).eval()

    def alone(ctx, cand):
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([ctx + cand])).logits[0].float(), -1)
        return sum(float(logp[len(ctx) - 1 + j, c]) for j, c in enumerate(cand))

    pairs = check.continuation_logprobs(model, torch.device("cpu"))  # two contexts of two lengths: padding
    for item, (log_s, log_a) in zip(check.items, pairs, strict=True):
        assert log_s == pytest.approx(alone(item.context, item.search_ids), abs=1e-4)
        assert log_a == pytest.approx(alone(item.context, item.answer_ids), abs=1e-4)
    # candidates of other lengths in one batch (right-padded on the cache), one token alone, one context a batch
    other = copy.deepcopy(check)
    other.items[0].answer_ids = other.items[0].answer_ids[:1]
    other.items[1].search_ids = [*other.items[1].search_ids, *other.items[1].answer_ids]
    for other.batch_size in (1, 2):
        scored = other.continuation_logprobs(model, torch.device("cpu"))
        for item, (log_s, log_a) in zip(other.items, scored, strict=True):
            assert log_s == pytest.approx(alone(item.context, item.search_ids), abs=1e-4)
            assert log_a == pytest.approx(alone(item.context, item.answer_ids), abs=1e-4)
    # through the fused decoder: each (context, candidate) a row, rows of other lengths in one pass
    from searchr1.trainer.fused_decoder import FusedDecoder

    for other.batch_size in (1, 2):
        scored = other.fused_continuation_logprobs(FusedDecoder(model))
        for item, (log_s, log_a) in zip(other.items, scored, strict=True):
            assert log_s == pytest.approx(alone(item.context, item.search_ids), abs=1e-4)
            assert log_a == pytest.approx(alone(item.context, item.answer_ids), abs=1e-4)
    result = check.measure(model, torch.device("cpu"))
    fused = check.measure(model, torch.device("cpu"), decoder=FusedDecoder(model))
    assert fused["decision_accuracy"] == pytest.approx(result["decision_accuracy"], abs=1e-5)
    assert fused["search_side"]["p"] == pytest.approx(result["search_side"]["p"], abs=1e-5)
    p_search = [float(torch.sigmoid(torch.tensor(s - a))) for s, a in pairs]
    assert result["search_side"]["p"] == pytest.approx(p_search[0])
    assert result["answer_side"]["p"] == pytest.approx(1 - p_search[1])
    assert result["decision_accuracy"] == pytest.approx((p_search[0] + 1 - p_search[1]) / 2)


class _ScriptedCheck:
    """A check whose decision accuracy follows a script (the adapter it sees is recorded per call)."""

    def __init__(self, accuracies):
        self.accuracies = list(accuracies)
        self.items = []
        self.seen = []

    def measure(self, policy, device, decoder=None):
        self.seen.append({n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad})
        acc = self.accuracies[len(self.seen) - 1]
        side = {"questions": 1, "p": acc, "right_share": float(acc > 0.5)}
        return {"decision_accuracy": acc, "search_side": side, "answer_side": side}


def test_the_warm_start_keeps_its_best_check_not_its_last_and_stops_at_stop_at(
    world, tokenizer, bm25, tiny_model_dir, tmp_path
):
    cfg = config(world, tiny_model_dir, tmp_path, warmstart__holdout=2, warmstart__check_every=2)
    stage = _stage(cfg, tiny_model_dir, tokenizer, bm25, world, tmp_path / "best")
    stage.check = check = _ScriptedCheck([0.5, 0.9, 0.6, 0.7])  # steps 0, 2, 4, 6
    stage.run(progress=False)
    assert [c["step"] for c in stage.checks] == [0, 2, 4, 6] and stage.step == 6
    last = _adapter(stage)
    assert stage.restore_best() == 2
    kept = _adapter(stage)
    assert all(torch.equal(kept[k], check.seen[1][k]) for k in kept)  # step 2's adapter, not the last one
    assert not all(torch.equal(kept[k], last[k]) for k in kept)
    stopping = _stage(config(world, tiny_model_dir, tmp_path, warmstart__holdout=2, warmstart__check_every=2,
                             warmstart__stop_at=0.85), tiny_model_dir, tokenizer, bm25, world, tmp_path / "stop")  # fmt: skip
    stopping.check = _ScriptedCheck([0.5, 0.9, 0.6, 0.7])
    stopping.run(progress=False)
    assert stopping.step == 2 and stopping.done and stopping.stopped


def test_a_resumed_warm_start_keeps_the_best_of_before_the_kill(
    world, tokenizer, bm25, tiny_model_dir, tmp_path
):
    cfg = config(world, tiny_model_dir, tmp_path, warmstart__holdout=2, warmstart__check_every=2)
    killed = _stage(cfg, tiny_model_dir, tokenizer, bm25, world, tmp_path / "ws")
    killed.check = before = _ScriptedCheck([0.5, 0.95, 0.6, 0.7])
    killed.run(progress=False, stop_after=3)
    resumed = _stage(cfg, tiny_model_dir, tokenizer, bm25, world, tmp_path / "ws")
    resumed.check = _ScriptedCheck([0.6, 0.7])  # steps 4 and 6
    assert resumed.resume() and [c["step"] for c in resumed.checks] == [0, 2]
    resumed.run(progress=False)
    assert [c["step"] for c in resumed.checks] == [0, 2, 4, 6] and resumed.restore_best() == 2
    kept = _adapter(resumed)
    assert all(torch.equal(kept[k], before.seen[1][k]) for k in kept)


def test_the_decision_span_is_the_turn_after_the_first_passage_from_the_end_of_its_evidence(
    world, tokenizer, bm25, tiny_model_dir, tmp_path
):
    cfg = config(world, tiny_model_dir, tmp_path)
    writer = GoldWriter(tokenizer, cfg.rollout, bm25, 1)
    prompt = tokenizer.encode("Question: x\n")
    bridge = writer.trajectory(prompt, gold_path(rlworld.BRIDGE), {}).trajectory
    single = writer.trajectory(prompt, gold_path(SINGLE), {}).trajectory
    for traj, expected in ((bridge, "I should search Alice Verdan. </think>\n<search> Alice Verdan </search>"),
                           (single, "</think>\n<answer> Kessa </answer>")):  # fmt: skip
        a, b = traj.meta["decision_span"]
        assert tokenizer.decode(traj.response_ids[a:b]).strip() == expected
        assert all(r == Role.GENERATED for r in traj.roles[a:b])
        assert traj.roles[a - 1] == Role.GENERATED and Role.OBSERVATION in traj.roles[:a]  # after a passage


def test_the_decision_weight_scales_the_decision_tokens_of_the_loss(world, tokenizer, bm25, tiny_model_dir):
    from searchr1.models import load_model
    from searchr1.trainer.warmstart import token_weights

    model = load_model(tiny_model_dir)
    cfg = config(world, tiny_model_dir, Path("unused"))
    writer = GoldWriter(tokenizer, cfg.rollout, bm25, 1)
    trajs = [writer.trajectory(tokenizer.encode("Question: x\n"), gold_path(r), {}).trajectory
             for r in (rlworld.BRIDGE, SINGLE)]  # fmt: skip
    exp = build_experience(trajs, [0.0, 0.0], [0, 1], tokenizer.pad_token_id)
    actor = PolicyLogprobs(model)
    assert token_weights(trajs, exp, 1.0) is None
    weights = token_weights(trajs, exp, 5.0)
    loss = sft_loss(actor, exp, [0, 1], float(weights.sum()), torch.device("cpu"), weights)
    hand_sum, hand_w = 0.0, 0.0
    for traj in trajs:
        ids = torch.tensor([traj.prompt_ids + traj.response_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        a, b = traj.meta["decision_span"]
        for t, role in enumerate(traj.roles):
            if role == Role.GENERATED:
                pos = len(traj.prompt_ids) + t
                w = 5.0 if a <= t < b else 1.0
                hand_sum += -w * float(logp[pos - 1, ids[0, pos]])
                hand_w += w
    assert loss.item() == pytest.approx(hand_sum / hand_w, rel=1e-5)
    plain = sft_loss(actor, exp, [0, 1], float(exp.train_mask.sum()), torch.device("cpu"))
    assert abs(plain.item() - loss.item()) > 1e-4  # the weight changed the loss
    # micro-batches of one row each are trimmed to their own length: they add up to the whole batch's loss
    assert int(exp.seq_lens[0]) != int(exp.seq_lens[1])
    parts = sum(sft_loss(actor, exp, [i], float(weights.sum()), torch.device("cpu"), weights) for i in (0, 1))
    assert parts.item() == pytest.approx(loss.item(), rel=1e-5)


def test_an_adapter_on_the_top_layer_trains_the_same_with_the_frozen_trunk_cached(
    world, tokenizer, bm25, tiny_model_dir, tmp_path
):
    """warmstart.lora_layers=1 (of 2): the adapter is on the top layer only, the layer below runs once per
    trajectory (its states cached from the first pass on), and the adapter after two passes equals the one
    trained without the cache."""
    cfg = config(world, tiny_model_dir, tmp_path, warmstart__lora_layers=1, warmstart__micro_batch_size=2)
    lines: list[str] = []
    cached = _stage(cfg, tiny_model_dir, tokenizer, bm25, world, tmp_path / "cached")
    cached.log = lines.append
    cached.run(progress=False)
    plain = _stage(cfg, tiny_model_dir, tokenizer, bm25, world, tmp_path / "plain")
    plain.out_dir.mkdir(parents=True)
    plain._run(progress=False, stop_after=None)  # the same steps, no trunk attached
    a, b = _adapter(cached), _adapter(plain)
    assert a and all(".layers.1." in name for name in a)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-4)
    assert cached.losses == pytest.approx(plain.losses, rel=1e-4)
    assert not all(torch.equal(a[k], v) for k, v in _adapter(_stage(cfg, tiny_model_dir, tokenizer, bm25, world,
                                                                      tmp_path / "fresh")).items())  # fmt: skip
    (line,) = [x for x in lines if "ran once per trajectory" in x]
    computed, read = int(line.split(" computed")[0].split()[-1]), int(line.split(" rows read")[0].split()[-1])
    assert 0 < computed <= len(cached.examples.trajectories) <= read  # at most one pass computed, the second read
