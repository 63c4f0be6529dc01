"""The package's import structure, read from the source with ``ast`` (nothing is imported).

* no import cycle among modules, in-function imports and those under ``if TYPE_CHECKING:`` counted (a cycle
  kept only for the type checker is still a cycle: the two modules cannot be read or moved apart);
* no library module imports a command-line module (``searchr1.cli``, ``searchr1.*.cli``): the CLIs
  import the library, never the reverse;
* counting in-function and ``TYPE_CHECKING`` imports too, no cycle among packages;
* an in-function import of a searchr1 module is there for a heavy dependency (torch, numpy, httpx,
  ...), not to hide a cycle (modules not yet cleaned up are listed in ``LAZY_LIGHT_IMPORTS_ALLOWED``).

The graph helpers are tested on small hand-made graphs first, so that a failure to find a cycle
means there is none.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "searchr1"

HEAVY_DEPENDENCIES = frozenset(
    {
        "torch", "transformers", "peft", "trl", "accelerate", "safetensors", "faiss",
        "sentence_transformers", "numpy", "pyarrow", "datasets", "matplotlib", "bm25s",
        "httpx", "fastapi", "starlette", "uvicorn", "pydantic", "tensorboard", "wandb",
    }
)  # fmt: skip
"""Third-party packages slow enough to import that a searchr1 module importing them (at module level,
directly or through other modules) may be imported inside a function instead."""

MAY_IMPORT = {
    # in data-path order; each package may import the ones listed (in-function imports counted)
    "searchr1.data": {"searchr1.errors"},
    "searchr1.retrieval": {"searchr1.errors", "searchr1.registry"},
    # rollout/records.py scores a finished trajectory with the rewards' answer parsing; the vLLM engine's
    # errors (vLLM missing, a dead server) are user-facing
    "searchr1.rollout": {
        "searchr1.data", "searchr1.retrieval", "searchr1.rewards", "searchr1.models", "searchr1.precision",
        "searchr1.registry", "searchr1.errors", "searchr1.threads", "searchr1.modeling", "searchr1.hfcompat",
    },
    "searchr1.rewards": {"searchr1.data", "searchr1.registry"},
    "searchr1.algorithms": {"searchr1.registry"},
    "searchr1.trainer": {
        "searchr1.data", "searchr1.retrieval", "searchr1.rollout", "searchr1.rewards", "searchr1.algorithms",
        "searchr1.models", "searchr1.precision", "searchr1.errors", "searchr1.threads", "searchr1.modeling",
        "searchr1.hfcompat",
    },
    "searchr1.evaluation": {
        "searchr1.data", "searchr1.retrieval", "searchr1.rollout", "searchr1.rewards",
        "searchr1.config", "searchr1.models", "searchr1.errors", "searchr1.hfcompat",
    },
    "searchr1.report": {"searchr1.data", "searchr1.rewards", "searchr1.evaluation"},
    # the config tree: one section from each package that has one
    "searchr1.config": {
        "searchr1.data", "searchr1.retrieval", "searchr1.rollout", "searchr1.rewards", "searchr1.algorithms",
        "searchr1.trainer", "searchr1.plugins",
    },
    # the registries of every kind a user extends, and the import of plugin modules
    "searchr1.plugins": {
        "searchr1.retrieval", "searchr1.rollout", "searchr1.rewards", "searchr1.algorithms", "searchr1.registry",
    },
    # the Python API (SearchR1Trainer) over the assembled config and the trainer
    "searchr1.api": {"searchr1.config", "searchr1.trainer", "searchr1.algorithms", "searchr1.rewards"},
    "searchr1.models": {"searchr1.errors"},
    "searchr1.modeling": set(),
    "searchr1.hfcompat": set(),
    "searchr1.memory": set(),
    "searchr1.precision": set(),
    "searchr1.threads": set(),
    "searchr1.errors": set(),
    "searchr1.registry": set(),
}  # fmt: skip
"""What each library package may import. Not listed, so unchecked: the command-line layer (``cli``:
``searchr1.cli``, ``*.cli``), the benchmarks and the demos, which sit on top and may import anything."""

LAZY_LIGHT_IMPORTS_ALLOWED = {
    # benchmarks and the learning demo import the pieces they time / run inside their functions;
    # they are maintained apart and not reworked here
    "searchr1.bench",
    "searchr1.bench.cli",
    "searchr1.bench.retrieval",
    "searchr1.bench.server_load",
    "searchr1.demo.runs",
    "searchr1.demo.settings",
    "searchr1.demo.cli",
}
"""Modules whose in-function imports of light searchr1 modules are not checked."""


# ---------------------------------------------------------------------------------------------
# reading the source
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    in_function: bool
    type_checking: bool
    """Under ``if TYPE_CHECKING:``: read by type checkers only, never run."""


def module_names(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under ``package``."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The searchr1 modules an import statement loads (``from pkg import submodule`` names the
    submodule; ``from pkg import name`` the package)."""

    def known_prefix(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            origin = ".".join([*base, *([node.module] if node.module else [])])
        else:
            origin = node.module or ""
        names = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in known else origin for a in node.names]
    found = [known_prefix(n) for n in names if n.split(".")[0] == "searchr1"]
    return sorted({t for t in found if t})


