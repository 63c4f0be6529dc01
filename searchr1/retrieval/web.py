"""Web-search APIs as backends: SerpAPI, Google Programmable Search, Serper, Brave, Bing.

Each maps the API's documented JSON to ``Hit(id=url, title, text=snippet, score=1/rank)``. Keys come
from environment variables (see ``key_env``); ``base_url`` points elsewhere (a proxy, or the local
test server). 429 and 5xx are retried with backoff (``client.send_with_retries``); 401/403 raise
``SearchError`` at once, naming the environment variable. Queries of a batch run concurrently.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import httpx

from searchr1.retrieval.base import RETRIEVERS, Hit, Retriever, SearchError
from searchr1.retrieval.client import send_with_retries

_TAG = re.compile(r"<[^>]+>")


def clean(text: Any) -> str:
    """Strip HTML tags and entities from a snippet."""
    return html.unescape(_TAG.sub("", str(text or ""))).strip()


class WebSearchRetriever(Retriever):
    """Common machinery: keys from env, one request per query, retries, result mapping."""

    name: ClassVar[str] = "web"
    default_base_url: ClassVar[str] = ""
    key_env: ClassVar[tuple[str, ...]] = ()
    max_results: ClassVar[int] = 10

    def __init__(
        self,
        base_url: str | None = None,
        timeout_s: float = 10.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 4,
        keys: dict[str, str] | None = None,
    ):
        keys = dict(keys or {})
        for env in self.key_env:
            keys.setdefault(env, os.environ.get(env, ""))
        missing = [env for env in self.key_env if not keys[env]]
        if missing:
            raise ValueError(f"{self.name} search needs the environment variable(s) {', '.join(missing)}")
        self.keys = keys
        self.base_url = (base_url or self.default_base_url).rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_concurrency = max(1, max_concurrency)
        self._http = httpx.Client(timeout=timeout_s)

    def request(self, query: str, topk: int) -> httpx.Request:
        raise NotImplementedError

    def parse(self, body: dict) -> list[tuple[str, str, str]]:
        """(url, title, snippet) in rank order."""
        raise NotImplementedError

    def _search_one(self, query: str, topk: int) -> list[Hit]:
        resp = send_with_retries(
            lambda attempt: self._http.send(self.request(query, min(topk, self.max_results))),
            f"{self.name} search",
            self.retries,
            self.backoff_s,
            auth_hint=f"; check {', '.join(self.key_env)}",
        )
        try:
            rows = self.parse(resp.json())
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SearchError(f"{self.name} search: unexpected response: {exc}") from exc
        return [
            Hit(url, clean(title), clean(snippet), 1.0 / rank)
            for rank, (url, title, snippet) in enumerate(rows[:topk], 1)
        ]

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        if len(queries) <= 1 or self.max_concurrency == 1:
            return [self._search_one(q, topk) for q in queries]
        with ThreadPoolExecutor(min(self.max_concurrency, len(queries))) as pool:
            return list(pool.map(lambda q: self._search_one(q, topk), queries))

    def close(self) -> None:
        self._http.close()


class SerpAPISearch(WebSearchRetriever):
    """SerpAPI Google results: GET /search.json?engine=google&q=..&api_key=.. -> organic_results[]."""

    name = "serpapi"
    default_base_url = "https://serpapi.com"
    key_env = ("SERPAPI_API_KEY",)

    def request(self, query: str, topk: int) -> httpx.Request:
        params = {"engine": "google", "q": query, "num": topk, "api_key": self.keys["SERPAPI_API_KEY"]}
        return self._http.build_request("GET", f"{self.base_url}/search.json", params=params)

    def parse(self, body: dict) -> list[tuple[str, str, str]]:
        if "organic_results" not in body and body.get("error"):
            if "hasn't returned any results" in body["error"]:
                return []
            raise SearchError(f"serpapi search: {body['error']}")
        return [
            (r.get("link", ""), r.get("title", ""), r.get("snippet", ""))
            for r in body.get("organic_results", [])
        ]


class GoogleSearch(WebSearchRetriever):
    """Google Programmable Search (Custom Search JSON API): GET /customsearch/v1?key&cx&q&num -> items[]."""

    name = "google"
    default_base_url = "https://www.googleapis.com"
    key_env = ("GOOGLE_API_KEY", "GOOGLE_CSE_ID")

    def request(self, query: str, topk: int) -> httpx.Request:
        params = {
            "key": self.keys["GOOGLE_API_KEY"],
            "cx": self.keys["GOOGLE_CSE_ID"],
            "q": query,
            "num": topk,
        }
        return self._http.build_request("GET", f"{self.base_url}/customsearch/v1", params=params)

    def parse(self, body: dict) -> list[tuple[str, str, str]]:
        return [(r.get("link", ""), r.get("title", ""), r.get("snippet", "")) for r in body.get("items", [])]


class SerperSearch(WebSearchRetriever):
    """Serper.dev: POST /search {"q", "num"} with X-API-KEY -> organic[]."""

    name = "serper"
    default_base_url = "https://google.serper.dev"
    key_env = ("SERPER_API_KEY",)

    def request(self, query: str, topk: int) -> httpx.Request:
        headers = {"X-API-KEY": self.keys["SERPER_API_KEY"]}
        return self._http.build_request(
            "POST", f"{self.base_url}/search", json={"q": query, "num": topk}, headers=headers
        )

    def parse(self, body: dict) -> list[tuple[str, str, str]]:
        return [
            (r.get("link", ""), r.get("title", ""), r.get("snippet", "")) for r in body.get("organic", [])
        ]


class BraveSearch(WebSearchRetriever):
    """Brave Search API: GET /res/v1/web/search?q&count with X-Subscription-Token -> web.results[]."""

    name = "brave"
    default_base_url = "https://api.search.brave.com"
    key_env = ("BRAVE_API_KEY",)
    max_results = 20

    def request(self, query: str, topk: int) -> httpx.Request:
        headers = {"X-Subscription-Token": self.keys["BRAVE_API_KEY"], "Accept": "application/json"}
        return self._http.build_request(
            "GET", f"{self.base_url}/res/v1/web/search", params={"q": query, "count": topk}, headers=headers
        )

    def parse(self, body: dict) -> list[tuple[str, str, str]]:
        results = (body.get("web") or {}).get("results", [])
        return [(r.get("url", ""), r.get("title", ""), r.get("description", "")) for r in results]


class BingSearch(WebSearchRetriever):
    """Bing Web Search v7: GET /v7.0/search?q&count with Ocp-Apim-Subscription-Key -> webPages.value[]."""

    name = "bing"
    default_base_url = "https://api.bing.microsoft.com"
    key_env = ("BING_API_KEY",)
    max_results = 50

    def request(self, query: str, topk: int) -> httpx.Request:
        headers = {"Ocp-Apim-Subscription-Key": self.keys["BING_API_KEY"]}
        return self._http.build_request(
            "GET", f"{self.base_url}/v7.0/search", params={"q": query, "count": topk}, headers=headers
        )

    def parse(self, body: dict) -> list[tuple[str, str, str]]:
        results = (body.get("webPages") or {}).get("value", [])
        return [(r.get("url", ""), r.get("name", ""), r.get("snippet", "")) for r in results]


WEB_APIS: dict[str, type[WebSearchRetriever]] = {
    cls.name: cls for cls in (SerpAPISearch, GoogleSearch, SerperSearch, BraveSearch, BingSearch)
}


def _from_config(api: type[WebSearchRetriever]) -> Callable[[Any], Retriever]:
    """The backend factory of one web API (``retrieval.backend=<its name>``) over the ``retrieval`` section."""

    def factory(cfg: Any) -> Retriever:
        return api(
            base_url=cfg.web_base_url,
            timeout_s=cfg.timeout_s,
            retries=cfg.retries,
            backoff_s=cfg.backoff_s,
            max_concurrency=cfg.web_max_concurrency,
        )

    return factory


for _api in WEB_APIS.values():
    RETRIEVERS.add(_api.name, _from_config(_api))
