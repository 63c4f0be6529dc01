"""The compressed passage store: round trips, random access, wire fragments, damage refused in one line,
the dictionary trained the same way every time, and the earlier JSON-lines store still loading."""

from __future__ import annotations

import json
import zlib

import numpy as np
import orjson
import pytest

from searchr1.retrieval.base import Hit
from searchr1.retrieval.bm25.errors import DamagedIndex
from searchr1.retrieval.bm25.store import (
    DICT_FILE,
    FRAMES_FILE,
    STORE_FILE,
    STORE_META,
    CompressedDocStore,
    DocStore,
    DocStoreWriter,
    MappedDocStore,
    decode_record,
    encode_record,
    sample_dictionary,
    write_jsonl_store,
)
from searchr1.retrieval.corpus import Document, write_corpus
from searchr1.retrieval.index import IndexLoadError, build_index, load_index
from searchr1.retrieval.wire import HitEncoder

ODD = [
    Document("0", "Plain", "a passage"),
    Document("1", "", "no title"),
    Document("2", 'A "quoted" title', 'text with "quotes" and \\ backslashes'),
    Document("3", "Two\nlines", "the title holds a newline\nand so does the text\n"),
    Document("4", " padded ", "  "),
    Document("5", "Ünïcödé — 東京", "emoji 🙂 and \u2028 separators \x00 and controls \t"),
    Document("6", "Surrogate \ud800 title", "a lone \udc00 surrogate, as a corpus escape can hold"),
    Document("x" * 300, "long id", "an id longer than the 512 bytes read for ids in store format 1? no, 300"),
]


def _docs(n: int, seed: int = 0) -> list[Document]:
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(500)]
    return [Document(f"d{i}", f"Title {i % 13}", " ".join(words[j] for j in rng.integers(0, 500, rng.integers(1, 200))))
            for i in range(n)]  # fmt: skip


def test_a_record_gives_back_the_passage_exactly_and_its_wire_fragment():
    for d in ODD:
        doc, wire = decode_record(encode_record(d))
        assert doc == d
        assert b"\n" not in encode_record(d)
        assert json.loads(wire) == {"id": d.id, "contents": d.contents}


@pytest.mark.parametrize("trained", [True, False])
def test_the_store_round_trips_in_random_order_across_chunks(tmp_path, trained):
    docs = ODD + _docs(500)
    dictionary = sample_dictionary(docs) if trained else None
    if trained:
        assert dictionary is not None and sample_dictionary(docs) == dictionary  # reproducible
    writer = DocStoreWriter(tmp_path, dictionary=dictionary)
    for lo in range(0, len(docs), 37):  # chunks of 37, as a build appends them
        writer.add_docs(docs[lo : lo + 37])
    assert writer.close() == len(docs)
    assert (tmp_path / DICT_FILE).is_file() == trained
    store = DocStore.open(tmp_path)
    assert isinstance(store, CompressedDocStore) and len(store) == len(docs)
    order = np.random.default_rng(1).permutation(len(docs))
    assert [store[int(r)] for r in order] == [docs[int(r)] for r in order]
    assert [store.doc_id(r) for r in range(len(docs))] == [d.id for d in docs]
    with pytest.raises(IndexError):
        store[len(docs)]
    raw = sum(len(encode_record(d)) for d in docs)
    assert (tmp_path / STORE_FILE).stat().st_size < raw / (2 if trained else 1.3)  # compressed
    store.close()


def test_the_wire_fragment_is_what_the_server_would_encode(tmp_path):
    DocStore.write(ODD, tmp_path)
    store = DocStore.open(tmp_path)
    plain, stored = HitEncoder(), HitEncoder()
    for row, d in enumerate(ODD):
        doc, wire = store.with_wire(row)
        assert doc == d and wire is not None
        bare = Hit(d.id, d.title, d.text, 1.5)
        carried = Hit(doc.id, doc.title, doc.text, 1.5, wire)
        assert carried == bare and carried.to_dict() == bare.to_dict()
        assert stored.encode([carried], True) == plain.encode([bare], True)
        assert stored.encode([carried], False) == plain.encode([bare], False)
        if "\ud800" not in d.title and "\udc00" not in d.text:
            assert orjson.loads(wire)["contents"] == d.contents


