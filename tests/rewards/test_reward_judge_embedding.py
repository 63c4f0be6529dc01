"""LLM-as-judge against a local OpenAI-compatible server on loopback; embedding similarity with MiniLM."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, HTTPException, Request

from searchr1.rewards import RewardConfig, build_reward, context_from_text
from searchr1.rewards.judge import chat_completions_url, parse_judge_reply

ANSWERED = "<think>x</think><answer> {a} </answer>"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def judge_server():
    """A chat-completions server: model 'fair' compares answers, 'slow' sleeps, 'broken' fails,
    'babble' answers nonsense. Records every request body."""
    app = FastAPI()
    seen: list[dict] = []

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        seen.append({"body": body, "auth": request.headers.get("authorization")})
        model, user = body["model"], body["messages"][-1]["content"]
        if model == "slow":
            await asyncio.sleep(1.5)
        if model == "broken":
            raise HTTPException(status_code=500, detail="boom")
        lines = dict(line.split(": ", 1) for line in user.splitlines() if ": " in line)
        refs = [r.strip().lower() for r in lines["Reference answers"].split("|")]
        verdict = "yes" if lines["Predicted answer"].strip().lower() in refs else "no"
        if model == "babble":
            verdict = "perhaps, who knows"
        return {
            "id": "x",
            "object": "chat.completion",
            "model": model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": verdict}, "finish_reason": "stop"}
            ],
        }

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/v1", seen
    server.should_exit = True
    thread.join(timeout=5)


def _judge(url: str, model: str, **kw) -> RewardConfig:
    return RewardConfig(
        components={"llm_judge": 1.0, "exact_match": 0.0}, judge_url=url, judge_model=model, **kw
    )


def test_judge_scores_through_the_endpoint(judge_server, monkeypatch):
    url, seen = judge_server
    monkeypatch.setenv("JUDGE_KEY_FOR_TEST", "sk-local")
    reward = build_reward(_judge(url, "fair", judge_api_key_env="JUDGE_KEY_FOR_TEST"))
    ctx_kw = {"question": "Where was Alice Verdan born?"}
    outs = reward.score_contexts(
        [context_from_text(ANSWERED.format(a=a), ["Borvik"], **ctx_kw) for a in ("Borvik", "Tarnland")]
    )
    assert [o.raw["llm_judge"] for o in outs] == [1.0, 0.0]
    assert all(not o.failures for o in outs)
    body = seen[-1]["body"]
    assert body["model"] == "fair" and body["messages"][0]["role"] == "system"
    assert "Where was Alice Verdan born?" in body["messages"][-1]["content"]
    assert seen[-1]["auth"] == "Bearer sk-local"
    # no answer at all: 0 without a call
    n = len(seen)
    assert reward.score_text("<think>x</think>", ["Borvik"]).raw["llm_judge"] == 0.0
    assert len(seen) == n


@pytest.mark.parametrize(
    ("model", "url_suffix", "why"),
    [
        ("slow", "", "timed out"),
        ("broken", "", "HTTPStatusError"),
        ("babble", "", "unreadable judge reply"),
        ("fair", "/nowhere", "judge call failed"),
    ],
)
def test_judge_failure_gives_fallback_and_is_recorded(judge_server, model, url_suffix, why):
    url, _ = judge_server
    cfg = _judge(url + url_suffix, model, judge_timeout_s=0.5, judge_retries=0, judge_fallback=0.25)
    out = build_reward(cfg).score_text(ANSWERED.format(a="Borvik"), ["Borvik"])
    assert out.raw["llm_judge"] == 0.25
    assert why in out.failures["llm_judge"]


def test_judge_unreachable_server_never_crashes():
    cfg = _judge(
        f"http://127.0.0.1:{_free_port()}", "fair", judge_timeout_s=0.5, judge_retries=1, judge_fallback=-1.0
    )
    out = build_reward(cfg).score_text(ANSWERED.format(a="Borvik"), ["Borvik"])
    assert out.total == -1.0 and "judge call failed" in out.failures["llm_judge"]


def test_judge_url_and_reply_parsing():
    assert chat_completions_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1/v1/chat/completions") == "http://h:1/v1/chat/completions"
    assert parse_judge_reply("Yes.") == 1.0 and parse_judge_reply("no") == 0.0
    assert (
        parse_judge_reply("0.7") == 0.7
        and parse_judge_reply("7") is None
        and parse_judge_reply("maybe") is None
    )


def test_embedding_similarity_with_the_bundled_minilm():
    reward = build_reward({"embedding_similarity": 1.0})
    golden = ["New York City"]
    close = reward.score_text(ANSWERED.format(a="New York"), golden).total
    same = reward.score_text(ANSWERED.format(a="new york city"), golden).total
    far = reward.score_text(ANSWERED.format(a="a ripe banana"), golden).total
    none = reward.score_text("<think>x</think>", golden).total
    assert same == pytest.approx(1.0, abs=1e-4)
    assert far < close < same
    assert none == 0.0
    assert 0.0 <= far < 0.5