def read_imports(package: Path = PACKAGE) -> tuple[set[str], list[Import]]:
    """(every module, every import of a searchr1 module: at module level, in functions and under
    ``if TYPE_CHECKING:``, each marked as such)."""
    files = module_names(package)
    known = set(files)
    imports: list[Import] = []
    for module, path in files.items():
        is_package = path.name == "__init__.py"

        def visit(
            node: ast.AST,
            in_function: bool,
            type_checking: bool,
            module: str = module,
            is_package: bool = is_package,
        ) -> None:
            if isinstance(node, ast.If) and _is_type_checking(node):
                for child in node.body:
                    visit(child, in_function, True)
                for other in node.orelse:
                    visit(other, in_function, type_checking)
                return
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(node, module, is_package, known):
                    if target != module:
                        imports.append(Import(module, target, node.lineno, in_function, type_checking))
            nested = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            for child in ast.iter_child_nodes(node):
                visit(child, in_function or nested, type_checking)

        visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), False, False)
    return known, imports


def graph(imports: Iterable[Import], *, in_functions: bool, type_checking: bool) -> dict[str, set[str]]:
    """Module -> modules it imports: at module level, plus those in functions (``in_functions``) and those
    under ``if TYPE_CHECKING:`` (``type_checking``) when asked."""
    out: dict[str, set[str]] = {}
    for imp in imports:
        if (in_functions or not imp.in_function) and (type_checking or not imp.type_checking):
            out.setdefault(imp.source, set()).add(imp.target)
    return out


def every_import(imports: Iterable[Import]) -> dict[str, set[str]]:
    """The whole graph: every import wherever it stands (module level, in a function, for type checkers)."""
    return graph(imports, in_functions=True, type_checking=True)


