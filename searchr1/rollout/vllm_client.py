"""The HTTP calls the vLLM engine makes to a vLLM server (its OpenAI-compatible API plus the development
endpoints that ``VLLM_SERVER_DEV_MODE=1`` opens), each checked and turned into one-line errors.

    client.complete(prompt_ids, request)     POST /v1/completions: token ids in, token ids + log-probs out
    client.reload_weights(folder)            POST /collective_rpc reload_weights: full weights, in place
    client.load_adapter(name, folder)        POST /v1/load_lora_adapter (load_inplace): a LoRA adapter
    client.reset_prefix_cache()              POST /reset_prefix_cache: no KV computed by older weights is reused
    client.sleep() / client.wake_up()        POST /sleep, /wake_up: free the GPU memory during the update
    client.served_dtype()                    GET /server_info: the dtype the server generates in

A server that stops answering raises ``VLLMError`` naming why (its exit code and log line when the engine
started it): the trainer's step fails with that cause and its last checkpoint stays as it was.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from searchr1.rollout.vllm_server import VLLMError, VLLMServer, failure_reason


@dataclass(frozen=True)
class Completion:
    """One finished generation request."""

    token_ids: list[int]
    logprobs: list[float]
    """The sampling log-prob of each token (vLLM's processed log-probs: at the sampling temperature)."""
    finish_reason: str
    """stop (a stop string or token, EOS included) | length (max_tokens) | abort."""
    cached_prompt_tokens: int
    """Prompt tokens whose KV came from the prefix cache."""


class VLLMClient:
    """Blocking calls to one vLLM server; thread-safe (one connection pool shared by the engine's rows)."""

    def __init__(self, server: VLLMServer, timeout_s: float, max_connections: int = 64) -> None:
        self.server = server
        self.timeout_s = timeout_s
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.http = httpx.Client(base_url=server.url, timeout=timeout_s, limits=limits)

    def close(self) -> None:
        self.http.close()

    def _post(self, path: str, what: str, **kw: Any) -> httpx.Response:
        """POST with the failure turned into one ``VLLMError`` line (a dead server's own reason first)."""
        try:
            response = self.http.post(path, **kw)
        except httpx.TimeoutException:
            raise VLLMError(
                f"the vLLM server did not answer {what} within {self.timeout_s:g} s (rollout.vllm.request_timeout_s)"
            ) from None
        except httpx.HTTPError as exc:
            raise self._gone(what, exc) from None
        if response.status_code != 200:
            detail = _detail(response)
            if response.status_code >= 500 and self.server.owned:  # the cause is in the server's log
                detail = f"{detail}; its log says {failure_reason(self.server.log_tail())}"
            raise VLLMError(f"the vLLM server failed {what} (HTTP {response.status_code}: {detail})")
        return response

    def _gone(self, what: str, exc: Exception) -> VLLMError:
        for _ in range(20):  # a dying server may need a moment to exit
            reason = self.server.failure()
            if reason is not None or not self.server.owned:
                break
            time.sleep(0.1)
        cause = reason if (reason := self.server.failure()) else f"{type(exc).__name__}: {exc}"
        return VLLMError(
            f"the vLLM server at {self.server.url} stopped during {what} ({cause}); the step failed and the last "
            "checkpoint is intact: rerun with trainer.resume=auto to continue"
        )

    # -- generation -----------------------------------------------------------------------------------

    def complete(self, prompt_ids: Sequence[int], request: dict[str, Any]) -> Completion:
        """Generate from ``prompt_ids`` (never re-tokenised) with the completion ``request`` fields."""
        body = {**request, "prompt": list(prompt_ids), "logprobs": 0, "return_token_ids": True}
        data = self._post("/v1/completions", "a generation request", json=body).json()
        choice = data["choices"][0]
        ids = [int(t) for t in choice.get("token_ids") or []]
        lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
        if len(lps) != len(ids):
            raise VLLMError(f"the vLLM server answered {len(ids)} tokens but {len(lps)} log-probs")
        usage = data.get("usage") or {}
        cached = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
        return Completion(ids, [float(x) for x in lps], str(choice.get("finish_reason") or ""), cached)

    def prompt_logprobs(self, token_ids: Sequence[int], request: dict[str, Any]) -> list[float | None]:
        """The server's log-prob of every token of ``token_ids`` given the ones before it (the first: None)."""
        body = {**request, "prompt": list(token_ids), "max_tokens": 1, "prompt_logprobs": 0}
        choice = self._post("/v1/completions", "a log-prob request", json=body).json()["choices"][0]
        out: list[float | None] = []
        for token, entry in zip(token_ids, choice["prompt_logprobs"], strict=True):
            out.append(None if entry is None else float(entry[str(token)]["logprob"]))
        return out

    def served_dtype(self) -> str | None:
        """The dtype the server's model runs in ("float32", ...), from its configuration (``/server_info``,
        ~3 s the first time: vLLM collects its environment); None when the server does not say (a server
        without the development endpoints)."""
        try:
            response = self.http.get("/server_info", params={"config_format": "json"})
            dtype = response.json()["vllm_config"]["model_config"]["dtype"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
        return str(dtype).removeprefix("torch.") if response.status_code == 200 else None

    # -- weights --------------------------------------------------------------------------------------

    def reload_weights(self, folder: str) -> None:
        """Load the safetensors of ``folder`` into the running model, in place (vLLM's reload_weights)."""
        self._post(
            "/collective_rpc",
            "the weight reload",
            json={"method": "reload_weights", "kwargs": {"weights_path": folder}},
        )

    def load_adapter(self, name: str, folder: str) -> None:
        """Load (or reload in place) the LoRA adapter ``folder`` under ``name``."""
        self._post(
            "/v1/load_lora_adapter",
            "the LoRA adapter load",
            json={"lora_name": name, "lora_path": folder, "load_inplace": True},
        )

    def reset_prefix_cache(self, attempts: int = 50) -> None:
        """Drop every cached prefix (KV computed by the old weights); retried while blocks are held."""
        for _ in range(attempts):
            if self._post("/reset_prefix_cache", "the prefix-cache reset").json().get("success", True):
                return
            time.sleep(0.1)
        raise VLLMError("the vLLM server could not reset its prefix cache (blocks still held by requests)")

    def sleep(self, level: int) -> None:
        self._post("/sleep", "sleep", params={"level": level})

    def wake_up(self) -> None:
        self._post("/wake_up", "wake up")


def _detail(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data))
        if isinstance(err, dict):
            err = err.get("message", err)
        return str(err).splitlines()[0][:300] if str(err) else str(data)[:300]
    return str(data)[:300]


def timed(fn: Callable[[], Any]) -> float:
    """Seconds ``fn()`` took."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
