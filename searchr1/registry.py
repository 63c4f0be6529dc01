"""One registry type for everything a user extends by name: advantage estimators, policy losses, KL
estimators and loss aggregations (``searchr1.algorithms.registry``), reward components
(``searchr1.rewards.registry``), search backends (``searchr1.retrieval.base``) and rollout engines
(``searchr1.rollout.registry``).

    ENGINES = Registry("rollout engine", "rollout.engine")

    @ENGINES.register("mine")                    # a decorator: the name selects it in the config
    def mine(cfg, model, tokenizer, retriever, **kwargs): ...

    ENGINES.lookup("mine")                       # the entry; an unknown name is a ValueError:
    # rollout.engine: unknown rollout engine 'mne'; known: hf, mine, single_turn, turn_sync

A name is registered once: registering another entry under a taken name is an error unless
``override=True`` says it is meant. A registry built with ``traits=`` (a dataclass) records, with each
entry, what the rest of the code must know about it (``traits_of(name)``), so that no list of names is
kept anywhere else. ``builtins=`` names the modules that register the built-in entries; they are
imported on the first question asked of the registry, so a registry whose built-ins need torch stays
light to import. Imports nothing of the package.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
E = TypeVar("E")


class Registry(Mapping[str, T]):
    """Entries of one kind by name (a read-only mapping; ``register`` / ``add`` / ``remove`` change it)."""

    def __init__(
        self, kind: str, config_key: str, *, traits: type | None = None, builtins: Sequence[str] = ()
    ) -> None:
        self.kind = kind
        """What an entry is, in messages ("rollout engine")."""
        self.config_key = config_key
        """The config key that names an entry ("rollout.engine"); messages start with it."""
        self.traits_type = traits
        self._builtins = tuple(builtins)
        self._entries: dict[str, T] = {}
        self._traits: dict[str, Any] = {}

    # -- adding ------------------------------------------------------------------------------------

    def register(self, name: str, *aliases: str, override: bool = False, **traits: Any) -> Callable[[E], E]:
        """Decorator: register the decorated object under ``name`` (and ``aliases``), with ``traits``."""

        self._traits_info(name, traits)  # a mistyped trait fails here, at the decorator's line

        def deco(entry: E) -> E:
            self.add(name, entry, *aliases, override=override, **traits)
            return entry

        return deco

    def add(self, name: str, entry: Any, *aliases: str, override: bool = False, **traits: Any) -> None:
        """Register ``entry`` under ``name`` (and ``aliases``). A name taken by another entry is a
        ``ValueError`` unless ``override``; traits this registry does not know are a ``TypeError``."""
        info = self._traits_info(name, traits)
        for key in (name, *aliases):
            old = self._entries.get(key)
            if old is not None and old is not entry and not override:
                raise ValueError(
                    f"{self.kind} '{key}' is already registered ({_origin(old)}); pass override=True to replace it"
                )
        for key in (name, *aliases):
            self._entries[key] = entry
            self._traits[key] = info

    def _traits_info(self, name: str, traits: dict[str, Any]) -> Any:
        if traits and self.traits_type is None:
            raise TypeError(f"{self.kind} '{name}': this registry takes no traits, got {sorted(traits)}")
        return self.traits_type(**traits) if self.traits_type is not None else None

    def remove(self, name: str) -> T:
        """Unregister ``name`` and return its entry (``KeyError`` if it is not registered)."""
        self._traits.pop(name, None)
        return self._entries.pop(name)

    # -- asking ------------------------------------------------------------------------------------

    def lookup(self, name: str) -> T:
        """The entry registered as ``name``; ``ValueError`` (``unknown``) if there is none."""
        self._load_builtins()
        try:
            return self._entries[name]
        except KeyError:
            raise self.unknown(name) from None

    def traits_of(self, name: str) -> Any:
        """The traits registered with ``name`` (the traits type's defaults when none were given)."""
        self.lookup(name)
        info = self._traits.get(name)
        if info is None and self.traits_type is not None:
            return self.traits_type()
        return info

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        self._load_builtins()
        return sorted(self._entries)

    def unknown(self, name: str) -> ValueError:
        """The one error for a name nobody registered: ``KEY: unknown KIND 'NAME'; known: a, b``."""
        return ValueError(
            f"{self.config_key}: unknown {self.kind} '{name}'; known: {', '.join(self.names())}"
        )

    def check(self, name: str) -> None:
        """Raise ``unknown(name)`` unless ``name`` is registered."""
        if name not in self:
            raise self.unknown(name)

    # -- the mapping -------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> T:
        self._load_builtins()
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self._load_builtins()
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        return name in self._entries

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.config_key!r})"

    def _load_builtins(self) -> None:
        """Import the modules that register the built-ins, once (they may ask this registry again)."""
        while self._builtins:
            module, *rest = self._builtins
            self._builtins = tuple(rest)
            try:
                importlib.import_module(module)
            except BaseException:
                self._builtins = (module, *self._builtins)  # asked again, it fails again
                raise


def _origin(entry: Any) -> str:
    """Where an entry was defined, for the overwrite message."""
    return f"{getattr(entry, '__module__', '?')}.{getattr(entry, '__qualname__', type(entry).__name__)}"
