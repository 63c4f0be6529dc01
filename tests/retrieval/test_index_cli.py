"""Index folders and the `searchr1 index build / search / serve` commands."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from searchr1.cli import main
from searchr1.retrieval.index import IndexLoadError, Manifest, build_index, load_index


def test_build_writes_manifest_and_loads(corpus_file, docs, tmp_path):
    m = build_index(corpus_file, tmp_path / "idx", show_progress=False)
    on_disk = Manifest.read(tmp_path / "idx")
    assert on_disk == m
    assert m.retriever == "bm25" and m.num_documents == len(docs) and len(m.corpus_sha256) == 64 and m.created
    r = load_index(tmp_path / "idx", corpus=corpus_file)
    assert r.search([docs[11].title], 1)[0][0].id == docs[11].id


def test_mismatched_corpus_or_model_is_a_clear_error(corpus_file, tmp_path):
    build_index(corpus_file, tmp_path / "idx", show_progress=False)
    other = tmp_path / "other.jsonl"
    other.write_text(corpus_file.read_text().replace("castle", "fortress"))
    with pytest.raises(IndexLoadError, match="built from a different corpus"):
        load_index(tmp_path / "idx", corpus=other)
    with pytest.raises(IndexLoadError, match="bm25 index; it has no encoder"):
        load_index(tmp_path / "idx", model="some/encoder")
    with pytest.raises(IndexLoadError, match="not an index folder"):
        load_index(tmp_path)
    (tmp_path / "idx" / "docs.frames.npy").unlink()  # the passage store's offset table
    with pytest.raises(IndexLoadError, match="incomplete"):
        load_index(tmp_path / "idx")


def test_dense_index_records_model_and_refuses_another(corpus_file, tmp_path, encoder):
    small = tmp_path / "small.jsonl"
    small.write_text("".join(corpus_file.read_text().splitlines(keepends=True)[:20]))
    m = build_index(
        small, tmp_path / "dense", retriever="dense", index_type="hnsw", show_progress=False, device="cpu"
    )
    assert m.model == "all-MiniLM-L6-v2" and m.params["index_type"] == "hnsw"
    with pytest.raises(
        IndexLoadError, match="built with encoder 'all-MiniLM-L6-v2', not 'intfloat/e5-base-v2'"
    ):
        load_index(tmp_path / "dense", model="intfloat/e5-base-v2")


def test_a_dense_index_built_with_a_relative_encoder_path_loads_from_anywhere(
    corpus_file, docs, tmp_path, monkeypatch
):
    import shutil

    from searchr1.retrieval.dense import default_model_path, model_label

    work = tmp_path / "work"
    shutil.copytree(default_model_path(), work / "enc")  # a local encoder folder, not the bundled one
    small = tmp_path / "small.jsonl"
    small.write_text("".join(corpus_file.read_text().splitlines(keepends=True)[:20]))
    monkeypatch.chdir(work)
    m = build_index(
        small, tmp_path / "dense", retriever="dense", model="enc", show_progress=False, device="cpu"
    )
    assert m.model == str((work / "enc").resolve())
    monkeypatch.chdir(tmp_path)  # another working directory: "enc" means nothing here
    retriever = load_index(tmp_path / "dense")  # the encoder named by the manifest
    assert retriever.search([docs[3].title], 1)[0][0].id == docs[3].id
    load_index(tmp_path / "dense", model="work/enc")  # the same folder spelled from here: accepted
    with pytest.raises(IndexLoadError, match="built with encoder"):
        load_index(tmp_path / "dense", model="all-MiniLM-L6-v2")  # same weights, another encoder name
    # a link keeps its own name (the name chooses e5's query/passage prefixes), not its target's
    (work / "e5-link").symlink_to(work / "enc")
    assert model_label("work/e5-link") == str(work / "e5-link")


def test_chunked_build_and_skip_bad_lines(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        json.dumps({"id": "long", "title": "Long", "text": " ".join(f"w{i}" for i in range(30))})
        + "\n{broken\n"
    )
    with pytest.raises(ValueError, match=r"c\.jsonl:2"):
        build_index(corpus, tmp_path / "a", show_progress=False)
    m = build_index(
        corpus, tmp_path / "b", chunk_size=10, overlap=2, skip_bad_lines=True, show_progress=False
    )
    assert m.num_documents == 4 and m.skipped_lines == 1 and m.chunk_size == 10


def test_cli_build_and_search(corpus_file, docs, tmp_path, capsys):
    out = tmp_path / "idx"
    assert (
        main(["index", "build", "--retriever", "bm25", "--corpus", str(corpus_file), "--out", str(out)]) == 0
    )
    assert f"indexed {len(docs)} passages" in capsys.readouterr().out
    assert main(["search", "--index", str(out), "--topk", "2", docs[7].title]) == 0
    text = capsys.readouterr().out
    assert "1. [" in text and f"{docs[7].title} (id {docs[7].id})" in text
    assert main(["search", "--index", str(out), "--json", docs[8].title, docs[9].title]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert [h[0]["id"] for h in hits] == [docs[8].id, docs[9].id]
    assert main(["search", "--corpus", str(corpus_file), "--json", "--topk", "1", docs[1].title]) == 0
    assert json.loads(capsys.readouterr().out)[0][0]["id"] == docs[1].id


def test_cli_errors_are_clean(corpus_file, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "contents": "x"}\nnot json\n')
    assert main(["index", "build", "--corpus", str(bad), "--out", str(tmp_path / "x")]) == 2
    assert "bad.jsonl:2: invalid JSON" in capsys.readouterr().err
    assert main(["search", "--index", str(tmp_path / "missing"), "q"]) == 2
    assert "index folder not found" in capsys.readouterr().err
    out = tmp_path / "idx"
    main(["index", "build", "--corpus", str(corpus_file), "--out", str(out)])
    assert main(["search", "--index", str(out), "--corpus", str(bad), "q"]) == 2
    assert "different corpus" in capsys.readouterr().err
    assert main(["search", "--index", str(out), "--set", "retrieval.topk=zero", "q"]) == 2
    assert "retrieval.topk" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_serve_subprocess(corpus_file, docs, tmp_path):
    out = tmp_path / "idx"
    build_index(corpus_file, out, show_progress=False)
    port = _free_port()
    env = {**os.environ, "SEARCHR1_API_KEY": "k1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "searchr1.cli", "serve", "--index", str(out), "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
        payload = {"queries": [docs[3].title], "topk": 1}
        assert httpx.post(f"{url}/retrieve", json=payload).status_code == 401
        ok = httpx.post(f"{url}/retrieve", json=payload, headers={"Authorization": "Bearer k1"}).json()
        assert ok["result"][0][0]["id"] == docs[3].id
    finally:
        proc.terminate()
        proc.wait(timeout=20)
