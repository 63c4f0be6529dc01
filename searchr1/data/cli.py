"""``searchr1 data synth | prepare | merge | hotpotqa``: build the datasets the trainer and the evaluation read."""

from __future__ import annotations

import argparse
import sys

from searchr1.data.formats import (
    DataError,
    LoadStats,
    load_samples,
    merge_samples,
    write_parquet,
    write_samples,
)
from searchr1.data.hotpotqa import HotpotQAError, write_hotpotqa
from searchr1.data.prompts import load_template
from searchr1.data.synth import SynthConfig, generate_world, write_world
from searchr1.errors import UserFacingError

EXAMPLES_SYNTH = """examples:
  searchr1 data synth --out data/world
  searchr1 data synth --out data/big --entities 2000 --num-train 10000 --hop-mix single=0.5,bridge=0.3,comparison=0.2
  searchr1 data synth --out data/world --parquet          (also train/val/test.parquet for training)
"""

EXAMPLES_PREPARE = """examples:
  searchr1 data prepare --source nq --input shared/data/flashrag-sample/nq_test_sample.jsonl --split test \\
      --out data/nq_test.parquet
  searchr1 data prepare --input data/world/train.jsonl --template instruct --skip-bad --out data/world_train.parquet
  searchr1 data prepare --source nq --input RUC-NLPIR/FlashRAG_datasets:nq --split train --out data/nq_train.parquet
"""

EXAMPLES_MERGE = """examples:
  searchr1 data merge data/nq_train.parquet data/world_train.parquet --out data/train.parquet --shuffle --seed 0
  searchr1 data merge data/nq_test.parquet data/world/test.parquet --out data/test.parquet
"""

EXAMPLES_HOTPOTQA = """examples:
  searchr1 data hotpotqa shared/data/hotpotqa-sample/train.jsonl shared/data/hotpotqa-sample/test.jsonl \\
      --out data/hotpotqa        (train.jsonl, test.jsonl and corpus.jsonl)
"""


