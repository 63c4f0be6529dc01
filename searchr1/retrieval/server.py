"""The retrieval server: Search-R1's HTTP API on FastAPI + uvicorn, with micro-batching and limits.

    POST /retrieve {"queries": ["q1", "q2"], "topk": 3, "return_scores": true}
      -> {"result": [[{"document": {"id": "..", "contents": "\\"Title\\"\\ntext"}, "score": 0.83}, ...], ...]}
    with "return_scores": false each hit is the bare document {"id", "contents"}.
    GET /health -> {"status": "ok", "retriever": "bm25", "documents": N}
    GET /docs   -> OpenAPI documentation

Requests that arrive while the backend is busy are merged into one backend call per ``topk`` (micro
batching): one request of 128 queries and 128 requests of one query cost about the same backend time.
Oversized requests answer 413, invalid ones 422 (or 400 for undecodable bodies), a missing or wrong
bearer token 401; each with a message saying what to change.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from starlette.exceptions import HTTPException as StarletteHTTPException

from searchr1.retrieval.base import Hit, Retriever

API_KEY_ENV = "SEARCHR1_API_KEY"


@dataclass
class ServerLimits:
    max_queries: int = 1024
    """Queries per request (more: 413)."""
    max_topk: int = 100
    """Largest topk (more: 422)."""
    max_query_chars: int = 4096
    """Characters per query (more: 413)."""
    max_body_bytes: int = 8 << 20
    """Request body size (more: 413)."""
    max_batch_queries: int = 2048
    """Queries merged into one backend call by the micro-batcher."""


class RetrieveRequest(BaseModel):
    """Search-R1 retrieval request."""

    model_config = ConfigDict(extra="ignore")
    queries: list[StrictStr] = Field(description="Search queries, answered in order.")
    topk: StrictInt | None = Field(default=None, description="Hits per query (server default when omitted).")
    return_scores: StrictBool = Field(default=False, description="Wrap each hit as {document, score}.")


class Document(BaseModel):
    id: str
    contents: str = Field(description='wiki-18 form: "\\"Title\\"\\ntext"')


class ScoredDocument(BaseModel):
    document: Document
    score: float


class RetrieveResponse(BaseModel):
    result: list[list[ScoredDocument] | list[Document]]


class MicroBatcher:
    """Queue of pending requests; a single worker merges whatever is waiting into one backend call per topk."""

    def __init__(self, retriever: Retriever, max_batch_queries: int = 2048):
        self.retriever = retriever
        self.max_batch_queries = max_batch_queries
        self.queue: asyncio.Queue | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieval")
        self._task: asyncio.Task | None = None
        self.backend_calls = 0

    async def start(self) -> None:
        self.queue = asyncio.Queue()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=False)

    async def search(self, queries: list[str], topk: int) -> tuple[list[list[Hit]], tuple[float, float]]:
        """Hits for ``queries`` and (wall, cpu) seconds of the backend call that answered them."""
        assert self.queue is not None, "batcher not started"
        fut = asyncio.get_running_loop().create_future()
        await self.queue.put((queries, topk, fut))
        return await fut

    def _timed_search(self, queries: list[str], topk: int) -> tuple[list[list[Hit]], tuple[float, float]]:
        wall, cpu = time.perf_counter(), time.thread_time()
        results = self.retriever.search(queries, topk)
        return results, (time.perf_counter() - wall, time.thread_time() - cpu)

    async def _run(self) -> None:
        assert self.queue is not None
        loop = asyncio.get_running_loop()
        while True:
            items = [await self.queue.get()]
            count = len(items[0][0])
            while count < self.max_batch_queries and not self.queue.empty():
                item = self.queue.get_nowait()
                items.append(item)
                count += len(item[0])
            by_topk: dict[int, list] = {}
            for item in items:
                by_topk.setdefault(item[1], []).append(item)
            for topk, group in by_topk.items():
                queries = [q for g in group for q in g[0]]
                try:
                    self.backend_calls += 1
                    results, seconds = await loop.run_in_executor(
                        self._executor, self._timed_search, queries, topk
                    )
                    if len(results) != len(queries):
                        raise RuntimeError(
                            f"backend returned {len(results)} results for {len(queries)} queries"
                        )
                except Exception as exc:  # answered as 5xx to every waiting request
                    for _, _, fut in group:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                start = 0
                for qs, _, fut in group:
                    if not fut.done():
                        fut.set_result((results[start : start + len(qs)], seconds))
                    start += len(qs)


def _doc(hit: Hit) -> dict:
    return {"id": hit.id, "contents": hit.contents}


def create_app(
    retriever: Retriever,
    limits: ServerLimits | None = None,
    api_key: str | None = None,
    default_topk: int = 3,
    num_documents: int | None = None,
) -> FastAPI:
    """The FastAPI app answering ``/retrieve`` and ``/health`` with ``retriever``.

    ``api_key``: when set, every ``/retrieve`` call needs ``Authorization: Bearer <api_key>``.
    """
    limits = limits or ServerLimits()
    if num_documents is None and hasattr(retriever, "docs"):
        num_documents = len(retriever.docs)
    batcher = MicroBatcher(retriever, limits.max_batch_queries)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(
        title="searchr1 retrieval",
        description="Search-R1-compatible retrieval API (POST /retrieve).",
        lifespan=lifespan,
    )
    app.state.batcher = batcher
    bearer = HTTPBearer(auto_error=False)

    def check_key(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if api_key is None:
            return
        if creds is None or creds.scheme.lower() != "bearer":
            raise HTTPException(401, "missing bearer token: send 'Authorization: Bearer <key>'")
        if creds.credentials != api_key:
            raise HTTPException(401, "invalid API key")

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limits.max_body_bytes:
            return JSONResponse(
                {"detail": f"request body of {length} bytes exceeds the limit of {limits.max_body_bytes}"},
                status_code=413,
            )
        return await call_next(request)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail
        if exc.status_code == 400 and detail == "There was an error parsing the body":
            detail = "request body could not be decoded: send UTF-8 JSON"  # e.g. invalid UTF-8 bytes
        return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=exc.headers)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "retriever": retriever.name, "documents": num_documents}

    @app.post("/retrieve", response_model=RetrieveResponse, dependencies=[Depends(check_key)])
    async def retrieve(req: RetrieveRequest) -> Response:
        topk = default_topk if req.topk is None else req.topk
        if not req.queries:
            raise HTTPException(422, "queries must hold at least one query")
        if len(req.queries) > limits.max_queries:
            raise HTTPException(
                413, f"{len(req.queries)} queries exceed the limit of {limits.max_queries} per request"
            )
        if not 1 <= topk <= limits.max_topk:
            raise HTTPException(422, f"topk must be between 1 and {limits.max_topk}, got {topk}")
        for i, q in enumerate(req.queries):
            if len(q) > limits.max_query_chars:
                raise HTTPException(
                    413, f"query {i} has {len(q)} characters, more than the limit of {limits.max_query_chars}"
                )
            try:
                q.encode("utf-8")
            except UnicodeEncodeError:
                raise HTTPException(422, f"query {i} is not valid Unicode (lone surrogate)") from None
        try:
            results, search_s = await batcher.search(req.queries, topk)
        except Exception as exc:
            raise HTTPException(503, f"search backend failed: {type(exc).__name__}: {exc}") from exc
        if req.return_scores:
            payload = [[{"document": _doc(h), "score": h.score} for h in hits] for hits in results]
        else:
            payload = [[_doc(h) for h in hits] for hits in results]
        body = json.dumps({"result": payload}, ensure_ascii=False).encode("utf-8")
        # Server-Timing: wall and CPU milliseconds of the backend call that answered this request
        timing = f"search;dur={search_s[0] * 1000:.2f}, search-cpu;dur={search_s[1] * 1000:.2f}"
        return Response(content=body, media_type="application/json", headers={"Server-Timing": timing})

    return app


@contextlib.contextmanager
def serve_in_thread(
    app: FastAPI, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 20.0
) -> Iterator[tuple]:
    """Run ``app`` with uvicorn in a background thread; yields ``(base_url, stop)``.

    ``port=0`` picks a free port. ``stop()`` shuts the server down early (it is also called on exit).

        with serve_in_thread(create_app(retriever)) as (url, stop):
            RetrievalClient(url).search(["q"], 3)
    """
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"uvicorn did not start on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout_s)

    try:
        yield f"http://{host}:{bound}", stop
    finally:
        stop()


def tune_malloc_for_search() -> bool:
    """Stop glibc from handing large freed blocks back to the kernel after every query (Linux only).

    A search allocates corpus-sized temporaries (BM25 scores, top-k buffers). In a worker thread's
    malloc arena glibc returns them to the kernel on free, so the next query page-faults them back in:
    measured on a 30k-passage BM25 index, twice the CPU per batch of the same search run in process.
    Raising the mmap and trim thresholds keeps that memory in the process for reuse.
    """
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 32 << 20) and libc.mallopt(m_trim_threshold, 256 << 20))
    except (OSError, AttributeError):
        return False


def run_server(
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    limits: ServerLimits | None = None,
    default_topk: int = 3,
    num_documents: int | None = None,
) -> None:
    """Serve in the foreground (``searchr1 serve``); the API key defaults to env SEARCHR1_API_KEY."""
    import uvicorn

    api_key = api_key or os.environ.get(API_KEY_ENV) or None
    tune_malloc_for_search()
    app = create_app(retriever, limits, api_key, default_topk, num_documents)
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)