def find_cycles(g: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Every strongly connected component with a cycle (Tarjan), each as the sorted member names."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    nodes = sorted({*g, *(t for ts in g.values() for t in ts)})

    def visit(v: str) -> None:
        # iterative, so that a long chain of modules cannot hit the recursion limit
        work = [(v, iter(sorted(g.get(v, ()))))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(g.get(w, ())))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        members.append(w)
                        if w == node:
                            break
                    if len(members) > 1 or node in g.get(node, ()):
                        cycles.append(sorted(members))

    for v in nodes:
        if v not in index:
            visit(v)
    return sorted(cycles)


def is_cli(module: str) -> bool:
    """The command-line layer: ``searchr1.cli``, ``__main__``, every ``*.cli`` and ``*_cli`` module (one
    per command) and the ``cli_*`` modules the commands share."""
    last = module.rpartition(".")[2]
    return module == "searchr1.__main__" or last == "cli" or last.startswith("cli_") or last.endswith("_cli")


def package_of(module: str) -> str:
    """The unit of the package graph: ``searchr1.<subpackage>``, a top-level module, or ``cli`` for
    every command-line module (the layer above the library)."""
    if is_cli(module):
        return "cli"
    return ".".join(module.split(".")[:2])


def package_graph(g: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for source, targets in g.items():
        for target in targets:
            a, b = package_of(source), package_of(target)
            if a != b:
                out.setdefault(a, set()).add(b)
    return out


def heavy_dependencies(package: Path = PACKAGE) -> dict[str, frozenset[str]]:
    """Module -> the ``HEAVY_DEPENDENCIES`` it imports at module level, directly or through other
    searchr1 modules (its parent packages, which Python imports first, included)."""
    known, imports = read_imports(package)
    direct: dict[str, set[str]] = {m: set() for m in known}
    for module, path in module_names(package).items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            for stmt in node.body if isinstance(node, ast.Try) else [node]:
                if isinstance(stmt, ast.Import):
                    direct[module] |= {a.name.split(".")[0] for a in stmt.names}
                elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
                    direct[module].add(stmt.module.split(".")[0])
    deps = {m: d & HEAVY_DEPENDENCIES for m, d in direct.items()}
    top = graph(imports, in_functions=False, type_checking=False)  # what importing the module runs
    changed = True
    while changed:  # a fixed point: cycles cannot stop it
        changed = False
        for module in known:
            parents = {module.rsplit(".", i)[0] for i in range(1, module.count(".") + 1)}
            for other in top.get(module, set()) | parents:
                if not deps[other] <= deps[module]:
                    deps[module] |= deps[other]
                    changed = True
    return {m: frozenset(d) for m, d in deps.items()}


# ---------------------------------------------------------------------------------------------
# the helpers can fail
# ---------------------------------------------------------------------------------------------


def test_find_cycles_finds_a_synthetic_cycle_and_nothing_else():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"a"}}) == [["a"]]
    two = find_cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}})
    assert two == [["a", "b"], ["c", "d"]]
    chain = {f"m{i}": {f"m{i + 1}"} for i in range(5000)}  # no recursion limit
    assert find_cycles(chain) == []
    chain["m5000"] = {"m0"}
    assert len(find_cycles(chain)[0]) == 5001


def test_reading_the_source_sees_relative_lazy_and_type_checking_imports(tmp_path):
    pkg = tmp_path / "searchr1"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import a\n")
    (pkg / "sub" / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from searchr1.sub.b import X\n"
        "if TYPE_CHECKING:\n    from searchr1 import cli\n"
        "def f():\n    from ..sub import c\n"
    )
    (pkg / "sub" / "b.py").write_text("import numpy\nX = 1\n")
    (pkg / "sub" / "c.py").write_text("from .a import f\n")
    # a cycle closed only for the type checker (as slots <-> static_decode once was); the else branch runs
    (pkg / "e.py").write_text("import numpy\nfrom searchr1.f import Y\nZ = 2\n")
    (pkg / "f.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "Y = 1\n"
        "if TYPE_CHECKING:\n    from searchr1.e import Z\nelse:\n    from searchr1 import cli\n"
    )
    known, imports = read_imports(pkg)
    assert known == {
        "searchr1",
        "searchr1.cli",
        "searchr1.sub",
        "searchr1.sub.a",
        "searchr1.sub.b",
        "searchr1.sub.c",
        "searchr1.e",
        "searchr1.f",
    }
    edges = {(i.source, i.target, i.in_function, i.type_checking) for i in imports}
    assert edges == {
        ("searchr1.sub", "searchr1.sub.a", False, False),
        ("searchr1.sub.a", "searchr1.sub.b", False, False),
        ("searchr1.sub.a", "searchr1.cli", False, True),
        ("searchr1.sub.a", "searchr1.sub.c", True, False),
        ("searchr1.sub.c", "searchr1.sub.a", False, False),
        ("searchr1.e", "searchr1.f", False, False),
        ("searchr1.f", "searchr1.e", False, True),
        ("searchr1.f", "searchr1.cli", False, False),
    }
    lazy, typed = ["searchr1.sub.a", "searchr1.sub.c"], ["searchr1.e", "searchr1.f"]
    assert find_cycles(graph(imports, in_functions=False, type_checking=False)) == []
    assert find_cycles(graph(imports, in_functions=True, type_checking=False)) == [lazy]
    assert find_cycles(graph(imports, in_functions=False, type_checking=True)) == [typed]
    assert find_cycles(every_import(imports)) == [typed, lazy]
    deps = heavy_dependencies(pkg)
    assert deps["searchr1.sub.c"] == deps["searchr1.sub"] == {"numpy"}  # through a, and as c's parent
    assert deps["searchr1"] == deps["searchr1.cli"] == frozenset()
    assert deps["searchr1.e"] == {"numpy"}
    assert deps["searchr1.f"] == frozenset()  # its import of e is for the type checker: it runs nothing
    assert is_cli("searchr1.cli") and is_cli("searchr1.data.cli") and is_cli("searchr1.cli_common")
    assert is_cli("searchr1.evaluation.ask_cli")
    assert not is_cli("searchr1.client") and not is_cli("searchr1.retrieval.client")


