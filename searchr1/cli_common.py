"""What several commands share: the configuration flags (``--config``, ``--set``, ``--plugin``), one set
of search-backend flags for every command that searches (``search``, ``serve``, ``eval``, ``ask``), the
model flags of ``eval`` and ``ask``, the checks that run before any work, and a ``--help`` that lists
the registered names (plugins included).

    add_config_flags(parser, ...)    --config FILE, --set KEY=VALUE, --plugin MODULE
    add_search_flags(parser)         --index, --corpus, --search-url, --backend, --encoder, --topk
    add_model_flags(parser)          --model, --template, --engine, --dtype, --device, --max-turns, --max-turn-tokens,
                                     --max-obs-tokens, --max-response-tokens, --[no-]last-search-notice
    choose_settings(args)            a trained policy's retrieval and rollout settings, under the flags
    choose_dtype(args, cfg)          the generation dtype (--dtype / rollout.dtype), checked against the engine
    command_config(args, ...)        the config of a command: file, flags, --set, plugins imported first
    help_lists_names(parser, keys)   -h / --help also prints what each key may name

Light: nothing heavy is imported until a command runs. Every problem is one line naming the flag.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from searchr1.config import ConfigError, load_config
from searchr1.data.prompts import AUTO, describe_template, load_template, resolve_template
from searchr1.data.trained_settings import SETTING_KEYS, TrainedSettings, find_trained_settings
from searchr1.data.trained_template import find_trained_template
from searchr1.errors import ModelNotFoundError, UserFacingError
from searchr1.plugins import PluginError, import_plugins, names_overview
from searchr1.retrieval.corpus import CorpusError
from searchr1.retrieval.factory import build_retriever
from searchr1.rollout.registry import generation_dtype


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


def add_search_flags(parser: argparse.ArgumentParser) -> None:
    """The search backend, the same for every command: where to search, which backend, how many hits."""
    g = parser.add_argument_group("search backend (or the config's `retrieval` section)")
    g.add_argument("--index", default=None, help="index folder (from `searchr1 index build`)")
    g.add_argument(
        "--corpus",
        default=None,
        help="corpus jsonl: searched in memory (bm25) without --index; with --index, checked against its manifest",
    )
    g.add_argument(
        "--search-url", default=None, metavar="URL", help="retrieval server URL(s), comma-separated"
    )
    g.add_argument("--url", dest="search_url", help=argparse.SUPPRESS)  # `search --url`, the former name
    g.add_argument(
        "--backend",
        default=None,
        metavar="NAME",
        help="search backend by registered name, listed below (default: the index's own, http with "
        "--search-url, bm25 with --corpus)",
    )
    g.add_argument(
        "--encoder", default=None, metavar="MODEL", help="dense encoder (default: the dense index's own)"
    )
    g.add_argument(
        "--topk",
        type=int,
        default=None,
        help="documents per search (default: retrieval.topk = 3; eval and ask of a trained policy: its run's)",
    )


def has_search_flags(args: argparse.Namespace) -> bool:
    """Whether a search backend was named on the command line."""
    return bool(args.index or args.corpus or args.search_url or args.backend)


def check_search_flags(args: argparse.Namespace) -> None:
    """Before any work: the index folder holds a manifest, the corpus is a readable file, one source."""
    if args.search_url and (args.index or args.corpus):
        raise UserFacingError("--search-url searches a server: give it without --index / --corpus")
    if args.index:
        p = Path(args.index).expanduser()
        if not p.is_dir():
            raise UserFacingError(f"--index {args.index}: index folder not found")
        from searchr1.retrieval.index import IndexLoadError, Manifest

        try:
            Manifest.read(p)
        except (IndexLoadError, OSError, ValueError) as exc:
            raise UserFacingError(f"--index {args.index}: {exc}") from None
    if args.corpus:
        check_readable_file(args.corpus, "--corpus")


def search_overrides(args: argparse.Namespace) -> list[str]:
    """The search flags as dotted overrides of the ``retrieval`` section (checked first)."""
    check_search_flags(args)
    out: list[str] = []
    backend = args.backend
    if args.index:
        from searchr1.retrieval.index import Manifest

        out.append(f"retrieval.index={args.index}")
        backend = backend or Manifest.read(args.index).retriever
    if args.corpus:
        out.append(f"retrieval.corpus={args.corpus}")
    if args.search_url:
        out.append(f"retrieval.url={args.search_url}")
        backend = backend or "http"
    if args.corpus and not backend:
        backend = "bm25"
    if backend:
        out.append(f"retrieval.backend={backend}")
    if args.encoder:
        out.append(f"retrieval.dense_model={args.encoder}")
    if args.topk is not None:
        out.append(f"retrieval.topk={args.topk}")
    return out


def open_retriever(retrieval: Any) -> Any:
    """The search backend of a ``retrieval`` section; a problem with it is one line."""
    try:
        return build_retriever(retrieval)
    except (ValueError, OSError, CorpusError) as exc:
        raise UserFacingError(f"search backend: {exc}") from None


# -- eval and ask: the model -----------------------------------------------------------------------


def add_model_flags(parser: argparse.ArgumentParser, model_required: bool = True) -> None:
    """The model and how it generates (``eval`` and ``ask``)."""
    parser.add_argument(
        "--model",
        required=model_required,
        help="model: a local folder (a checkpoint), a hub id, a .gguf file or an alias (smollm2-135m-instruct)",
    )
    parser.add_argument(
        "--template",
        default=None,
        help="prompt template: base | instruct | instruct_1shot | instruct_2shot | instruct_2hop | a file with "
        "{question} | auto (the model's chat template if it has one, else base). Default: for a checkpoint "
        "or an exported policy of `searchr1 train`, the template it was trained with; else auto",
    )
    run = "default: the run's for a checkpoint or exported policy of `searchr1 train`, else"
    parser.add_argument(
        "--max-turns", type=int, default=None, help=f"search turns before the answer-only turn ({run} 4)"
    )
    parser.add_argument(
        "--max-turn-tokens", type=int, default=None, help=f"tokens per turn at most ({run} 500)"
    )
    parser.add_argument(
        "--max-obs-tokens",
        type=int,
        default=None,
        help=f"tokens of one <information> block at most ({run} 500)",
    )
    parser.add_argument(
        "--max-response-tokens",
        type=int,
        default=None,
        help=f"tokens after the prompt (generated + observations) at most ({run} 4096)",
    )
    parser.add_argument(
        "--last-search-notice",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"after the last search turn's documents, tell the model it may only answer now ({run} off)",
    )
    parser.add_argument(
        "--engine",
        default=None,
        metavar="NAME",
        help="rollout engine of the search loop (default: rollout.engine = hf): hf | turn_sync | vllm (a vLLM "
        "server, see rollout.vllm; install with scripts/setup-vllm.sh) | a plugin's",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=("auto", "float32", "bfloat16", "float16"),
        help="generation dtype of whichever engine runs (rollout.dtype; the model is loaded in it): auto "
        "(default: bfloat16 where the CPU or GPU has bfloat16 units, else float32) | float32 | bfloat16 | "
        "float16; the results record the one that generated",
    )
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")


MODEL_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("max_turns", "rollout.max_turns", "--max-turns"),
    ("max_turn_tokens", "rollout.max_turn_tokens", "--max-turn-tokens"),
    ("max_obs_tokens", "rollout.max_obs_tokens", "--max-obs-tokens"),
    ("max_response_tokens", "rollout.max_response_tokens", "--max-response-tokens"),
    ("last_search_notice", "rollout.last_search_notice", "--last-search-notice"),
    ("template", "data.template", "--template"),
    ("engine", "rollout.engine", "--engine"),
    ("dtype", "rollout.dtype", "--dtype"),
)
"""The model flags that are config keys: (attribute, dotted key, flag)."""


def model_overrides(args: argparse.Namespace) -> list[str]:
    """The model flags that are config keys, as dotted overrides."""
    out = []
    for attr, key, _ in MODEL_FLAGS:
        value = getattr(args, attr, None)
        if value is not None:
            out.append(f"{key}={json.dumps(value) if isinstance(value, bool) else value}")
    return out


def check_model(model: str) -> None:
    """A local model folder must hold a readable config.json; any other name must resolve
    (``searchr1.models.resolve_model``: an alias, a .gguf file, a cached or reachable hub id)."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserFacingError(
                f"--model {model}: no config.json in this folder (not a Hugging Face model folder)"
            )
        if not os.access(path / "config.json", os.R_OK):
            raise UserFacingError(f"--model {model}: config.json is not readable")
        return
    from searchr1.models import resolve_model

    try:
        resolve_model(model)
    except (ModelNotFoundError, OSError, ValueError) as exc:
        raise UserFacingError(f"--model {model}: {str(exc).splitlines()[0]}") from None


