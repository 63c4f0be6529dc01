"""The retrieval server: Search-R1's HTTP API on FastAPI + uvicorn, with fair micro-batching and limits.

    POST /retrieve {"queries": ["q1", "q2"], "topk": 3, "return_scores": true}
      -> {"result": [[{"document": {"id": "..", "contents": "\\"Title\\"\\ntext"}, "score": 0.83}, ...], ...]}
    with "return_scores": false each hit is the bare document {"id", "contents"}.
    GET /health -> {"status": "ok", "retriever": "bm25", "documents": N, "limits": {...}}
    GET /docs   -> OpenAPI documentation

Requests are merged into shared backend calls and large ones split across calls, max-min fairly
(:mod:`searchr1.retrieval.batcher`); answers are encoded on the worker thread, so the event loop
only reads requests and writes bytes. Every malformed request gets a 4xx whose message names the
problem (:mod:`searchr1.retrieval.wire`): 413 for a body over the limit however it is framed (bytes
are counted while reading) and for more than ``max_hits`` = queries x topk, 408 for a body that does
not arrive within ``body_timeout_s``, 422 for non-finite numbers and schema errors, 400 for bodies
that are not UTF-8 or nest too deeply, 401 for a missing or wrong bearer token.

Access log (logger ``searchr1.server.access``, on by default): one line per request with client,
method, path, status, queries, topk, latency and, for errors, their cause; never the request's text.
Backend failures (503) are logged at WARNING by ``searchr1.server`` with their cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from searchr1.retrieval.base import Retriever
from searchr1.retrieval.batcher import FairBatcher
from searchr1.retrieval.wire import (
    ClientGone,
    Document,
    RequestRejected,
    RetrieveRequest,
    RetrieveResponse,
    ScoredDocument,
    ServerLimits,
    check_request,
    parse_json,
    read_body,
)

__all__ = [
    "API_KEY_ENV",
    "Document",
    "RetrieveRequest",
    "RetrieveResponse",
    "ScoredDocument",
    "ServerLimits",
    "create_app",
    "run_server",
    "serve_in_thread",
]

API_KEY_ENV = "SEARCHR1_API_KEY"
ACCESS_LOGGER = "searchr1.server.access"
SERVER_LOGGER = "searchr1.server"
SCOPE_KEY = "searchr1.request"
"""Per-request facts the endpoint leaves in the ASGI scope for the access log (queries, topk, error)."""
INLINE_PARSE_BYTES = 64 << 10
"""Bodies up to this size are parsed on the event loop; larger ones on a worker thread."""

log = logging.getLogger(SERVER_LOGGER)
access_log = logging.getLogger(ACCESS_LOGGER)


class AccessLog:
    """ASGI middleware: one log line per HTTP request, written when its response is complete."""

    def __init__(self, app: Any, enabled: bool = True) -> None:
        self.app = app
        self.enabled = enabled

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_and_note(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.write(scope, status, time.perf_counter() - start)

    def write(self, scope: dict, status: int, seconds: float) -> None:
        info = scope.get(SCOPE_KEY, {})
        if status < 500 and not (self.enabled and access_log.isEnabledFor(logging.INFO)):
            return
        client = scope.get("client")
        line = (
            f'{client[0] if client else "-"}:{client[1] if client else "-"} "{scope["method"]} '
            f'{scope["path"]}" {status} queries={info.get("queries", "-")} topk={info.get("topk", "-")} '
            f"{seconds * 1000:.1f}ms"
        )
        if "error" in info:
            line += f' error="{info["error"]}"'
        if status >= 500:
            log.warning(line)
        else:
            access_log.info(line)


def _note(request: Request, **facts: Any) -> None:
    request.scope.setdefault(SCOPE_KEY, {}).update(facts)


def _rejected(request: Request, exc: RequestRejected) -> JSONResponse:
    _note(request, error=exc.message)
    headers = {"Connection": "close"} if exc.close else None
    return JSONResponse({"detail": exc.message}, status_code=exc.status, headers=headers)


def _retrieve_openapi() -> dict[str, Any]:
    """The request body of ``/retrieve`` for the OpenAPI docs (the endpoint reads the body itself)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": RetrieveRequest.model_json_schema()}},
        }
    }