# ---------------------------------------------------------------------------------------------
# the package
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def source() -> tuple[set[str], list[Import]]:
    return read_imports()


def test_no_import_cycle_even_counting_in_function_and_type_checking_imports(source):
    """Not at module level, not hidden inside a function, and not under ``if TYPE_CHECKING:`` either."""
    _, imports = source
    cycles = find_cycles(every_import(imports))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_library_modules_never_import_a_cli(source):
    _, imports = source
    bad = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in imports
        if is_cli(i.target) and not is_cli(i.source)
    ]
    assert not bad, "the CLIs import the library, never the reverse:\n" + "\n".join(bad)


def test_no_package_cycle_counting_in_function_and_type_checking_imports(source):
    _, imports = source
    cycles = find_cycles(package_graph(every_import(imports)))
    assert not cycles, "package cycles (in-function and TYPE_CHECKING imports counted):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_packages_import_only_the_packages_below_them(source):
    _, imports = source
    g = package_graph(every_import(imports))
    bad = [
        f"{package} imports {other} ({', '.join(sorted({f'{i.source}:{i.line}' for i in imports if package_of(i.source) == package and package_of(i.target) == other}))})"
        for package, allowed in MAY_IMPORT.items()
        for other in sorted(g.get(package, set()) - allowed)
    ]
    assert not bad, "imports outside MAY_IMPORT:\n" + "\n".join(bad)


def test_in_function_imports_are_for_heavy_dependencies(source):
    """An import inside a function must keep a heavy dependency out of the importing module: the
    target brings one that the module does not import already. Otherwise it only hides a cycle."""
    _, imports = source
    deps = heavy_dependencies()
    needless = [
        f"{i.source}:{i.line} imports {i.target} inside a function, but it brings no heavy dependency "
        f"that {i.source} does not import already ({', '.join(sorted(deps[i.source])) or 'none'})"
        for i in imports
        if i.in_function
        and not i.type_checking
        and not deps[i.target] - deps[i.source]
        and i.source not in LAZY_LIGHT_IMPORTS_ALLOWED
    ]
    assert not needless, "\n".join(needless)


REGISTRY_MODULES = {
    "searchr1.registry",
    "searchr1.algorithms.registry",
    "searchr1.rewards.registry",
    "searchr1.retrieval.base",
    "searchr1.rollout.registry",
}
"""The modules that hold a ``Registry`` (``searchr1.plugins.NAMED_KEYS`` lists them by config key)."""


def test_config_sections_import_no_registry(source):
    """A section (``<package>.config``) checks its own values; the registered names are checked where
    the config is assembled (``searchr1.config`` through ``searchr1.plugins``), after the plugins."""
    known, imports = source
    g = graph(imports, in_functions=True, type_checking=False)  # what checking a section imports when it runs
    sections = sorted(m for m in known if m.endswith(".config") and m != "searchr1.config")
    assert "searchr1.rollout.config" in sections and "searchr1.trainer.config" in sections
    bad = []
    for section in sections:
        seen, todo = set(), [section]
        while todo:
            for target in g.get(todo.pop(), ()):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        if seen & REGISTRY_MODULES:
            bad.append(f"{section} imports {', '.join(sorted(seen & REGISTRY_MODULES))}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "code",
    [
        "import searchr1.config",
        "import searchr1.algorithms.registry, searchr1.rollout.registry, searchr1.algorithms.presets",
        "import searchr1.api",
        # every subcommand's parser except `demo`, whose options come from the learning demo (torch)
        "import argparse, importlib\n"
        "from searchr1.cli import COMMAND_MODULES\n"
        "sub = argparse.ArgumentParser().add_subparsers()\n"
        "for name in COMMAND_MODULES:\n"
        "    if name != 'searchr1.demo.cli':\n"
        "        importlib.import_module(name).register(sub)",
    ],
)
def test_light_entry_points_import_no_torch(code):
    probe = f"{code}\nimport sys\nassert 'torch' not in sys.modules, 'torch imported'"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1:]