def template_given(args: argparse.Namespace) -> bool:
    """Whether the command line names the prompt template (``--template``, ``--set data.template=``)."""
    return args.template is not None or any(o.split("=", 1)[0].strip() == "data.template" for o in args.set)


def choose_template(cfg: Any, model: str, given: bool = False) -> str:
    """Choose the prompt template and set it in ``cfg``; returns the line that tells the user which one the
    command uses and why.

    ``data.template`` given (``given``: on the command line; or set by ``--config``) is used as it is.
    Otherwise a policy trained here is prompted with the template it was trained with
    (``searchr1.data.trained_template``: a checkpoint's run config, an exported folder's record), and any
    other model resolves ``auto`` with its tokenizer (its chat template, else base)."""
    asked = cfg.data.template
    trained = find_trained_template(model)
    if given or asked != AUTO:
        if asked == AUTO:
            _resolve_auto(cfg, model)
        line = f"template: {describe_template(asked, cfg.data.template)}"
        line += "" if asked == AUTO else " (given)"
        if trained is not None and trained.found and trained.template != cfg.data.template:
            line += f"; note: this model was trained with {trained.recorded} ({trained.source})"
        return line
    if trained is not None:
        if not trained.found:
            raise UserFacingError(
                f"--model {model} was trained with the prompt template file {trained.recorded} "
                f"({trained.source}), which is not found here: pass --template NAME|FILE"
            )
        try:
            load_template(trained.template)
        except ValueError as exc:
            raise UserFacingError(f"--model {model}: its training template: {exc}; pass --template") from None
        cfg.data.template = trained.template
        return (
            f"template: {trained.template} (the one this model was trained with, from {trained.source}; "
            "--template overrides)"
        )
    _resolve_auto(cfg, model)
    return f"template: {describe_template(asked, cfg.data.template)}"


