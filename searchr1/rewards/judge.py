"""LLM-as-judge through an OpenAI-compatible ``/v1/chat/completions`` endpoint (httpx).

The judge is asked whether the predicted answer means the same as one of the golden answers and
replies ``yes`` / ``no`` (or a number in [0, 1]). A call that fails (connection error, HTTP error,
timeout after the retries, or an unreadable reply) never raises: it yields ``fallback`` and the
error text, which the composite reward records.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

JUDGE_SYSTEM = (
    "You grade answers to questions. Reply with a single word: yes if the predicted answer means the "
    "same as one of the reference answers, no otherwise."
)
JUDGE_USER = "Question: {question}\nReference answers: {golden}\nPredicted answer: {answer}\nCorrect?"
_NUMBER = re.compile(r"[-+]?\d*\.?\d+")


@dataclass(frozen=True)
class JudgeResult:
    score: float
    error: str | None = None
    reply: str = ""


def chat_completions_url(url: str) -> str:
    """Accept a base URL (``http://h:8000``, ``http://h:8000/v1``) or the full completions URL."""
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


def parse_judge_reply(text: str) -> float | None:
    """yes/correct -> 1.0, no/incorrect -> 0.0, a number in [0, 1] -> itself, anything else -> None."""
    t = text.strip().lower().lstrip("*\"' ")
    if t.startswith(("yes", "correct", "true")):
        return 1.0
    if t.startswith(("no", "incorrect", "false", "wrong")):
        return 0.0
    m = _NUMBER.match(t)
    if m:
        value = float(m.group())
        if 0.0 <= value <= 1.0:
            return value
    return None


class JudgeClient:
    """Blocking client; ``judge_batch`` runs the calls of a batch concurrently on threads."""

    def __init__(
        self,
        url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 20.0,
        retries: int = 1,
        fallback: float = 0.0,
        max_concurrency: int = 8,
    ) -> None:
        self.url = chat_completions_url(url)
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.retries = retries
        self.fallback = fallback
        self.max_concurrency = max_concurrency

    @classmethod
    def from_config(cls, cfg: Any) -> JudgeClient:
        if not cfg.judge_url:
            raise ValueError("reward.judge_url: required for the llm_judge component")
        return cls(
            cfg.judge_url,
            cfg.judge_model,
            api_key=os.environ.get(cfg.judge_api_key_env) or None,
            timeout_s=cfg.judge_timeout_s,
            retries=cfg.judge_retries,
            fallback=cfg.judge_fallback,
        )

    def _payload(self, question: str, answer: str, golden: list[str]) -> dict[str, Any]:
        user = JUDGE_USER.format(question=question, golden=" | ".join(golden), answer=answer)
        return {
            "model": self.model,
            "messages": [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}],
            "temperature": 0.0,
            "max_tokens": 8,
        }

    def judge(self, question: str, answer: str | None, golden: list[str], client: Any = None) -> JudgeResult:
        """One verdict; no answer at all scores 0.0 without a call."""
        import httpx

        if answer is None or not answer.strip():
            return JudgeResult(0.0)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        own = client is None
        client = client or httpx.Client(timeout=self.timeout_s)
        error = "no attempt"
        try:
            for _attempt in range(self.retries + 1):
                try:
                    resp = client.post(
                        self.url, json=self._payload(question, answer, golden), headers=headers
                    )
                    resp.raise_for_status()
                    reply = resp.json()["choices"][0]["message"]["content"] or ""
                except httpx.TimeoutException:
                    error = f"judge timed out after {self.timeout_s:g}s"
                    continue
                except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
                    error = f"judge call failed: {type(exc).__name__}: {exc}"
                    continue
                score = parse_judge_reply(reply)
                if score is None:
                    return JudgeResult(self.fallback, f"unreadable judge reply {reply[:60]!r}", reply)
                return JudgeResult(score, None, reply)
            return JudgeResult(self.fallback, error)
        finally:
            if own:
                client.close()

    def judge_batch(self, items: list[tuple[str, str | None, list[str]]]) -> list[JudgeResult]:
        import httpx

        with httpx.Client(timeout=self.timeout_s) as client:
            if len(items) <= 1:
                return [self.judge(q, a, g, client) for q, a, g in items]
            with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(items))) as pool:
                return list(pool.map(lambda it: self.judge(it[0], it[1], it[2], client), items))
