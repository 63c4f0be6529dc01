"""Dense search with the real bundled MiniLM encoder and FAISS flat / HNSW / IVF indexes."""

from __future__ import annotations

import numpy as np
import pytest

from searchr1.retrieval.corpus import Document
from searchr1.retrieval.dense import DenseRetriever, build_faiss_index, prefixes_for, set_search_params


def test_encoder_is_normalised_and_semantic(encoder):
    vecs = encoder.encode_queries(
        ["a large river flowing to the sea", "a stream of water", "a violin concerto"]
    )
    assert vecs.shape == (3, 384) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    sims = vecs @ vecs.T
    assert sims[0, 1] > sims[0, 2]  # river ~ stream, not violin
    assert encoder.label == "all-MiniLM-L6-v2" and encoder.query_prefix == ""


def test_semantic_search_over_paraphrases(encoder):
    docs = [
        Document("cat", "Cats", "Cats are small domesticated felines that purr."),
        Document("car", "Cars", "An automobile is a wheeled motor vehicle used for transport."),
        Document("sun", "Sun", "The Sun is the star at the centre of the Solar System."),
    ]
    r = DenseRetriever.from_documents(docs, encoder=encoder)
    results = r.search(
        ["kitten pet that purrs", "vehicle with an engine", "which star is closest to earth"], 2
    )
    assert [hits[0].id for hits in results] == ["cat", "car", "sun"]
    assert all(h[0].score >= h[1].score for h in results)


def test_finds_documents_by_name(dense, docs):
    results = dense.search([f"{d.title}" for d in docs[:30]], 5)
    found = sum(docs[i].id in [h.id for h in hits] for i, hits in enumerate(results))
    assert found >= 27  # invented names: dense is fuzzier than BM25 but should mostly find them


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_ann_indexes_agree_with_flat(kind):
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(20, 32))
    vecs = (centers[rng.integers(0, 20, 3000)] + 0.3 * rng.normal(size=(3000, 32))).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    queries = vecs[:100] + 0.05 * rng.normal(size=(100, 32)).astype(np.float32)
    flat = build_faiss_index(vecs, "flat")
    ann = build_faiss_index(vecs, kind)
    set_search_params(ann, nprobe=32, ef_search=128)
    _, exact = flat.search(queries, 5)
    _, approx = ann.search(queries, 5)
    recall = np.mean([len(set(a) & set(e)) / 5 for a, e in zip(approx, exact, strict=True)])
    assert recall >= 0.9
    with pytest.raises(ValueError, match="unknown dense index type"):
        build_faiss_index(vecs, "lsh")


def test_e5_models_get_prefixes():
    assert prefixes_for("/models/intfloat/e5-base-v2", {}) == ("query: ", "passage: ")
    assert prefixes_for("/models/all-MiniLM-L6-v2", {"query": "", "document": ""}) == ("", "")
    assert prefixes_for("/models/bge", {"query": "Represent this: ", "document": ""}) == (
        "Represent this: ",
        "",
    )


def test_save_load_roundtrip(tmp_path, dense, docs, encoder):
    from searchr1.retrieval.bm25.store import DocStore

    dense.save(tmp_path)
    DocStore.write(docs[:60], tmp_path)
    loaded = DenseRetriever.load(tmp_path, DocStore.open(tmp_path), encoder=encoder)
    queries = [docs[3].title, "a castle"]
    assert [[h.id for h in r] for r in loaded.search(queries, 3)] == [
        [h.id for h in r] for r in dense.search(queries, 3)
    ]