# -- eval and ask: the settings a policy was trained with ---------------------------------------------


def _config_file_keys(path: str | None) -> set[str]:
    """The dotted keys a ``--config`` file sets (none when it cannot be read: loading it says why)."""
    if not path:
        return set()
    try:
        data = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return set()
    keys: set[str] = set()

    def walk(node: Any, prefix: str) -> None:
        for name, value in node.items():
            key = f"{prefix}{name}"
            keys.add(key)
            if isinstance(value, dict):
                walk(value, f"{key}.")

    if isinstance(data, dict):
        walk(data, "")
    return keys


def named_settings(args: argparse.Namespace) -> dict[str, str]:
    """The ``SETTING_KEYS`` the command line sets, each with what set it (``--topk``, ``--set``,
    ``--config``; a later one wins, as the config does)."""
    named = dict.fromkeys(
        sorted(_config_file_keys(getattr(args, "config", None)) & set(SETTING_KEYS)), "--config"
    )
    if getattr(args, "topk", None) is not None:
        named["retrieval.topk"] = "--topk"
    for attr, key, flag in MODEL_FLAGS:
        if key in SETTING_KEYS and getattr(args, attr, None) is not None:
            named[key] = flag
    for item in getattr(args, "set", []):
        key = item.split("=", 1)[0].strip()
        if key in SETTING_KEYS:
            named[key] = "--set"
    return named


def _config_value(cfg: Any, key: str) -> Any:
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _shown(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) or value is None else str(value)


