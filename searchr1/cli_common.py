"""What several commands share: the configuration flags (``--config``, ``--set``, ``--plugin``), one set
of search-backend flags for every command that searches, and a ``--help`` that lists the registered
names (plugins included).

    add_plugin_flag(parser)          --plugin MODULE (repeatable)
    add_search_flags(parser)         --index | --corpus | --search-url, --backend, --topk
    search_overrides(args)           those flags as dotted config overrides
    help_lists_names(parser, keys)   -h / --help also prints what each key may name

Light: nothing heavy is imported until a command runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from searchr1.config import ConfigError, load_config
from searchr1.errors import UserFacingError
from searchr1.plugins import PluginError, import_plugins, names_overview


def add_plugin_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a module (or .py file) that registers rewards, algorithms, search backends or rollout "
        "engines before the config is checked; repeatable (the config's `plugins:` list does the same)",
    )


def add_config_flags(parser: argparse.ArgumentParser, sections: str) -> None:
    """``--config``, ``--set KEY=VALUE`` and ``--plugin`` (``sections``: which parts of the config apply)."""
    parser.add_argument("--config", default=None, help=f"YAML config (its {sections} sections are used)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, e.g. retrieval.topk=5 (repeatable)",
    )
    add_plugin_flag(parser)


def add_search_flags(parser: argparse.ArgumentParser, *, topk_default: str = "retrieval.topk = 3") -> None:
    """The search backend, the same for every command: where to search, which backend, how many hits."""
    g = parser.add_argument_group("search backend")
    where = g.add_mutually_exclusive_group()
    where.add_argument("--index", default=None, help="index folder (from `searchr1 index build`)")
    where.add_argument(
        "--corpus",
        default=None,
        help="corpus jsonl searched in memory (BM25 unless --backend says otherwise)",
    )
    where.add_argument(
        "--search-url", default=None, metavar="URL", help="retrieval server URL(s), comma-separated"
    )
    where.add_argument("--url", dest="search_url", help=argparse.SUPPRESS)  # the former name in `search`
    g.add_argument(
        "--backend",
        default=None,
        metavar="NAME",
        help="search backend by registered name, listed at the end (default: the index's own, bm25 for "
        "--corpus, http for --search-url)",
    )
    g.add_argument("--topk", type=int, default=None, help=f"documents per search (default {topk_default})")


def has_search_flags(args: argparse.Namespace) -> bool:
    return bool(args.index or args.corpus or args.search_url or args.backend)


def search_overrides(args: argparse.Namespace) -> list[str]:
    """The search flags as dotted overrides of the ``retrieval`` section."""
    out: list[str] = []
    backend = args.backend
    if args.index:
        from searchr1.retrieval.index import IndexLoadError, Manifest

        out.append(f"retrieval.index={args.index}")
        if backend is None:
            try:
                backend = Manifest.read(args.index).retriever
            except (IndexLoadError, OSError, ValueError) as exc:
                raise UserFacingError(f"--index {args.index}: {exc}") from None
    if args.corpus:
        out.append(f"retrieval.corpus={args.corpus}")
        backend = backend or "bm25"
    if args.search_url:
        out.append(f"retrieval.url={args.search_url}")
        backend = backend or "http"
    if backend:
        out.append(f"retrieval.backend={backend}")
    if args.topk is not None:
        out.append(f"retrieval.topk={args.topk}")
    return out


def command_config(args: argparse.Namespace, overrides: Sequence[str] = ()) -> Any:
    """The config of a command: ``--config``, the command's own ``overrides``, then ``--set``, with the
    plugins of the config and of ``--plugin`` imported first; a bad one is one line."""
    try:
        return load_config(args.config, [*overrides, *args.set], plugins=args.plugin)
    except ConfigError as exc:
        raise UserFacingError(str(exc)) from None


class _HelpWithNames(argparse.Action):
    """``-h`` / ``--help`` that ends with the registered names of some config keys (after importing the
    ``--plugin`` modules given before it, so that theirs are listed too)."""

    def __init__(self, option_strings: list[str], dest: str, keys: Sequence[str] | None = None, **kw: Any):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)
        self.keys = keys

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None):
        try:
            import_plugins(getattr(namespace, "plugin", None) or [])
        except PluginError as exc:
            parser.error(str(exc))
        parser.epilog = f"{parser.epilog or ''}\n{names_overview(self.keys)}\n"
        parser.print_help()
        parser.exit()


def help_lists_names(parser: argparse.ArgumentParser, keys: Sequence[str] | None = None) -> None:
    """Give ``parser`` (built with ``add_help=False``) a help flag that also lists what ``keys`` (default:
    every config key that names a registered entry) may name."""
    parser.add_argument(
        "-h",
        "--help",
        action=_HelpWithNames,
        keys=keys,
        help="show this help and the registered names, then exit",
    )
