"""Corpus jsonl reading (wiki-18 / FlashRAG and title/text forms) and chunking into passages.

    for doc in read_corpus("wiki-18.jsonl", chunk_size=100, overlap=20):
        doc.id, doc.title, doc.text

Accepted line forms:
    {"id": "0", "contents": "\\"Title\\"\\ntext"}     (wiki-18, FlashRAG; the title line may be unquoted)
    {"id": "0", "title": "Title", "text": "text"}
A malformed line raises ``CorpusError`` naming the file and line; with ``skip_bad_lines=True`` it is
skipped and counted instead (``CorpusReader.skipped`` / ``CorpusReader.bad_lines``). Malformed: not
JSON, no ``id`` or an empty one, no text or only whitespace (``contents`` and ``title`` + ``text``
alike), and, when the reader is given the ids seen so far (``CorpusReader.seen``, as index builds do),
an id an earlier line already used (the first line keeps it).

Streaming builds read the corpus in batches that end on line boundaries and note where they stopped,
so an interrupted build resumes at that byte offset (``CorpusReader.batches``, ``ReadPosition``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson


class CorpusError(ValueError):
    """A corpus file or line cannot be read; the message names the file and line number."""


@dataclass(frozen=True)
class Document:
    """One passage of the corpus."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """The wiki-18 form: quoted title on the first line, then the text."""
        return f'"{self.title}"\n{self.text}'


def split_contents(contents: str) -> tuple[str, str]:
    """Split wiki-18 ``contents`` into (title, text): the first line, stripped of its quotes, is the title."""
    first, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents
    title = first.strip()
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, rest


def parse_line(line: str) -> Document:
    """Parse one jsonl line into a ``Document``; raises ``ValueError`` with the reason."""
    try:
        row = orjson.loads(line)  # ~3x json's speed; what it refuses is read (or refused) by json
    except orjson.JSONDecodeError:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    if "id" not in row:
        raise ValueError("missing field 'id'")
    doc_id = row["id"]
    if not isinstance(doc_id, str | int) or isinstance(doc_id, bool):
        raise ValueError(f"field 'id' must be a string or integer, got {doc_id!r}")
    if str(doc_id).strip() == "":
        raise ValueError("field 'id' is empty")
    if "contents" in row:
        contents = row["contents"]
        if not isinstance(contents, str):
            raise ValueError("field 'contents' must be a string")
        title, text = split_contents(contents)
    elif "text" in row:
        title, text = row.get("title", ""), row["text"]
        if not isinstance(title, str) or not isinstance(text, str):
            raise ValueError("fields 'title' and 'text' must be strings")
    else:
        raise ValueError("needs either 'contents' or 'text' (with optional 'title')")
    if not (title.strip() or text.strip()):
        raise ValueError("empty 'contents' (nothing to index)" if "contents" in row else "empty 'title' and 'text'")
    return Document(str(doc_id), title, text)


def chunk_document(doc: Document, chunk_size: int, overlap: int = 0) -> list[Document]:
    """Split a document into passages of ``chunk_size`` words, consecutive passages sharing ``overlap``
    words; every passage keeps the title and gets the id ``{id}#{k}`` (a short document stays whole)."""
    if chunk_size <= 0:
        raise ValueError("chunk_size must be positive")
    if not 0 <= overlap < chunk_size:
        raise ValueError("overlap must satisfy 0 <= overlap < chunk_size")
    words = doc.text.split()
    if len(words) <= chunk_size:
        return [doc]
    step = chunk_size - overlap
    chunks = []
    for k, start in enumerate(range(0, len(words), step)):
        chunks.append(Document(f"{doc.id}#{k}", doc.title, " ".join(words[start : start + chunk_size])))
        if start + chunk_size >= len(words):
            break
    return chunks


@dataclass(frozen=True)
class ReadPosition:
    """Where a pass over a corpus file stands: the byte offset just after the last line read, that
    line's number, and how many lines were skipped as malformed so far."""

    offset: int = 0
    lineno: int = 0
    skipped: int = 0


