"""Dense index kinds and their streaming build: vectors on disk, the FAISS index filled in blocks.

Kinds (inner product on L2-normalised vectors = cosine), with their memory per passage at d dims:

- ``flat``: every vector, exact search (4d bytes; 768-d: 3,072 B; 21M passages: 64.5 GB).
- ``hnsw``: HNSW graph over the vectors (Malkov & Yashunin, 2018; 4d + ~8M bytes with M links).
- ``ivf``: inverted file over k-means cells (Jégou et al., 2011), vectors kept whole (4d + 8 bytes).
- ``ivfpq``: IVF whose vectors are product-quantised (Jégou, Douze & Schmid, 2011, "Product
  quantization for nearest neighbor search"): the residual to its cell's centre is cut into ``pq_m``
  sub-vectors of d/pq_m dims, each replaced by the nearest of 256 centroids learnt on a sample, so
  a vector costs ``pq_m`` bytes + an 8-byte id. Inner products are computed against the codes
  (asymmetric distance computation), so a query is never quantised.
- ``opq-ivfpq``: the same after a learnt rotation (OPQ; Ge et al., 2013, "Optimized product
  quantization") that balances variance across sub-vectors; same memory, slower to train.
- ``ivfpq-rerank``: IVF-PQ whose ``k x k_factor`` best candidates are re-scored exactly against the
  vectors kept in float16 in the same file and memory-mapped at serving time (FAISS ``IndexRefine``
  over ``SQfp16``): RAM holds the codes (``pq_m`` + 8 bytes a passage), the disk (page cache when
  there is memory to spare) 2d bytes more. PQ's ranking error is what keeps IVF-PQ's recall low on
  embeddings of high intrinsic dimension; re-scoring a few hundred candidates removes it.
- ``hnsw-sq8``: HNSW over 8-bit scalar-quantised vectors (d bytes + the graph).

The build takes vectors from any (n, d) float32 array -- a ``numpy.memmap`` of the vectors a build
encoded to disk, so nothing but the index itself needs to fit in memory -- trains the coarse
quantiser / codebooks on a random sample (``train_size`` rows) and adds vectors ``block`` at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from searchr1.retrieval.config import DENSE_INDEX_TYPES

KINDS = DENSE_INDEX_TYPES
IVF_KINDS = ("ivf", "ivfpq", "opq-ivfpq", "ivfpq-rerank")
PQ_KINDS = ("ivfpq", "opq-ivfpq", "ivfpq-rerank")


@dataclass
class DenseIndexSpec:
    """Which FAISS index to build and its build-time parameters (query-time ones: nprobe, efSearch)."""

    kind: str = "flat"
    nlist: int | None = None
    """IVF cells (default: 4 sqrt(n), at least 1, at most n / 39 so that k-means has 39 points a cell)."""
    pq_m: int | None = None
    """PQ bytes per vector (default d / 8; must divide d)."""
    hnsw_m: int = 32
    """HNSW links per node."""
    ef_construction: int = 80
    """HNSW candidate list while building."""
    train_size: int | None = None
    """Vectors sampled to train IVF / PQ / OPQ (default: 40 per cell and per PQ centroid, capped at n;
    FAISS asks for at least 39 per centroid)."""

    def validate(self, dim: int | None = None) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown dense index type {self.kind!r}; choose one of {', '.join(KINDS)}")
        if dim is not None and self.kind in PQ_KINDS and dim % self.code_bytes(dim):
            raise ValueError(f"pq_m={self.code_bytes(dim)} must divide the vector dimension {dim}")

    def cells(self, n: int) -> int:
        if self.nlist:
            return int(self.nlist)
        return int(max(1, min(int(4 * math.sqrt(n)), n // 39 or 1)))

    def code_bytes(self, dim: int) -> int:
        return int(self.pq_m or max(1, dim // 8))

    def factory(self, dim: int, n: int) -> str:
        """The ``faiss.index_factory`` string."""
        if self.kind == "flat":
            return "Flat"
        if self.kind == "hnsw":
            return f"HNSW{self.hnsw_m}"
        if self.kind == "hnsw-sq8":
            return f"HNSW{self.hnsw_m},SQ8"
        nlist, m = self.cells(n), self.code_bytes(dim)
        if self.kind == "ivf":
            return f"IVF{nlist},Flat"
        if self.kind == "ivfpq":
            return f"IVF{nlist},PQ{m}"
        if self.kind == "ivfpq-rerank":
            return f"IVF{nlist},PQ{m},Refine(SQfp16)"
        return f"OPQ{m},IVF{nlist},PQ{m}"

    def bytes_per_vector(self, dim: int) -> float:
        """Memory of one vector in the index (the graph of HNSW estimated as 2M links of 4 bytes at
        level 0 plus 1/M of that above), excluding per-index constants (centroids, codebooks); for
        ivfpq-rerank the codes only (its float16 vectors stay on disk: ``disk_bytes_per_vector``)."""
        graph = 4 * 2 * self.hnsw_m * (1 + 1 / self.hnsw_m)
        return {
            "flat": 4.0 * dim,
            "hnsw": 4.0 * dim + graph,
            "hnsw-sq8": 1.0 * dim + graph,
            "ivf": 4.0 * dim + 8,
            "ivfpq": self.code_bytes(dim) + 8.0,
            "opq-ivfpq": self.code_bytes(dim) + 8.0,
            "ivfpq-rerank": self.code_bytes(dim) + 8.0,
        }[self.kind]

    def disk_bytes_per_vector(self, dim: int) -> float:
        """Bytes of one vector in the index file."""
        return self.bytes_per_vector(dim) + (2.0 * dim if self.kind == "ivfpq-rerank" else 0.0)

    def training_rows(self, n: int) -> int:
        if self.kind not in (*IVF_KINDS, "hnsw-sq8"):
            return 0
        want = self.train_size or max(40 * self.cells(n), 40 * 256)
        return int(min(n, want))


BLAS_THRESHOLD = 20
"""Queries per call from which FAISS computes exhaustive distances with a matrix product (BLAS).
The wheel's default (128,000 here) keeps batches of 128 queries -- and IVF's assignment of a block
of 65,536 vectors to their cells -- on a loop of dot products: measured 150 queries/s at batch 128
on 100k x 384 Flat against 1,055 with BLAS, one thread."""


def tune_faiss() -> None:
    """Process-wide FAISS settings for batched search and block-wise building (see BLAS_THRESHOLD)."""
    import faiss

    faiss.cvar.distance_compute_blas_threshold = BLAS_THRESHOLD


def new_index(spec: DenseIndexSpec, dim: int, n: int):
    """An empty (untrained) FAISS inner-product index of ``spec`` for ``n`` vectors of ``dim``."""
    import faiss

    tune_faiss()
    spec.validate(dim)
    index = faiss.index_factory(dim, spec.factory(dim, n), faiss.METRIC_INNER_PRODUCT)
    if hasattr(index, "hnsw"):
        index.hnsw.efConstruction = spec.ef_construction
    if spec.kind in IVF_KINDS:
        ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
        if hasattr(ivf, "do_polysemous_training"):
            ivf.do_polysemous_training = False  # Hamming-code ordering for a filter not used here: slow
    return index


def training_sample(vectors: np.ndarray, rows: int, seed: int = 0) -> np.ndarray:
    """``rows`` vectors drawn without replacement, read in row order (cheap on a memmap)."""
    n = len(vectors)
    if rows >= n:
        return np.ascontiguousarray(vectors[:], dtype=np.float32)
    pick = np.sort(np.random.default_rng(seed).choice(n, size=rows, replace=False))
    out = np.empty((rows, vectors.shape[1]), dtype=np.float32)
    for start in range(0, rows, 65536):
        out[start : start + 65536] = vectors[pick[start : start + 65536]]
    return out


def fill_index(
    index,
    vectors: np.ndarray,
    start: int = 0,
    block: int = 65536,
    progress: Callable[[int], None] | None = None,
    checkpoint: Callable[[object, int], None] | None = None,
    checkpoint_every: int = 0,
) -> None:
    """Add ``vectors[start:]`` to ``index`` in blocks; ``progress(n)`` after each block with the
    vectors added so far, ``checkpoint(index, n)`` every ``checkpoint_every`` vectors (0: never)."""
    n = len(vectors)
    since = 0
    for lo in range(start, n, block):
        hi = min(n, lo + block)
        index.add(np.ascontiguousarray(vectors[lo:hi], dtype=np.float32))
        since += hi - lo
        if progress is not None:
            progress(hi)
        if checkpoint is not None and checkpoint_every and since >= checkpoint_every and hi < n:
            checkpoint(index, hi)
            since = 0


def build_from_vectors(
    vectors: np.ndarray, spec: DenseIndexSpec, seed: int = 0, progress: Callable[[int], None] | None = None
):
    """Train (on a sample) and fill a FAISS index of ``spec`` from an (n, d) float32 array or memmap."""
    n, dim = vectors.shape
    index = new_index(spec, dim, n)
    if not index.is_trained:
        index.train(training_sample(vectors, spec.training_rows(n), seed))
    fill_index(index, vectors, progress=progress)
    return index


def read_index(path: str, kind: str | None = None, mmap: bool = False):
    """Read a FAISS index; with ``mmap`` its vectors / codes (flat, hnsw: ``IO_FLAG_MMAP_IFC``) or
    inverted lists (IVF kinds: ``IO_FLAG_MMAP``) are memory-mapped from the file -- page cache shared
    by every process serving it -- instead of copied into the process (an HNSW graph is still read).
    ``ivfpq-rerank`` always maps its float16 vectors and reads its PQ codes into memory."""
    import faiss

    tune_faiss()
    flags = 0
    if kind == "ivfpq-rerank":
        mmap = True  # the float16 vectors for re-scoring are what must stay out of RAM
    if mmap and kind == "ivfpq-rerank":
        flags = getattr(faiss, "IO_FLAG_MMAP_IFC", 0)
    elif mmap and kind in IVF_KINDS:
        flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY
    elif mmap and hasattr(faiss, "IO_FLAG_MMAP_IFC"):
        flags = faiss.IO_FLAG_MMAP_IFC
    return faiss.read_index(str(path), flags)