@pytest.mark.parametrize("damage", ["flip", "truncate", "table"])
def test_a_damaged_block_is_refused_in_one_line_that_says_how_to_rebuild(tmp_path, damage):
    docs = _docs(200, 3)
    corpus = write_corpus(docs, tmp_path / "c.jsonl")
    idx = tmp_path / "idx"
    build_index(corpus, idx, chunk_passages=64, show_progress=False)
    path = idx / STORE_FILE
    table = np.load(idx / FRAMES_FILE)
    raw = bytearray(path.read_bytes())
    if damage == "flip":  # a byte inside passage 3's frame: the codec's checksum fails
        raw[(int(table[3]) + int(table[4])) // 2] ^= 0x40
        path.write_bytes(bytes(raw))
        r = load_index(idx)  # the frames are checked when read
        assert r.docs[2] == docs[2] and r.docs[4] == docs[4]
        with pytest.raises(DamagedIndex) as err:
            r.docs[3]
        message = str(err.value)
        assert "\n" not in message and "passage 3's frame" in message and "searchr1 index build" in message
        return
    if damage == "truncate":
        path.write_bytes(bytes(raw[:-10]))
    else:
        t = table.copy()
        t[2] += 1
        np.save(idx / FRAMES_FILE, t)
    with pytest.raises(IndexLoadError) as err:
        load_index(idx)
    message = str(err.value)
    assert "\n" not in message and "passage store" in message
    assert f"searchr1 index build --corpus {corpus.resolve()} --out {idx}" in message


def test_a_damaged_block_fails_the_search_with_one_line(tmp_path):
    docs = _docs(100, 4)
    idx = tmp_path / "idx"
    build_index(write_corpus(docs, tmp_path / "c.jsonl"), idx, show_progress=False)
    table = np.load(idx / FRAMES_FILE)
    raw = bytearray((idx / STORE_FILE).read_bytes())
    for row in range(len(table) - 1):  # every passage damaged
        raw[(int(table[row]) + int(table[row + 1])) // 2] ^= 0x01
    (idx / STORE_FILE).write_bytes(bytes(raw))
    r = load_index(idx)
    with pytest.raises(DamagedIndex) as err:
        r.search([docs[5].text], 1)
    message = str(err.value)
    assert "\n" not in message and "is damaged: passage" in message and "searchr1 index build" in message


def test_the_table_and_metadata_are_checked_at_load(tmp_path):
    DocStore.write(_docs(100), tmp_path)
    meta = json.loads((tmp_path / STORE_META).read_text())
    assert meta["frames_crc32"] == zlib.crc32((tmp_path / FRAMES_FILE).read_bytes())
    assert meta["dict_crc32"] == zlib.crc32((tmp_path / DICT_FILE).read_bytes())
    meta["format"] = 9
    (tmp_path / STORE_META).write_text(json.dumps(meta))
    with pytest.raises(DamagedIndex, match="format 9"):
        DocStore.open(tmp_path)


def _refusal(folder) -> str:
    with pytest.raises(DamagedIndex) as err:
        DocStore.open(folder)
    message = str(err.value)
    assert "\n" not in message and "searchr1 index build" in message
    return message


@pytest.mark.parametrize("damage", ["no table", "meta a list", "meta without count", "extra offset", "descending"])
def test_each_damage_of_the_table_or_metadata_is_named_in_one_line(tmp_path, damage):
    """Checks behind the CRC-32: a table rewritten with a matching checksum (by hand, or by a tool
    that recomputes it) and files that are gone or of the wrong shape."""
    DocStore.write(_docs(100), tmp_path)
    meta, table = json.loads((tmp_path / STORE_META).read_text()), np.load(tmp_path / FRAMES_FILE)

    def save_table(t: np.ndarray) -> None:
        np.save(tmp_path / FRAMES_FILE, t)
        meta["frames_crc32"] = zlib.crc32((tmp_path / FRAMES_FILE).read_bytes())
        (tmp_path / STORE_META).write_text(json.dumps(meta))

    if damage == "no table":
        (tmp_path / FRAMES_FILE).unlink()
        assert f"{FRAMES_FILE} is missing" in _refusal(tmp_path)
    elif damage == "meta a list":
        (tmp_path / STORE_META).write_text("[1, 2]")
        assert "does not say how many passages" in _refusal(tmp_path)
    elif damage == "meta without count":
        (tmp_path / STORE_META).write_text(json.dumps({k: v for k, v in meta.items() if k != "passages"}))
        assert "does not say how many passages" in _refusal(tmp_path)
    elif damage == "extra offset":
        save_table(np.append(table, table[-1]))
        assert "has 102 offsets for 100 passages" in _refusal(tmp_path)
    else:
        t = table.copy()
        t[5], t[6] = t[6], t[5]
        save_table(t)
        assert f"{FRAMES_FILE} does not ascend" in _refusal(tmp_path)


def test_an_index_with_the_earlier_json_lines_store_still_loads_and_answers_the_same(tmp_path):
    docs = [ODD[i] for i in (0, 1, 2, 4, 5)] + _docs(300, 5)  # what a corpus line gives back exactly
    corpus = write_corpus(docs, tmp_path / "c.jsonl")
    new = tmp_path / "new"
    build_index(corpus, new, chunk_passages=100, show_progress=False)
    old = tmp_path / "old"
    old.mkdir()
    for name in ("manifest.json", "bm25"):  # the same index with the store of earlier versions
        src = new / name
        if src.is_dir():
            (old / name).mkdir()
            for f in src.iterdir():
                (old / name / f.name).write_bytes(f.read_bytes())
        else:
            (old / name).write_bytes(src.read_bytes())
    write_jsonl_store(docs, old)
    a, b = load_index(new), load_index(old)
    assert isinstance(b.docs, MappedDocStore) and isinstance(a.docs, CompressedDocStore)
    queries = [" ".join(d.text.split()[:5]) for d in docs[6::7]] + ["Plain passage", "quoted title"]
    hits_old, hits_new = b.search(queries, 5), a.search(queries, 5)
    assert hits_old == hits_new and all(h.wire is None for q in hits_old for h in q)
    assert all(h.wire is not None for q in hits_new for h in q)
    enc_old, enc_new = HitEncoder(), HitEncoder()
    assert [enc_old.encode(h, True) for h in hits_old] == [enc_new.encode(h, True) for h in hits_new]
    assert [b.docs.doc_id(r) for r in range(len(docs))] == [d.id for d in docs]
