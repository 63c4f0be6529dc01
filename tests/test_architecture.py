"""The package's shape: no import cycles among modules at import time, and the command-line layer on top
(no library module imports a CLI module). Parsed from the source with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "searchr1"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_cli(module: str) -> bool:
    return module == "searchr1.cli" or module.endswith(".cli") or module == "searchr1.__main__"


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Import statements run when the module is imported: at top level or in a top-level ``try``, not
    under ``if TYPE_CHECKING:``, not inside functions."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.Try):
            found += [n for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)]
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> internal modules it imports at import time."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges: set[str] = set()
        for node in _top_level_imports(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base for alias in node.names]
            edges |= {t for t in targets if t in paths and t != name}
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50 and graph["searchr1.trainer.loop"]  # the parse sees the tree
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_library_never_imports_the_command_line_layer():
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        if not is_cli(module) and module != "searchr1.demo"
        for target in targets
        if is_cli(target)
    )
    assert upward == []


def test_trainer_api_stands_without_the_trainer_cli():
    assert "searchr1.trainer.cli" not in import_graph()["searchr1.trainer.api"]
    source = (PACKAGE / "trainer" / "api.py").read_text()
    assert "trainer.cli" not in source


LAYERS = [
    {"errors", "precision"},
    {"models"},
    {"data"},
    {"retrieval"},
    {"rewards"},
    {"rollout"},
    {"algorithms"},
    {"trainer"},
    {"evaluation"},
    {"report"},
    {"bench"},
]
"""The library's layers, first to last: a module may import its own layer and those before it."""


def layer_of(module: str) -> int | None:
    """The layer of a library module; None for the CLI layer, the package root and ``config.py`` (which
    assembles every package's own ``config`` section)."""
    parts = module.split(".")
    if len(parts) < 2 or is_cli(module) or parts[1] in ("config", "demo", "learning_demo", "__main__"):
        return None
    return next((i for i, names in enumerate(LAYERS) if parts[1] in names), None)


def all_internal_imports() -> list[tuple[str, str]]:
    """(module, imported module) for every ``from searchr1... import`` anywhere, functions included."""
    pairs = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("searchr1."):
                pairs.append((module_name(path), node.module or ""))
            elif isinstance(node, ast.Import):
                pairs += [(module_name(path), a.name) for a in node.names if a.name.startswith("searchr1.")]
    return pairs


def test_no_import_runs_up_the_data_path():
    every_package = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert every_package <= set().union(*LAYERS)  # a new package must be placed in a layer
    upward = sorted(
        f"{module} imports {target}"
        for module, target in all_internal_imports()
        if (mine := layer_of(module)) is not None
        and (theirs := layer_of(target)) is not None
        and theirs > mine
    )
    assert upward == []
