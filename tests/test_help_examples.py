"""Every example printed by ``--help`` parses with its command's own parser and names only files and
folders that exist: ones an example creates (``data synth --out``, ``index build --out``, a training
run's checkpoints, ``eval --out``, ...) or ones that ship with the package (the shipped configs, the
``shared/data/flashrag-sample`` files beside the repository)."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from searchr1.cli import build_parser
from searchr1.config import load_config, shipped_config

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {".jsonl", ".json", ".parquet", ".yaml", ".yml", ".txt", ".py", ".html", ".gguf"}
LOCAL_ROOTS = ("data", "runs", "indexes", "eval", "export", "shared", "benchmarks", ".", "..")


# -- reading the examples --------------------------------------------------------------------------


def parsers(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(command words, parser) for the top-level parser and every subcommand, depth first."""
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*prefix, name))


def example_lines(text: str) -> list[str]:
    """The ``searchr1 ...`` command lines of a help text (continuations joined, comments dropped)."""
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if pending:
            line = pending + " " + line
            pending = ""
        if line.endswith("\\"):
            pending = line[:-1].strip()
            continue
        words = line.split()
        if "searchr1" not in words[:4] and not line.startswith("searchr1 "):
            continue
        line = re.split(r"\s{2,}[#(]", line)[0]  # "   (what it does)" / "   # what it does"
        out.append(line.strip())
    return out


def argv_of(line: str) -> list[str]:
    """The arguments after ``searchr1`` (an environment prefix, ``torchrun ... -m searchr1`` allowed)."""
    words = shlex.split(line)
    at = words.index("searchr1")
    return words[at + 1 :]


def all_examples() -> list[tuple[str, list[str]]]:
    top = build_parser()
    found: list[tuple[str, list[str]]] = []
    for _, parser in parsers(top):
        text = "\n".join(filter(None, [parser.description, parser.epilog]))
        found += [(line, argv_of(line)) for line in example_lines(text)]
    return list(dict.fromkeys((line, tuple(argv)) for line, argv in found))  # type: ignore[return-value]


EXAMPLES = all_examples()


# -- what an example reads and what it creates -------------------------------------------------------


def looks_like_path(value: str) -> bool:
    if value.startswith(("http://", "https://")) or "=" in value:
        return False
    p = PurePosixPath(value)
    return p.suffix in SUFFIXES or (len(p.parts) > 1 and p.parts[0] in LOCAL_ROOTS) or len(p.parts) > 2


def override_paths(overrides: list[str]) -> list[str]:
    """The paths in ``key=value`` overrides of keys that name files or folders."""
    out = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key.endswith(("_files", ".index", ".corpus", "hybrid_indexes", ".out_dir")):
            out += [v.strip() for v in value.strip("[]").split(",") if v.strip()]
    return out


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def reads_and_creates(argv: list[str]) -> tuple[list[str], list[str]]:
    """(paths an example reads, paths it writes)."""
    args = parse(argv)
    command = argv[0]
    get = lambda name: getattr(args, name, None)  # noqa: E731
    reads: list[str] = []
    creates: list[str] = []
    for name in ("corpus", "index", "input", "model", "run_dir", "plot", "template"):
        value = get(name)
        if isinstance(value, str) and looks_like_path(value):
            reads.append(value)
    for name in ("data", "inputs", "compare"):
        reads += [v for v in get(name) or [] if looks_like_path(v)]
    reads += override_paths(get("set") or [])
    if get("export"):
        reads.append(get("export")[0])
        creates.append(get("export")[1])
    if command == "train" and not get("export") and not get("plot"):
        if get("config") and not shipped_config(get("config")):
            reads.append(get("config"))
        overrides = [o for o in get("overrides") or [] if not o.startswith("trainer.out_dir=")]
        reads += override_paths(overrides)
        if not (get("print_config") or get("list_keys")):
            cfg = load_config(
                shipped_config(get("config")) if get("config") else None, get("overrides") or []
            )
            run = cfg.trainer.out_dir
            creates += [run, f"{run}/checkpoints/step_{cfg.trainer.total_steps:06d}/model"]
    out = get("out")
    if isinstance(out, str):
        creates.append(out)
        if command == "data" and argv[1] == "synth":
            creates += [f"{out}/{name}.jsonl" for name in ("corpus", "train", "val", "test")]
            if get("parquet"):
                creates += [f"{out}/{name}.parquet" for name in ("train", "val", "test")]
    return reads, creates


def shipped(path: str) -> bool:
    if (ROOT / path).exists():
        return True
    if path.startswith("shared/"):
        # the shared data folder (the FlashRAG sample) lives beside a checkout, not in it: where a clean
        # clone has none above it there is nothing to check the path against
        homes = [folder for folder in (ROOT, *ROOT.parents) if (folder / "shared").is_dir()]
        return not homes or any((folder / path).exists() for folder in homes)
    return False


def covered(path: str, created: set[str]) -> bool:
    return shipped(path) or any(path == c or path.startswith(c.rstrip("/") + "/") for c in created)


# -- the tests ---------------------------------------------------------------------------------------


def test_the_helpers_read_examples_and_paths():
    text = "examples:\n  searchr1 eval --model m --data data/x.jsonl \\\n      --out eval/a      (a comment)\n  curl x\n"
    assert example_lines(text) == ["searchr1 eval --model m --data data/x.jsonl --out eval/a"]
    assert argv_of("SEARCHR1_API_KEY=k searchr1 serve --port 1") == ["serve", "--port", "1"]
    assert argv_of("torchrun --nproc_per_node 8 -m searchr1 train") == ["train"]
    assert looks_like_path("data/world/test.jsonl") and looks_like_path("runs/tiny/checkpoints/step_1/model")
    assert not looks_like_path("smollm2-135m-instruct") and not looks_like_path("Qwen/Qwen2.5-3B")
    assert reads_and_creates(["eval", "--compare", "eval/a", "eval/b"]) == (["eval/a", "eval/b"], [])
    assert not covered("nq_test.jsonl", set()) and covered("searchr1/configs/tiny_cpu.yaml", set())
    assert covered("eval/before/agent", {"eval/before"}) and not covered("eval/beforehand", {"eval/before"})


def test_there_are_examples_of_every_command():
    commands = {argv[0] for _, argv in EXAMPLES}
    assert {"data", "index", "search", "serve", "train", "eval", "ask", "report"} <= commands


@pytest.mark.parametrize(("line", "argv"), EXAMPLES, ids=[line[:60] for line, _ in EXAMPLES])
def test_the_example_parses(line, argv):
    try:
        parse(list(argv))
    except SystemExit as exc:
        pytest.fail(f"{line!r} does not parse (exit {exc.code})")


def test_every_path_an_example_names_exists_or_an_example_creates_it():
    created: set[str] = set()
    for _, argv in EXAMPLES:
        created.update(reads_and_creates(list(argv))[1])
    missing = [
        f"{path!r} in {line!r}"
        for line, argv in EXAMPLES
        for path in reads_and_creates(list(argv))[0]
        if not covered(path, created)
    ]
    assert not missing, "paths neither shipped nor created by an example:\n" + "\n".join(missing)
