"""What a user extends without forking, and the user modules that do it.

Four kinds are chosen by name in the configuration, each from one ``searchr1.registry.Registry``:

    algorithm.advantage / policy_loss / kl_estimator / loss_agg   searchr1.algorithms.registry
    reward.components (the keys)                                  searchr1.rewards.registry
    retrieval.backend (and retrieval.rerank_base)                 searchr1.retrieval.base
    rollout.engine                                                searchr1.rollout.registry

A plugin is a module that registers entries there. ``plugins: [my_module]`` in a config (or
``--plugin my_module`` on a command) imports it before the config is checked, so its names are
valid everywhere the config is. The config sections themselves import no registry: the names of an
assembled config are checked here (``check_names``), with what the registries say about them
(``check_traits``: an estimator's critic and group size).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from searchr1.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
)
from searchr1.registry import Registry
from searchr1.retrieval.base import RETRIEVERS
from searchr1.rewards.registry import REWARD_COMPONENTS
from searchr1.rollout.registry import ENGINES

NAMED_KEYS: dict[str, Registry[Any]] = {
    "algorithm.advantage": ADVANTAGE_ESTIMATORS,
    "algorithm.policy_loss": POLICY_LOSSES,
    "algorithm.kl_estimator": KL_ESTIMATORS,
    "algorithm.loss_agg": LOSS_AGGREGATIONS,
    "reward.components": REWARD_COMPONENTS,
    "retrieval.backend": RETRIEVERS,
    "retrieval.rerank_base": RETRIEVERS,
    "rollout.engine": ENGINES,
}
"""Config key -> the registry its value (for ``reward.components``: each key) is a name in."""


class PluginError(ValueError):
    """A plugin module that cannot be found or fails while it is imported."""


def import_plugins(names: Iterable[str], search_dirs: Sequence[str | Path] | None = None) -> None:
    """Import each plugin (a module name, or a ``.py`` file) so that what it registers can be named.

    A module name is imported as usual (``sys.path``); one that is not found there is looked up in
    ``search_dirs`` (default: the current folder; ``load_config`` passes the config file's folder
    first), and its folder is then added to ``sys.path`` so that the plugin's own imports work too. A relative ``.py`` path is tried as given,
    then in ``search_dirs``. Importing a plugin twice does nothing.
    """
    folders = [Path(d) for d in search_dirs] if search_dirs is not None else [Path.cwd()]
    for name in names:
        if name.endswith(".py"):
            candidates = [Path(name)] + ([d / name for d in folders] if not Path(name).is_absolute() else [])
            _import_file(next((c for c in candidates if c.is_file()), Path(name)))
        else:
            _import_module(name, folders)


def _import_module(name: str, search_dirs: list[Path]) -> None:
    try:
        importlib.import_module(name)
        return
    except ModuleNotFoundError as exc:
        if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
            # the plugin was found, one of its own imports was not
            raise PluginError(f"plugins: {name}: {exc}") from exc
    except Exception as exc:
        raise PluginError(f"plugins: {name} failed while importing: {type(exc).__name__}: {exc}") from exc
    relative = Path(*name.split("."))
    for folder in search_dirs:
        if (folder / f"{relative}.py").is_file() or (folder / relative / "__init__.py").is_file():
            sys.path.insert(0, str(folder.resolve()))
            _import_module(name, [])
            return
    where = ", ".join(str(d) for d in search_dirs)
    raise PluginError(
        f"plugins: no module named {name!r} (looked on sys.path{' and in ' + where if where else ''})"
    )


def _import_file(path: Path) -> None:
    if not path.is_file():
        raise PluginError(f"plugins: {path}: file not found")
    name = path.stem
    if (
        name in sys.modules
        and Path(getattr(sys.modules[name], "__file__", "") or "").resolve() == path.resolve()
    ):
        return
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugins: {path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise PluginError(f"plugins: {path} failed while importing: {type(exc).__name__}: {exc}") from exc


# -- the checks of an assembled config -----------------------------------------------------------


def _value(cfg: Any, key: str) -> Any:
    section, _, field = key.partition(".")
    return getattr(getattr(cfg, section), field)


def check_names(cfg: Any) -> None:
    """Every name the config gives (``NAMED_KEYS``) is registered; else the registry's one message.
    ``reward.components`` keys of the form ``module:function`` are user functions, not names."""
    for key, registry in NAMED_KEYS.items():
        if key == "retrieval.rerank_base" and cfg.retrieval.backend != "rerank":
            continue
        value = _value(cfg, key)
        for name in value if isinstance(value, dict) else [value]:
            if ":" not in name or key != "reward.components":
                registry.check(name)


def check_traits(cfg: Any) -> None:
    """What the registered advantage estimator says it needs, against the rest of the config."""
    algo = cfg.algorithm
    traits = ADVANTAGE_ESTIMATORS.traits_of(algo.advantage)
    need = traits.group_size_needed(algo)
    if cfg.rollout.n < need:
        why = f" ({traits.group_size_reason})" if traits.group_size_reason else ""
        raise ValueError(
            f"rollout.n={cfg.rollout.n} with algorithm.advantage={algo.advantage}: it needs rollout.n >= {need}{why}"
        )
    if algo.filter_groups and traits.needs_critic:
        raise ValueError(
            f"algorithm.filter_groups: with algorithm.advantage={algo.advantage} (a critic baseline) a group "
            "of equal rewards still has advantages; filtering is for group baselines (grpo, rloo, ...)"
        )


def known_names(key: str) -> list[str] | None:
    """The names ``key`` accepts (None: it names no registered entry)."""
    registry = NAMED_KEYS.get(key)
    return registry.names() if registry is not None else None


def names_overview(keys: Iterable[str] | None = None) -> str:
    """What each of ``keys`` (default: every key that names a registered entry) may name, plugins
    included: the end of a command's ``--help``."""
    keys = [k for k in NAMED_KEYS if k != "retrieval.rerank_base"] if keys is None else list(keys)
    lines = ["registered names (a plugin registers more: `plugins:` in the config, or --plugin):"]
    lines += [f"  {key}: {', '.join(NAMED_KEYS[key].names())}" for key in keys]
    return "\n".join(lines)
