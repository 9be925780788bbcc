"""The package's layering: no import cycle among `aggregator` modules and one composition root
(the contracts of `[tool.importlinter]` in pyproject.toml are tests/test_import_contracts.py's).

Imports inside functions and under `if TYPE_CHECKING:` count: they are cycles too, only hidden.
A cycle means two modules cannot be understood (or tested) without each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "aggregator"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*parts, base] if base else parts)
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_the_detector_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_the_composition_root_and_the_commands_import_the_root() -> None:
    importers = {mod for mod, deps in import_graph().items() if "aggregator.assembly" in deps}
    # The process runners compose: one process, the control process and each worker.
    runners = {"aggregator.runners.supervisor", "aggregator.runners.worker"}
    assert importers <= {"aggregator.runners.server", "aggregator.commands.check", *runners}, importers


def test_features_do_not_import_the_runner() -> None:
    importers = {mod for mod, deps in import_graph().items() if "aggregator.runners.server" in deps}
    runners = {"aggregator.runners.supervisor", "aggregator.runners.worker"}
    assert importers <= {"aggregator.commands.cli", "aggregator.commands.demo", *runners}, importers