@dataclass
class CorpusReader:
    """An iterable over a corpus file that remembers which lines it skipped.

    reader = CorpusReader("corpus.jsonl", skip_bad_lines=True)
    docs = list(reader); reader.skipped  # -> number of malformed lines
    """

    path: str | Path
    chunk_size: int | None = None
    overlap: int = 0
    skip_bad_lines: bool = False
    bad_lines: list[tuple[int, str]] = field(default_factory=list)
    """(line number, reason) for every skipped line of the last pass."""
    seen: Any = None
    """The ids read so far (``ids.SeenIds``): a line whose passage repeats one of them is malformed."""

    @property
    def skipped(self) -> int:
        return len(self.bad_lines)

    def __iter__(self) -> Iterator[Document]:
        self.bad_lines = []
        for docs, _ in self._lines(ReadPosition()):
            yield from docs

    def batches(
        self, max_passages: int, start: ReadPosition | None = None
    ) -> Iterator[tuple[list[Document], ReadPosition]]:
        """Passages in lists of about ``max_passages`` (a list ends with the last passage of a line,
        so it may be a little longer), each with the position after it; reading begins at ``start``
        (a position an earlier pass returned), whose skipped-line count carries on."""
        if max_passages <= 0:
            raise ValueError("max_passages must be positive")
        start = start or ReadPosition()
        self.bad_lines = []
        batch: list[Document] = []
        position, sent = start, None
        for docs, position in self._lines(start):
            batch.extend(docs)
            if len(batch) >= max_passages:
                yield batch, position
                batch, sent = [], position
        if batch or position != sent:  # the rest, or where a tail of skipped lines ends
            yield batch, position

    def _lines(self, start: ReadPosition) -> Iterator[tuple[list[Document], ReadPosition]]:
        """The passages of each line after ``start`` with the position after that line."""
        path = Path(self.path)
        if not path.is_file():
            raise CorpusError(f"corpus file not found: {path}")
        if self.chunk_size is not None:
            chunk_document(Document("", "", ""), self.chunk_size, self.overlap)  # validate early
        offset, lineno, skipped = start.offset, start.lineno, start.skipped
        with path.open("rb") as fh:
            fh.seek(offset)
            for raw in fh:
                lineno += 1
                offset += len(raw)
                try:
                    docs = parse_raw_line(raw, self.chunk_size, self.overlap)
                except (ValueError, UnicodeDecodeError) as exc:
                    reason = bad_line_reason(exc)
                    if not self.skip_bad_lines:
                        raise CorpusError(bad_line_message(path, lineno, reason)) from None
                    self.bad_lines.append((lineno, reason))
                    skipped += 1
                    yield [], ReadPosition(offset, lineno, skipped)
                    continue
                if self.seen is not None and docs:
                    repeat = repeated_id(self.seen, docs)
                    if repeat is not None:
                        if not self.skip_bad_lines:
                            raise CorpusError(repeated_id_message(path, lineno, repeat))
                        self.bad_lines.append((lineno, repeat_reason(repeat)))
                        skipped += 1
                        yield [], ReadPosition(offset, lineno, skipped)
                        continue
                    self.seen.add([d.id for d in docs])
                yield docs, ReadPosition(offset, lineno, skipped)


def parse_raw_line(raw: bytes, chunk_size: int | None = None, overlap: int = 0) -> list[Document]:
    """The passages of one corpus line (bytes, with or without its newline): none for a blank line;
    ``ValueError`` / ``UnicodeDecodeError`` for a malformed one (``bad_line_reason`` says why)."""
    line = raw.decode("utf-8")
    if not line.strip():
        return []
    doc = parse_line(line)
    return [doc] if chunk_size is None else chunk_document(doc, chunk_size, overlap)


def bad_line_reason(exc: Exception) -> str:
    return "invalid UTF-8" if isinstance(exc, UnicodeDecodeError) else str(exc)


def bad_line_message(path: str | Path, lineno: int, reason: str) -> str:
    return f"{path}:{lineno}: {reason} (pass --skip-bad-lines to skip and count such lines)"


def repeated_id(seen: Any, docs: list[Document]) -> tuple[str, int] | None:
    """(id, row of its first passage) of the first of a line's passages whose id was read before."""
    return next(((d.id, r) for d in docs if (r := seen.row_of(d.id)) is not None), None)


def repeat_reason(repeat: tuple[str, int]) -> str:
    return f"id {repeat[0]!r} repeats the id of passage {repeat[1]} (row {repeat[1]} of the index)"


def repeated_id_message(path: str | Path, lineno: int, repeat: tuple[str, int]) -> str:
    return (f"{path}:{lineno}: {repeat_reason(repeat)}; ids must be unique (pass --skip-bad-lines to skip "
            "and count such lines, keeping the first)")  # fmt: skip


def read_corpus(
    path: str | Path, chunk_size: int | None = None, overlap: int = 0, skip_bad_lines: bool = False
) -> CorpusReader:
    """Stream the documents of a jsonl corpus (see the module docstring); iterate the result.

    The returned ``CorpusReader`` is iterable and, after a pass, tells ``.skipped`` lines.
    """
    return CorpusReader(path, chunk_size, overlap, skip_bad_lines)


def write_corpus(docs: Iterable[Document], path: str | Path) -> Path:
    """Write documents as wiki-18 jsonl (``{"id", "contents"}``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for d in docs:
            fh.write(json.dumps({"id": d.id, "contents": d.contents}, ensure_ascii=False) + "\n")
    return path


def file_sha256(path: str | Path) -> str:
    """Checksum of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
