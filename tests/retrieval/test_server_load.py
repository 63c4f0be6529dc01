"""The server under bounded concurrent load on loopback: 64 clients, thousands of requests."""

from __future__ import annotations

import random
import threading

from searchr1.retrieval.client import RetrievalClient
from searchr1.retrieval.server import create_app, serve_in_thread

CLIENTS = 64
REQUESTS_PER_CLIENT = 40


def test_64_concurrent_clients_zero_errors_every_answer_correct(bm25, docs):
    expected = {
        d.title: [h.id for h in hits]
        for d, hits in zip(docs, bm25.search([d.title for d in docs], 3), strict=True)
    }
    errors: list[str] = []
    answered = [0] * CLIENTS
    with serve_in_thread(create_app(bm25)) as (url, _):
        app_batcher_calls = []

        def client_loop(c: int) -> None:
            rng = random.Random(c)
            client = RetrievalClient(url, timeout_s=30, retries=0)
            try:
                for _ in range(REQUESTS_PER_CLIENT):
                    titles = [rng.choice(docs).title for _ in range(rng.randint(1, 4))]
                    results = client.search(titles, 3)
                    for title, hits in zip(titles, results, strict=True):
                        got = [h.id for h in hits]
                        if got != expected[title]:
                            errors.append(f"client {c}: {title!r} -> {got}, expected {expected[title]}")
                    answered[c] += 1
            except Exception as exc:
                errors.append(f"client {c}: {type(exc).__name__}: {exc}")
            finally:
                client.close()

        threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        app_batcher_calls.append(1)
    assert errors == []
    assert sum(answered) == CLIENTS * REQUESTS_PER_CLIENT
