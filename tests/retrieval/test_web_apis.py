"""Web-search backends against a local HTTP server answering each API's documented JSON shapes."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from searchr1.retrieval.base import SearchError
from searchr1.retrieval.server import serve_in_thread
from searchr1.retrieval.web import WEB_APIS

KEYS = {
    "SERPAPI_API_KEY": "k-serpapi",
    "GOOGLE_API_KEY": "k-google",
    "GOOGLE_CSE_ID": "cx-1",
    "SERPER_API_KEY": "k-serper",
    "BRAVE_API_KEY": "k-brave",
    "BING_API_KEY": "k-bing",
}


def results_for(q: str, n: int) -> list[tuple[str, str, str]]:
    return [
        (
            f"https://example.org/{q.replace(' ', '_')}/{i}",
            f"{q} page {i}",
            f"About <b>{q}</b> &amp; more {i}",
        )
        for i in range(1, n + 1)
    ]


def fake_web_app() -> FastAPI:
    """Answers like SerpAPI, Google CSE, Serper, Brave and Bing; a query 'ratelimited' gets one 429,
    'broken' gets 500s; a wrong key gets 401/403 the way each API does."""
    app = FastAPI()
    app.state.calls = []

    def script(q: str):
        app.state.calls.append(q)
        if q == "ratelimited" and app.state.calls.count(q) == 1:
            return JSONResponse({"error": "rate limited"}, status_code=429, headers={"Retry-After": "0"})
        if q == "broken":
            return JSONResponse({"error": "backend"}, status_code=500)
        return None

    @app.get("/search.json")
    async def serpapi(q: str, api_key: str, engine: str = "google", num: int = 10):
        if api_key != KEYS["SERPAPI_API_KEY"]:
            return JSONResponse(
                {"error": "Invalid API key. Your API key should be here: https://serpapi.com/manage-api-key"},
                status_code=401,
            )
        if q == "nothing":
            return {
                "search_metadata": {"status": "Success"},
                "error": "Google hasn't returned any results for this query.",
            }
        return script(q) or {
            "organic_results": [
                {"position": i + 1, "title": t, "link": u, "snippet": s}
                for i, (u, t, s) in enumerate(results_for(q, num))
            ]
        }

    @app.get("/customsearch/v1")
    async def google(q: str, key: str, cx: str, num: int = 10):
        if key != KEYS["GOOGLE_API_KEY"]:
            return JSONResponse(
                {"error": {"code": 400, "message": "API key not valid. Please pass a valid API key."}},
                status_code=400,
            )
        return script(q) or {
            "kind": "customsearch#search",
            "items": [{"title": t, "link": u, "snippet": s} for u, t, s in results_for(q, num)],
        }

    @app.post("/search")
    async def serper(request: Request):
        if request.headers.get("x-api-key") != KEYS["SERPER_API_KEY"]:
            return JSONResponse({"message": "Unauthorized.", "statusCode": 403}, status_code=403)
        body = await request.json()
        q, num = body["q"], body.get("num", 10)
        return script(q) or {
            "searchParameters": {"q": q},
            "organic": [
                {"title": t, "link": u, "snippet": s, "position": i + 1}
                for i, (u, t, s) in enumerate(results_for(q, num))
            ],
        }

    @app.get("/res/v1/web/search")
    async def brave(request: Request, q: str, count: int = 20):
        if request.headers.get("x-subscription-token") != KEYS["BRAVE_API_KEY"]:
            return JSONResponse(
                {"type": "ErrorResponse", "error": {"code": "SUBSCRIPTION_TOKEN_INVALID", "status": 401}},
                status_code=401,
            )
        return script(q) or {
            "type": "search",
            "web": {
                "type": "search",
                "results": [{"title": t, "url": u, "description": s} for u, t, s in results_for(q, count)],
            },
        }

    @app.get("/v7.0/search")
    async def bing(request: Request, q: str, count: int = 10):
        if request.headers.get("ocp-apim-subscription-key") != KEYS["BING_API_KEY"]:
            return JSONResponse(
                {"error": {"code": "401", "message": "Access denied due to invalid subscription key."}},
                status_code=401,
            )
        return script(q) or {
            "_type": "SearchResponse",
            "webPages": {
                "value": [
                    {"id": str(i), "name": t, "url": u, "snippet": s}
                    for i, (u, t, s) in enumerate(results_for(q, count))
                ]
            },
        }

    return app


@pytest.fixture(scope="module")
def web_server():
    app = fake_web_app()
    with serve_in_thread(app) as (url, _):
        yield url, app


@pytest.fixture
def keys(monkeypatch):
    for k, v in KEYS.items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("api", sorted(WEB_APIS))
def test_results_map_to_hits(api, web_server, keys):
    url, _ = web_server
    r = WEB_APIS[api](base_url=url, retries=1, backoff_s=0.01)
    results = r.search(["alice verdan", "borvik"], 3)
    assert [len(h) for h in results] == [3, 3]
    first = results[0][0]
    assert first.id == "https://example.org/alice_verdan/1"
    assert first.title == "alice verdan page 1"
    assert first.text == "About alice verdan & more 1"  # HTML stripped, entities decoded
    assert [h.score for h in results[1]] == sorted((h.score for h in results[1]), reverse=True)


@pytest.mark.parametrize("api", sorted(WEB_APIS))
def test_rate_limit_retried_server_error_gives_up(api, web_server, keys):
    url, app = web_server
    r = WEB_APIS[api](base_url=url, retries=2, backoff_s=0.01)
    app.state.calls = [c for c in app.state.calls if c != "ratelimited"]
    assert len(r.search(["ratelimited"], 2)[0]) == 2
    assert app.state.calls.count("ratelimited") == 2  # one 429, then the retry
    with pytest.raises(SearchError, match="all 3 attempts failed; last: HTTP 500"):
        r.search(["broken"], 2)


@pytest.mark.parametrize("api", sorted(WEB_APIS))
def test_bad_key_is_a_clear_error(api, web_server, keys, monkeypatch):
    url, _ = web_server
    env = WEB_APIS[api].key_env[0]
    monkeypatch.setenv(env, "wrong")
    # Google answers 400 "API key not valid"; the others 401/403. None of them is retried.
    expected = (
        "HTTP 400: .*API key not valid" if api == "google" else rf"HTTP 40[13] \(not authorised; check {env}"
    )
    with pytest.raises(SearchError, match=expected):
        WEB_APIS[api](base_url=url, retries=3, backoff_s=0.01).search(["q"], 2)


@pytest.mark.parametrize("api", sorted(WEB_APIS))
def test_missing_key_names_the_variable(api, monkeypatch):
    for k in KEYS:
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError, match=WEB_APIS[api].key_env[0]):
        WEB_APIS[api]()


def test_serpapi_no_results_is_empty(web_server, keys):
    url, _ = web_server
    assert WEB_APIS["serpapi"](base_url=url).search(["nothing"], 3) == [[]]


def test_selectable_by_config(web_server, keys):
    from searchr1.retrieval.config import RetrievalConfig
    from searchr1.retrieval.factory import build_retriever

    url, _ = web_server
    r = build_retriever(RetrievalConfig(backend="brave", web_base_url=url, cache_size=8))
    assert r.search(["borvik"], 1)[0][0].id == "https://example.org/borvik/1"