def register(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("data", help="generate, convert and merge datasets", description="Datasets.")
    data_sub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND")

    s = data_sub.add_parser(
        "synth",
        help="write the synthetic world: corpus.jsonl and train/val/test.jsonl",
        description="Generate a seeded fictional world (people, places, organisations, works): a wiki-18 "
        "corpus and FlashRAG questions (single-hop, bridge, comparison); the test split asks about "
        "entities never asked about in training. The same seed gives byte-identical files.",
        epilog=EXAMPLES_SYNTH,
        formatter_class=fmt,
    )
    s.add_argument("--out", required=True, help="output folder")
    s.add_argument("--entities", type=int, default=300, help="entities in the world (default 300)")
    s.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    s.add_argument("--num-train", type=int, default=1000, help="training questions at most (default 1000)")
    s.add_argument("--num-val", type=int, default=100, help="validation questions at most (default 100)")
    s.add_argument("--num-test", type=int, default=200, help="test questions at most (default 200)")
    s.add_argument(
        "--hop-mix",
        default="single=0.6,bridge=0.25,comparison=0.15",
        help="question type shares (default single=0.6,bridge=0.25,comparison=0.15)",
    )
    s.add_argument(
        "--distractor-density",
        type=float,
        default=0.3,
        help="chance an entity shares a name part with another (default 0.3)",
    )
    s.add_argument(
        "--filler-sentences", type=int, default=2, help="fact-free sentences per passage (default 2)"
    )
    s.add_argument(
        "--parquet", action="store_true", help="also write train/val/test.parquet (Search-R1 form)"
    )
    s.add_argument("--template", default="base", help="prompt template for --parquet (default base)")
    s.set_defaults(func=_synth)

    pr = data_sub.add_parser(
        "prepare",
        help="convert a FlashRAG jsonl / hub dataset into the Search-R1 training parquet",
        description="Read FlashRAG jsonl (or parquet, or a hub dataset NAME[:CONFIG] through "
        "datasets.load_dataset), build the prompts, and write Search-R1 / veRL parquet (or .jsonl). "
        "Bad rows stop the command with their row number, or with --skip-bad are skipped and counted.",
        epilog=EXAMPLES_PREPARE,
        formatter_class=fmt,
    )
    pr.add_argument("--input", required=True, help="FILE.jsonl, FILE.parquet or hub NAME[:CONFIG]")
    pr.add_argument(
        "--source", default=None, help="data_source name (nq, hotpotqa, ...; default from the data)"
    )
    pr.add_argument(
        "--split", default="train", help="train | test | dev ... (also the hub split; default train)"
    )
    pr.add_argument(
        "--template", default="base", help="base | instruct | path to a file with a {question} slot"
    )
    pr.add_argument("--out", required=True, help="output .parquet (or .jsonl)")
    pr.add_argument("--skip-bad", action="store_true", help="skip and count bad rows instead of stopping")
    pr.add_argument("--limit", type=int, default=None, help="keep only the first N rows")
    pr.set_defaults(func=_prepare)

    m = data_sub.add_parser(
        "merge",
        help="merge several prepared datasets with unique group indices",
        description="Concatenate datasets (parquet or jsonl); the index (GRPO group id) is renumbered over "
        "the whole result, so groups never mix questions from different sources.",
        epilog=EXAMPLES_MERGE,
        formatter_class=fmt,
    )
    m.add_argument("inputs", nargs="+", help="input .parquet / .jsonl files")
    m.add_argument("--out", required=True, help="output .parquet (or .jsonl)")
    m.add_argument("--shuffle", action="store_true", help="shuffle the merged rows")
    m.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    m.add_argument("--template", default="base", help="template for rows without stored prompts")
    m.add_argument("--skip-bad", action="store_true", help="skip and count bad rows instead of stopping")
    m.set_defaults(func=_merge)

    h = data_sub.add_parser(
        "hotpotqa",
        help="convert HotpotQA rows (its own format) to FlashRAG jsonl and a corpus of their paragraphs",
        description="Each input file (HotpotQA's row format: question, answer, type, supporting_facts, context) "
        "becomes <stem>.jsonl in FlashRAG form (the supporting titles kept in metadata, for the step reward and "
        "guidance), and corpus.jsonl holds every distinct context paragraph of all inputs as one passage.",
        epilog=EXAMPLES_HOTPOTQA,
        formatter_class=fmt,
    )
    h.add_argument("inputs", nargs="+", help="HotpotQA .jsonl / .json files")
    h.add_argument("--out", required=True, help="output folder")
    h.set_defaults(func=_hotpotqa)

    def _usage(args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=_usage)


def _parse_mix(text: str) -> dict[str, float]:
    mix = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        try:
            mix[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise UserFacingError(
                f"--hop-mix: expected name=share pairs like single=0.6,bridge=0.4, got {text!r}"
            )
    return mix


def _synth(args: argparse.Namespace) -> int:
    cfg = SynthConfig(
        num_entities=args.entities,
        hop_mix=_parse_mix(args.hop_mix),
        distractor_density=args.distractor_density,
        filler_sentences=args.filler_sentences,
        num_train=args.num_train,
        num_val=args.num_val,
        num_test=args.num_test,
        seed=args.seed,
    )
    try:
        world = generate_world(cfg)
    except ValueError as exc:
        raise UserFacingError(str(exc)) from exc
    paths = write_world(world, args.out)
    if args.parquet:
        for split in ("train", "val", "test"):
            samples = load_samples(paths[split], split=split)
            paths[f"{split}.parquet"] = write_parquet(
                samples, paths[split].with_suffix(".parquet"), args.template
            )
    print(f"corpus: {len(world.corpus)} passages about {len(world.entities)} entities")
    for split in ("train", "val", "test"):
        rows = world.splits[split]
        kinds = {t: sum(q["metadata"]["type"] == t for q in rows) for t in ("single", "bridge", "comparison")}
        print(f"{split}: {len(rows)} questions ({', '.join(f'{k} {v}' for k, v in kinds.items())})")
    for name, path in paths.items():
        print(f"wrote {name}: {path}")
    return 0


def _report_skipped(stats) -> None:
    if stats.skipped:
        print(f"skipped {stats.skipped} bad row(s) of {stats.rows}:", file=sys.stderr)
        for msg in stats.messages[:20]:
            print(f"  {msg}", file=sys.stderr)
        if len(stats.messages) > 20:
            print(f"  ... and {len(stats.messages) - 20} more", file=sys.stderr)


def _prepare(args: argparse.Namespace) -> int:
    stats = LoadStats()
    try:
        load_template(args.template)
        samples = load_samples(
            args.input,
            split=args.split,
            source=args.source,
            skip_bad=args.skip_bad,
            stats=stats,
            limit=args.limit,
        )
        for s in samples:
            s.split = args.split
            s.prompt_messages = None  # rebuilt from --template
        if not samples:
            raise UserFacingError(f"{args.input}: no usable rows")
        out = write_samples(samples, args.out, args.template)
    except (DataError, ValueError) as exc:
        hint = " (use --skip-bad to skip and count bad rows)" if isinstance(exc, DataError) else ""
        raise UserFacingError(f"{exc}{hint}") from exc
    _report_skipped(stats)
    sources = sorted({s.data_source for s in samples})
    print(f"wrote {len(samples)} rows ({', '.join(sources)}; split {args.split}) to {out}")
    return 0


def _merge(args: argparse.Namespace) -> int:
    stats = LoadStats()
    try:
        groups = [load_samples(p, skip_bad=args.skip_bad, stats=stats) for p in args.inputs]
        merged = merge_samples(groups, shuffle=args.shuffle, seed=args.seed)
        out = write_samples(merged, args.out, args.template)
    except (DataError, ValueError) as exc:
        raise UserFacingError(str(exc)) from exc
    _report_skipped(stats)
    for path, g in zip(args.inputs, groups, strict=True):
        print(f"{path}: {len(g)} rows")
    print(f"wrote {len(merged)} rows with indices 0..{len(merged) - 1} to {out}")
    return 0


def _hotpotqa(args: argparse.Namespace) -> int:
    try:
        paths = write_hotpotqa(args.inputs, args.out)
    except (HotpotQAError, OSError) as exc:
        raise UserFacingError(str(exc)) from exc
    for name, path in paths.items():
        rows = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
        print(f"wrote {name}: {path} ({rows} {'passages' if name == 'corpus' else 'questions'})")
    return 0
