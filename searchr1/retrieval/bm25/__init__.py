"""BM25 lexical search over blocks of postings, in memory or memory-mapped from disk.

BM25 (Robertson & Zaragoza, 2009, "The Probabilistic Relevance Framework: BM25 and Beyond"):

    score(q, d) = sum_{t in q} IDF(t) * tf(t,d) / (tf(t,d) + k1 * (1 - b + b * |d| / avgdl))

in the Lucene variant (the default; Lucene drops the constant (k1 + 1) factor of Robertson's form) with
``IDF(t) = log(1 + (N - df + 0.5) / (df + 0.5))``. ``method``: lucene | robertson | atire | bm25l | bm25+,
as in bm25s (Lù 2024, arXiv:2407.03618; the variants as in Kamphuis et al., ECIR 2020).

The defaults are Search-R1's retriever, pyserini's ``LuceneSearcher`` (preset ``pyserini``): k1 0.9,
b 0.4, Lucene's English analyzer (``analysis``), and |d| as Lucene stores it, in one byte
(``lucene_norm``), with Lucene's float32 arithmetic (``term_scores``), so rankings match Lucene's. The
settings of earlier versions are preset ``bm25s`` (k1 1.5, b 0.75, a regex tokenizer, a Snowball
stemmer, exact lengths). Each term's postings (the documents holding it, ascending, with its term
frequency or its score) form a column; a query is a sum of a few columns and a top-k; a query term
repeated n times is one clause boosted by n, as Anserini's
bag-of-words query builds it (``scoring.boosted_scores``: ``w - w / (1 + tf inv)`` with
``w = float32(n idf)``).

Top-k is exact, computed by a compiled kernel (``kernel``: document-at-a-time MaxScore with
bounds per block and per superblock of 32 blocks, Turtle & Flood 1995, Chakrabarti et al. 2011 and
Ding & Suel 2011) that releases the GIL, so a batch is
searched on ``threads`` threads (``BM25Retriever(..., threads=N)``, ``set_threads``, ``serve
--threads``). Passages are visited in row order and only those that can still enter the top k are
scored; the hits are the k best by float32 score then row (and every passage tied with the k-th when
Anserini's tie order follows).

    bm25 = BM25Retriever.from_documents(docs)              # in process, nothing written
    bm25.search(["who founded Acme"], topk=3)

On disk (``folder/bm25``), format 3: postings in blocks of 128 (``blocks``, ``postings``):
``postings.u32.npy`` (full blocks bit-packed with a frame of reference: row gaps and, with Lucene's
settings, term frequencies, the score computed at query time from it and the passage's norm; a
column's shorter last block as varints; other settings keep ``scores.f32.npy``),
``blocks.offsets.npy`` / ``blocks.ptr.npy`` / ``blocks.last.npy`` / ``blocks.max.npy`` (each block's
first word, each column's first block, each block's last row and largest score),
``superblocks.last.npy`` / ``superblocks.max.npy`` (the same bounds one level up, per 32 blocks:
``bounds``),
``indptr.csc.index.npy`` (each column's first posting), ``term_max.npy`` (each column's largest
score), ``vocab.hash.npy`` + ``vocab.ids.npy``
(sorted 64-bit hashes of the terms and their column ids: a term is found by binary search in a memory
map, so serving 10M terms costs neither a dictionary in memory nor seconds of loading), ``vocab.txt``
(the terms, one per line in column order, for people), ``norms.npy`` (Lucene's one-byte norm a
passage), ``id_keys.npy`` (8 bytes a passage: the ids'
text order, for Anserini's order of tied hits), ``params.index.json`` (with N, avgdl, the layout and
each file's size and CRC-32, checked at load), ``tokenizer.json`` (the settings). Columns are in the
order of the terms' hashes (``build``). Format 2 (the previous version: varint blocks,
``postings.u8.npy``) is refused in one line that names the command rebuilding it. Format 1 (the
earliest versions and ``save``): ``data.csc.index.npy`` / ``indices.csc.index.npy`` (float32 scores
and int32 rows, bm25s's names) instead of the blocks; still read, the block bounds computed at load.
Folders written by earlier versions (bm25s's ``vocab.index.json``; no ``analyzer`` setting) still load.

The modules, in the order data flows through them:

``analysis``     words, stop words and stems (Lucene's EnglishAnalyzer, or the regex analyzer)
``params``       the settings and presets saved with an index
``first_pass``   a build's first pass, chunk by chunk on worker processes: parse, analyse, compress
``build``        sorted runs spilled to disk and merged in bounded memory into the index files
``scoring``      the formulas: IDF, term-frequency factors, Lucene's norms and float32 arithmetic
``bitpack``      frame-of-reference bit packing of 128 values in 4 interleaved lanes
``blocks``       one block's words: bit-packed full blocks, varint tails
``postings``     a whole index's posting blocks: encoded, decoded, checked
``bounds``       score bounds per superblock of 32 blocks, and their check
``kernel``       the compiled top-k (block-max MaxScore, without the GIL)
``vocabulary``   term hashes; term -> column
``files``        the folder on disk: names, checksums, loading
``store``        the passage store (zstd frames), shared by every local index
``retriever``    ``BM25Retriever``: search in memory or over a folder
``errors``       what a damaged index raises, and the rebuild command
"""

from __future__ import annotations

from searchr1.retrieval.bm25.files import (
    BM25_DIR,
    DATA_FILE,
    INDICES_FILE,
    INDPTR_FILE,
    LEGACY_VOCAB_FILE,
    NONOCCURRENCE_FILE,
    PARAMS_FILE,
    TERM_MAX_FILE,
    TOKENIZER_FILE,
    ScoreMatrix,
    load_matrix,
    write_params,
)
from searchr1.retrieval.bm25.params import DOC_LENGTHS, METHODS, NONOCCURRENCE_METHODS, PRESETS, BM25Params
from searchr1.retrieval.bm25.retriever import BM25Retriever
from searchr1.retrieval.bm25.scoring import (
    LUCENE_LENGTHS,
    doc_length_values,
    idf,
    idf_array,
    lucene_length,
    lucene_norm,
    term_scores,
    tf_component,
)
from searchr1.retrieval.bm25.vocabulary import (
    VOCAB_HASH_FILE,
    VOCAB_IDS_FILE,
    VOCAB_TEXT_FILE,
    DictVocabulary,
    HashedVocabulary,
    hash_terms,
    term_hash,
    write_vocabulary,
)

__all__ = [
    "BM25_DIR",
    "DATA_FILE",
    "DOC_LENGTHS",
    "INDICES_FILE",
    "INDPTR_FILE",
    "LEGACY_VOCAB_FILE",
    "LUCENE_LENGTHS",
    "METHODS",
    "NONOCCURRENCE_FILE",
    "NONOCCURRENCE_METHODS",
    "PARAMS_FILE",
    "PRESETS",
    "TERM_MAX_FILE",
    "TOKENIZER_FILE",
    "VOCAB_HASH_FILE",
    "VOCAB_IDS_FILE",
    "VOCAB_TEXT_FILE",
    "BM25Params",
    "BM25Retriever",
    "DictVocabulary",
    "HashedVocabulary",
    "ScoreMatrix",
    "doc_length_values",
    "hash_terms",
    "idf",
    "idf_array",
    "load_matrix",
    "lucene_length",
    "lucene_norm",
    "term_hash",
    "term_scores",
    "tf_component",
    "write_params",
    "write_vocabulary",
]
