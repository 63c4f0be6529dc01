"""Typed configuration: a tree of dataclasses loaded from YAML with dotted ``key=value`` overrides.

Every subcommand shares the same tree (``SearchR1Config``); each package owns its section
(``retrieval``, ``data``, ``rollout``, ``reward``, ``algorithm``, ``trainer``, ...), documented field by
field. Loading is strict: an unknown key or a value of the wrong type raises ``ConfigError`` naming
the dotted key, before any model or index is touched. The modules listed under ``plugins`` are
imported first, so the names they register are valid everywhere (``searchr1.plugins``).

    cfg = load_config("my_recipe.yaml", ["trainer.total_steps=200", "rollout.n=5"])
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

import yaml

from searchr1.algorithms.config import AlgorithmConfig
from searchr1.data.config import DataConfig
from searchr1.plugins import PluginError, check_names, check_traits, import_plugins, known_names
from searchr1.retrieval.config import RetrievalConfig
from searchr1.rewards.config import RewardConfig
from searchr1.rollout.config import RolloutConfig
from searchr1.trainer.config import GuidanceConfig, ModelConfig, ReplayConfig, TrainerConfig, WarmStartConfig

T = TypeVar("T")

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
"""The configs shipped with the package (``searchr1/configs/*.yaml``), selectable by name."""


class ConfigError(ValueError):
    """A configuration value is unknown, mistyped or inconsistent; the message names the key."""


@dataclass
class SearchR1Config:
    """The whole configuration tree shared by every subcommand."""

    plugins: list[str] = field(default_factory=list)
    """User modules imported before this config is checked (module names or .py files; `--plugin` adds
    more): the reward components, algorithms, search backends and rollout engines they register can be
    named in the config. A module not found on sys.path is looked for beside the config file, then in
    the current folder."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy (and critic) model: hub id or local folder, dtype, LoRA."""
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    """Which search backend answers `<search>` calls, and how."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training / validation data and the prompt template."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Multi-turn generation: turns, token budgets, sampling."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Rule-based reward components and their weights."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimator, policy loss, KL, loss aggregation, reference policy."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Optimisation, batching, checkpoints, logging, validation."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """Replay of successful trajectories into groups that found none (off by default)."""
    guidance: GuidanceConfig = field(default_factory=GuidanceConfig)
    """Guidance from the gold path for groups that found no success: gold trajectories and branched rollouts (off by default)."""
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)
    """Supervised LoRA on the training questions' gold trajectories before RL (off by default)."""
    seed: int = 0
    """Seed for every random number generator of the run."""


# ---------------------------------------------------------------------------------------------
# dict <-> dataclass with type checking
# ---------------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (converting int->float, list->tuple)."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise ConfigError(f"{key}: expected one of {_type_name(tp)}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping for section {tp.__name__}, got {value!r}")
        return from_dict(tp, value, prefix=key)
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        args = get_args(tp)
        item_tp = args[0] if args else Any
        items = [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if (origin or tp) is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        args = get_args(tp)
        val_tp = args[1] if len(args) == 2 else Any
        return {str(k): _coerce(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")


RETIRED_KEYS: dict[str, tuple[Any, str]] = {
    "rollout.vllm.dtype": (
        "auto",
        "rollout.dtype sets the generation dtype of every engine, vLLM's included",
    ),
}
"""Keys that are gone: dotted key -> (the value that is ignored, as every saved config.yaml of an older
version holds it; what replaced the key). Any other value is an error naming the replacement."""


def _retired(key: str, value: Any) -> None:
    """Ignore a retired key holding its old default; any other value is one line naming what replaced it."""
    default, replacement = RETIRED_KEYS[key]
    if value != default:
        raise ConfigError(f"{key} is no longer a config key: {replacement} (got {key}={value})")


def _unknown_key(cls: type, name: str, prefix: str) -> ConfigError:
    known = [f.name for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean '{_join(prefix, close[0])}'?)" if close else ""
    return ConfigError(f"unknown config key '{_join(prefix, name)}'{hint}; known keys: {', '.join(known)}")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def from_dict(cls: type[T], data: Mapping[str, Any], prefix: str = "") -> T:
    """Build the dataclass ``cls`` from a nested mapping, rejecting unknown keys and wrong types."""
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, value in data.items():
        if name not in names:
            if _join(prefix, str(name)) in RETIRED_KEYS:
                _retired(_join(prefix, str(name)), value)
                continue
            raise _unknown_key(cls, str(name), prefix)
        kwargs[name] = _coerce(value, hints[name], _join(prefix, name))
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain nested dicts / lists (YAML- and JSON-serialisable)."""
    return dataclasses.asdict(cfg)


def _parse_scalar(text: str) -> Any:
    """Parse an override's value the way YAML would (``1e-6`` is a float, ``[1,2]`` a list)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        # YAML 1.1 reads "1e-6" as a string; be helpful for numbers.
        try:
            return float(value) if any(c in value for c in ".eE") else value
        except ValueError:
            return value
    return value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str], cls: type = SearchR1Config) -> None:
    """Apply ``a.b.c=value`` overrides in place, checking each dotted key against ``cls``."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        key, raw = item.split("=", 1)
        if key.strip() in RETIRED_KEYS:
            _retired(key.strip(), _parse_scalar(raw))
            continue
        parts = key.strip().split(".")
        node, section = data, cls
        for depth, part in enumerate(parts):
            if section is None or not dataclasses.is_dataclass(section):
                node[part] = node.get(part, {}) if depth < len(parts) - 1 else _parse_scalar(raw)
                if depth < len(parts) - 1:
                    node = node[part]
                continue
            field_names = {f.name for f in dataclasses.fields(section)}
            if part not in field_names:
                raise _unknown_key(section, part, ".".join(parts[:depth]))
            hint = get_type_hints(section)[part]
            if depth == len(parts) - 1:
                node[part] = _parse_scalar(raw)
            else:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise ConfigError(f"{'.'.join(parts[: depth + 1])} is not a section")
                section = hint if dataclasses.is_dataclass(hint) else None


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    cls: type[T] = SearchR1Config,
    plugins: Sequence[str] = (),
) -> T:
    """Load ``cls`` from an optional YAML file plus dotted overrides, import its plugins (the config's
    ``plugins`` list, then ``plugins``: the ``--plugin`` flags), then run every check."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data = loaded
    apply_overrides(data, overrides, cls)
    if cls is SearchR1Config:
        data["plugins"] = _import_plugins(data.get("plugins"), plugins, path)
    cfg = from_dict(cls, data)
    validate(cfg)
    return cfg


def _import_plugins(listed: Any, extra: Sequence[str], path: Path | None) -> list[str]:
    """Import the config's plugins and the extra ones (once each, in order); returns them all, so that a
    config written out (``config.yaml`` of a run) imports them again."""
    names = _coerce([] if listed is None else listed, list[str], "plugins")
    names += [p for p in extra if p not in names]
    folders = [*([path.parent] if path is not None else []), Path.cwd()]
    try:
        import_plugins(names, folders)
    except PluginError as exc:
        raise ConfigError(str(exc)) from exc
    return names


def validate(cfg: Any) -> None:
    """Check an assembled config: every registered name it gives (``searchr1.plugins.check_names``),
    then each section's own ``validate(root)``, then what the named entries need of the rest
    (``check_traits``). Every error is a ``ConfigError`` naming the dotted key."""
    whole = isinstance(cfg, SearchR1Config)
    if whole:
        _as_config_error(check_names, cfg)
    _validate_sections(cfg, cfg)
    if whole:
        _as_config_error(check_traits, cfg)


def _validate_sections(cfg: Any, root: Any) -> None:
    """Call ``validate(root)`` on every section that defines it, innermost first."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            _validate_sections(value, root)
    check = getattr(cfg, "validate", None)
    if callable(check):
        _as_config_error(check, root)


def _as_config_error(check: Any, arg: Any) -> None:
    try:
        check(arg)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def describe(cls: type = SearchR1Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, doc) for every leaf field: what ``searchr1 train --list-keys`` prints. A key
    that names a registered entry lists the registered names (built-ins and plugins)."""
    import ast
    import inspect

    docs: dict[str, str] = {}
    try:
        tree = ast.parse(inspect.getsource(cls))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, [*body[1:], None], strict=True):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(getattr(nxt, "value", None), ast.Constant)
            ):
                docs[node.target.id] = str(nxt.value.value).strip()
    except (OSError, TypeError, IndexError):
        pass
    rows = []
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = _join(prefix, f.name)
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, key))
            continue
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = repr(f.default_factory())  # type: ignore[misc]
        else:
            default = "(required)"
        doc = docs.get(f.name, "")
        known = known_names(key)
        if known is not None:
            doc = f"{doc} Registered: {', '.join(known)}."
        rows.append((key, default, doc))
    return rows


# ---------------------------------------------------------------------------------------------
# the configs shipped with the package
# ---------------------------------------------------------------------------------------------


def shipped_configs() -> dict[str, Path]:
    """Name (file stem) -> path of every shipped config (``tiny_cpu``, ``grpo_qwen2.5_3b``, ...)."""
    return {p.stem: p for p in sorted(CONFIG_DIR.glob("*.yaml"))}


def shipped_config(name: str) -> Path | None:
    """The shipped config called ``name`` (with or without ``.yaml``), or None."""
    return shipped_configs().get(name.removesuffix(".yaml"))


def resolve_config_path(path: str | Path | None) -> str | None:
    """A config file path, or the name of a shipped config (``searchr1 train --config tiny_cpu``,
    ``SearchR1Trainer(config="tiny_cpu")``); anything else is returned as given (``load_config`` then
    says the file is missing)."""
    if path is None:
        return None
    path = str(path)
    if Path(path).is_file():
        return path
    found = shipped_config(path)
    return str(found) if found else path