@dataclass(frozen=True)
class SettingsChoice:
    """The retrieval and rollout settings of ``eval`` / ``ask``: those of the run that trained the model
    (``trained``), each overridden by the command line (``named``: key -> the flag that set it)."""

    model: str
    trained: TrainedSettings | None
    named: dict[str, str]

    def overrides(self) -> list[str]:
        """The run's settings that no flag names, as dotted overrides (given before the flags')."""
        if self.trained is None:
            return []
        return [f"{k}={json.dumps(v)}" for k, v in self.trained.values.items() if k not in self.named]

    def origin(self, key: str) -> str:
        """Where ``key``'s value comes from: the flag that set it, ``run`` or ``default``."""
        if key in self.named:
            return self.named[key]
        return "run" if self.trained is not None and key in self.trained.values else "default"

    def record(self, cfg: Any) -> dict[str, Any]:
        """Every setting with its value in ``cfg``, where each came from, and the run's file."""
        return {
            **{key: _config_value(cfg, key) for key in SETTING_KEYS},
            "settings_from": {key: self.origin(key) for key in SETTING_KEYS},
            "run_config": None if self.trained is None else str(self.trained.source),
        }

    def line(self, cfg: Any) -> str:
        """One line naming each setting ``cfg`` has, and where it came from."""
        each = ", ".join(
            f"{key}={_shown(_config_value(cfg, key))} ({self.origin(key)})" for key in SETTING_KEYS
        )
        if self.trained is None:
            return (
                f"settings: {self.model} has no run config (not a checkpoint or export of `searchr1 train`), "
                f"so the defaults: {each}"
            )
        return f"settings: {each}; run = {self.trained.source} (a flag or --set KEY=VALUE overrides)"


def choose_settings(args: argparse.Namespace) -> SettingsChoice:
    """The settings of ``--model``'s training run (``searchr1.data.trained_settings``) under the command
    line's; pass ``overrides()`` to ``command_config`` before the flags' own."""
    return SettingsChoice(args.model, find_trained_settings(args.model), named_settings(args))


def _resolve_auto(cfg: Any, model: str) -> None:
    """``data.template=auto`` resolved with ``model``'s tokenizer (its chat template, else base)."""
    from searchr1.models import load_tokenizer

    try:
        cfg.data.template = resolve_template(AUTO, load_tokenizer(model))
    except (OSError, ValueError) as exc:
        raise UserFacingError(f"--model {model}: its tokenizer cannot be loaded ({exc})") from None


def _device(args: argparse.Namespace) -> str:
    import torch

    return args.device or ("cuda" if torch.cuda.is_available() else "cpu")


def choose_dtype(args: argparse.Namespace, cfg: Any) -> str:
    """Before any model loads: the dtype the engine will generate in (``--dtype``, else the config's
    ``rollout.dtype``; auto resolved for ``--device``), set as ``cfg.rollout.dtype`` so that every engine
    generates in it; one line naming the engine and the dtypes it takes when it cannot."""
    import torch

    flag = "--dtype" if args.dtype else "rollout.dtype"
    try:
        cfg.rollout.dtype = generation_dtype(cfg, torch.device(_device(args)).type, flag)
    except (ValueError, RuntimeError) as exc:
        raise UserFacingError(str(exc)) from None
    return cfg.rollout.dtype


def load_policy(args: argparse.Namespace, dtype: str) -> tuple[Any, Any]:
    """(model in ``dtype``, in eval mode on ``--device``, tokenizer) of ``--model``."""
    from searchr1.models import load_model, load_tokenizer

    device = _device(args)
    try:
        tokenizer = load_tokenizer(args.model)
        model = load_model(args.model, dtype=dtype, device=device)
    except (OSError, ValueError) as exc:
        raise UserFacingError(f"--model {args.model}: cannot be loaded ({exc})") from None
    model.eval()
    return model, tokenizer


def check_readable_file(path: str, what: str) -> Path:
    """``path`` as a readable file, else one line naming ``what`` (the flag)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise UserFacingError(f"{what} {path}: file not found")
    if not p.is_file():
        raise UserFacingError(f"{what} {path}: not a file")
    if not os.access(p, os.R_OK):
        raise UserFacingError(f"{what} {path}: not readable (permission denied)")
    return p


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