def create_app(
    retriever: Retriever,
    limits: ServerLimits | None = None,
    api_key: str | None = None,
    default_topk: int = 3,
    num_documents: int | None = None,
    access_log: bool = True,
    warm_up: bool = True,
) -> FastAPI:
    """The FastAPI app answering ``/retrieve`` and ``/health`` with ``retriever``.

    ``api_key``: when set, every ``/retrieve`` call needs ``Authorization: Bearer <api_key>``.
    ``access_log``: one INFO line per request on logger ``searchr1.server.access``.
    ``warm_up``: prepare the retriever before the app is returned (``Retriever.warm_up``: BM25 compiles
    its kernel, 30-60 s the first time on a machine, then loaded from numba's on-disk cache), so the
    first request does not wait for it; logged at INFO on ``searchr1.server``.
    """
    limits = limits or ServerLimits()
    limits.validate()
    if warm_up and callable(getattr(retriever, "warm_up", None)):
        done = retriever.warm_up()
        if done:
            log.info("warm-up: %s", done)
    if num_documents is None and hasattr(retriever, "docs"):
        num_documents = len(retriever.docs)
    batcher = FairBatcher(retriever, limits.max_batch_queries)
    parse_pool: dict[str, ThreadPoolExecutor] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        parse_pool["pool"] = ThreadPoolExecutor(max_workers=2, thread_name_prefix="retrieval-parse")
        yield
        batcher.stop()
        parse_pool["pool"].shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="searchr1 retrieval",
        description="Search-R1-compatible retrieval API (POST /retrieve).",
        lifespan=lifespan,
    )
    app.state.batcher = batcher
    app.state.limits = limits
    app.add_middleware(AccessLog, enabled=access_log)
    bearer = HTTPBearer(auto_error=False)

    def check_key(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if api_key is None:
            return
        if creds is None or creds.scheme.lower() != "bearer":
            raise HTTPException(401, "missing bearer token: send 'Authorization: Bearer <key>'")
        if creds.credentials != api_key:
            raise HTTPException(401, "invalid API key")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        _note(request, error=str(exc.detail))
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default echoes the rejected input, which may not even serialise (NaN)
        parts = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]]
        _note(request, error="; ".join(parts))
        return JSONResponse({"detail": "invalid request: " + "; ".join(parts)}, status_code=422)

    @app.get("/health")
    async def health() -> dict:
        return {
            "status": "ok",
            "retriever": retriever.name,
            "documents": num_documents,
            "limits": asdict(limits),
        }

    def parse_and_check(body: bytes) -> tuple[list[str], int, bool]:
        return check_request(parse_json(body), limits, default_topk)

    @app.post(
        "/retrieve",
        response_model=RetrieveResponse,
        dependencies=[Depends(check_key)],
        openapi_extra=_retrieve_openapi(),
    )
    async def retrieve(request: Request) -> Response:
        try:
            body = await read_body(
                request.receive,
                request.headers.get("content-length"),
                limits.max_body_bytes,
                limits.body_timeout_s,
            )
            if len(body) <= INLINE_PARSE_BYTES:
                queries, topk, scores = parse_and_check(body)
            else:  # a large body is parsed off the event loop
                loop = asyncio.get_running_loop()
                queries, topk, scores = await loop.run_in_executor(parse_pool["pool"], parse_and_check, body)
        except RequestRejected as exc:
            return _rejected(request, exc)
        except ClientGone:
            _note(request, error="client disconnected before sending its whole body")
            return Response(status_code=400)
        _note(request, queries=len(queries), topk=topk)
        try:
            answer = await asyncio.wrap_future(batcher.submit(queries, topk, scores))
        except Exception as exc:
            message = f"search backend failed: {type(exc).__name__}: {exc}"
            _note(request, error=message)
            return JSONResponse({"detail": message}, status_code=503)
        # Server-Timing: wall and CPU milliseconds of the backend calls that answered this request
        timing = (
            f"search;dur={answer.search_wall_s * 1000:.2f}, search-cpu;dur={answer.search_cpu_s * 1000:.2f}"
        )
        return Response(content=answer.body, media_type="application/json", headers={"Server-Timing": timing})

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

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 32 << 20) and libc.mallopt(m_trim_threshold, 256 << 20))
    except (OSError, AttributeError):
        return False


def configure_logging(access: bool = True) -> None:
    """Server log lines to stderr: ``time LEVEL message`` (access lines at INFO unless ``access`` is off)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    server = logging.getLogger(SERVER_LOGGER)
    if not server.handlers:
        server.addHandler(handler)
    server.setLevel(logging.INFO)
    server.propagate = False
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.INFO if access else logging.WARNING)


def run_server(
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    limits: ServerLimits | None = None,
    default_topk: int = 3,
    num_documents: int | None = None,
    access_log: bool = True,
) -> None:
    """Serve in the foreground (``searchr1 serve``); the API key defaults to env SEARCHR1_API_KEY.

    Everything loaded so far (the index, the libraries) is moved out of the cyclic garbage collector's
    reach (``gc.freeze``): otherwise its periodic full collections walk the ~200k long-lived objects
    of the imported libraries and stall every request in flight. Measured with 64 clients on the
    wiki-18 sample (2 busy cores): full collections of 170-280 ms and p99 latency 277 ms without the
    freeze; 4-15 ms collections and p99 101 ms with it (p50 36-38 ms either way).
    """
    import gc

    import uvicorn

    api_key = api_key or os.environ.get(API_KEY_ENV) or None
    tune_malloc_for_search()
    gc.collect()
    gc.freeze()
    configure_logging(access_log)
    app = create_app(retriever, limits, api_key, default_topk, num_documents, access_log=access_log)
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)
