"""Dense index kinds built block by block from vectors on disk, read back in memory or memory-mapped."""

from __future__ import annotations

import numpy as np
import pytest

from searchr1.bench.retrieval_scale import VectorModel, exact_top, recall_at
from searchr1.retrieval.config import DENSE_INDEX_TYPES
from searchr1.retrieval.dense import set_search_params
from searchr1.retrieval.dense_build import DenseIndexSpec, build_from_vectors, read_index


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """3,000 clustered 32-d unit vectors in a raw file read through a memmap, 100 queries, exact top-3."""
    model = VectorModel(dim=32, seed=0, topics=64)
    vectors = model.rows(0, 3000)
    path = tmp_path_factory.mktemp("vec") / "v.f32"
    vectors.tofile(path)
    mapped = np.memmap(path, dtype=np.float32, mode="r", shape=vectors.shape)
    queries = model.queries(vectors, 100, seed=1)
    return mapped, queries, exact_top(vectors, queries, 3)


@pytest.mark.parametrize("kind", DENSE_INDEX_TYPES)
def test_each_kind_builds_from_a_memmap_and_reads_back_the_same(tmp_path, data, kind):
    vectors, queries, exact = data
    spec = DenseIndexSpec(kind, nlist=16, pq_m=8, hnsw_m=8, ef_construction=40)
    index = build_from_vectors(vectors, spec)
    assert index.ntotal == len(vectors)
    set_search_params(index, nprobe=16, ef_search=128, rerank=32)
    _, ids = index.search(queries, 3)
    import faiss

    faiss.write_index(index, str(tmp_path / "i.faiss"))
    for mmap in (False, True):
        again = read_index(tmp_path / "i.faiss", kind, mmap=mmap)
        set_search_params(again, nprobe=16, ef_search=128, rerank=32)
        assert np.array_equal(again.search(queries, 3)[1], ids)
    floor = {"flat": 1.0, "ivf": 0.99, "hnsw": 0.9, "hnsw-sq8": 0.85, "ivfpq-rerank": 0.9, "ivfpq": 0.2,
             "opq-ivfpq": 0.2}  # fmt: skip
    assert recall_at(ids, exact, 3) >= floor[kind]


def test_rescoring_recovers_what_product_quantisation_loses(data):
    vectors, queries, exact = data
    plain = build_from_vectors(vectors, DenseIndexSpec("ivfpq", nlist=16, pq_m=4))
    rerank = build_from_vectors(vectors, DenseIndexSpec("ivfpq-rerank", nlist=16, pq_m=4))
    set_search_params(plain, nprobe=16)
    set_search_params(rerank, nprobe=16, rerank=1)
    same = np.sort(rerank.search(queries, 3)[1], axis=1) == np.sort(plain.search(queries, 3)[1], axis=1)
    assert same.all()  # the same candidates (the same codes), only re-ordered by their exact scores
    set_search_params(rerank, nprobe=16, rerank=64)
    with_rescoring = recall_at(rerank.search(queries, 3)[1], exact, 3)
    assert with_rescoring > recall_at(plain.search(queries, 3)[1], exact, 3) + 0.2 and with_rescoring > 0.95


def test_opq_learns_a_rotation_that_beats_plain_pq_on_unbalanced_vectors():
    import faiss

    # variance concentrated in the first coordinates, i.e. in PQ's first sub-vector: plain PQ spends
    # three of its four codebooks on little; OPQ's rotation spreads the variance over the four
    rng = np.random.default_rng(0)
    scale = np.arange(1, 33) ** -1.0
    vectors = (rng.standard_normal((3000, 32)) * scale).astype(np.float32)
    queries = (vectors[:100] + 0.3 * rng.standard_normal((100, 32)) * scale).astype(np.float32)
    exact = exact_top(vectors, queries, 3)
    plain = build_from_vectors(vectors, DenseIndexSpec("ivfpq", nlist=4, pq_m=4))
    opq = build_from_vectors(vectors, DenseIndexSpec("opq-ivfpq", nlist=4, pq_m=4))
    assert isinstance(opq, faiss.IndexPreTransform)  # the learnt rotation in front of IVF-PQ
    rotation = faiss.downcast_VectorTransform(opq.chain.at(0))
    assert isinstance(rotation, faiss.OPQMatrix) and rotation.is_trained
    r = faiss.vector_to_array(rotation.A).reshape(32, 32)
    assert np.allclose(r @ r.T, np.eye(32), atol=1e-3) and not np.allclose(r, np.eye(32), atol=0.1)
    for index in (plain, opq):
        set_search_params(index, nprobe=4)
    with_opq, without = (recall_at(i.search(queries, 3)[1], exact, 3) for i in (opq, plain))
    assert with_opq > without + 0.2  # measured 0.72 against 0.32


def test_memory_per_passage_and_defaults():
    assert DenseIndexSpec("ivfpq").bytes_per_vector(768) == 96 + 8  # d / 8 code bytes + the id
    assert DenseIndexSpec("ivfpq-rerank", pq_m=96).disk_bytes_per_vector(768) == 104 + 1536
    assert DenseIndexSpec("ivfpq", nlist=None).cells(21_000_000) == int(4 * 21_000_000**0.5)
    assert DenseIndexSpec("ivf").cells(1000) == 25  # at most n / 39: k-means has 39 points a cell
    assert DenseIndexSpec("ivfpq", nlist=1024).training_rows(10**7) == 40 * 1024
    assert (
        DenseIndexSpec("ivfpq-rerank", nlist=64, pq_m=16).factory(128, 10**5) == "IVF64,PQ16,Refine(SQfp16)"
    )
    with pytest.raises(ValueError, match="must divide"):
        DenseIndexSpec("ivfpq", pq_m=7).validate(768)
    with pytest.raises(ValueError, match="unknown dense index type"):
        DenseIndexSpec("lsh").validate()
