"""`confined`: an import-linter contract type for third-party code owned by a few modules.

import-linter's own contracts see an outside package only by its top-level name (`aiohttp`, never
`aiohttp.web_protocol`), and no import written as a string (`importlib.import_module(
"kubernetes.aio.config")`). This one reads every module of the root package with `ast` instead:
every `import` statement wherever it stands (in a function, under `if TYPE_CHECKING:`), and every
call of `import_module`, `__import__` or `_import` with a literal module name. pyproject.toml names
it in `[tool.importlinter] contract_types`; lint-imports imports it from its working directory.

Options:
- `modules`: what is confined. `x` is x and every module in it; `x.*` only the modules in it
  (`aiohttp.*`: aiohttp's own modules, while `import aiohttp` stays free for all).
- `exempt_modules` (optional): modules that `modules` takes in but anyone may import.
- `allowed_importers`: the modules, and packages with every module in them, that may import the
  confined ones; `[]`: no module may.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import grimp
from importlinter import Contract, ContractCheck, fields, output

# Functions that import the module their first argument names: importlib's, the builtin, and the
# kube client's lazy loader (aggregator/kube/client.py `_import`).
DYNAMIC_IMPORTS = frozenset({"import_module", "__import__", "_import"})


@dataclass(frozen=True, order=True)
class Import:
    importer: str
    imported: str
    line: int


def names(module: str, pattern: str) -> bool:
    """Whether `pattern` (`x`: x and below; `x.*`: below x only) names `module`."""
    if pattern.endswith(".*"):
        return module.startswith(pattern[:-1])
    return module == pattern or module.startswith(pattern + ".")


def package_modules(package: str) -> dict[str, Path]:
    """Every module of `package` by name, read from where Python would import the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{package} is not an importable package")
    root = Path(next(iter(spec.submodule_search_locations)))
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def is_module(name: str, own: Mapping[str, Path]) -> bool:
    """Whether `name` is a module rather than a name inside one (`from aiohttp import web` imports
    the module aiohttp.web, `from aiohttp import ClientSession` only aiohttp), by the files that
    would hold it; an outside package that is not installed counts as holding the module."""
    if name in own:
        return True
    top, _, rest = name.partition(".")
    if not rest or top in {m.partition(".")[0] for m in own}:
        return False
    spec = importlib.util.find_spec(top)  # a top-level name: found without importing anything
    if spec is None:
        return True
    for folder in spec.submodule_search_locations or ():
        path = Path(folder).joinpath(*rest.split("."))
        if path.is_dir() or any(
            path.with_name(path.name + suffix).exists() for suffix in importlib.machinery.all_suffixes()
        ):
            return True
    return False


def _base(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from ... import` reads from (`package`: the importer's package)."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    parts = parts[: len(parts) - node.level + 1]
    return ".".join([*parts, node.module] if node.module else parts)


def _called(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def imports_of(module: str, path: Path, own: Mapping[str, Path]) -> Iterator[Import]:
    """Every module that `module` (read from `path`) imports, each with its line."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _base(node, package)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield Import(module, candidate if is_module(candidate, own) else base, node.lineno)
        elif (
            isinstance(node, ast.Call)
            and _called(node.func) in DYNAMIC_IMPORTS
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith(".")
        ):
            yield Import(module, node.args[0].value, node.lineno)


class ConfinedContract(Contract):
    """Only `allowed_importers` import `modules` (see the module's docstring)."""

    type_name = "confined"

    modules = fields.ListField(subfield=fields.StringField())
    exempt_modules = fields.ListField(subfield=fields.StringField(), required=False)
    allowed_importers = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        confined = cast(list[str], self.modules)
        exempt = cast(list[str] | None, self.exempt_modules) or []
        allowed = cast(list[str], self.allowed_importers)
        illegal: list[Import] = []
        for root in cast(list[str], self.session_options["root_packages"]):
            own = package_modules(root)
            for module, path in own.items():
                if any(names(module, importer) for importer in allowed):
                    continue
                illegal.extend(
                    found
                    for found in imports_of(module, path, own)
                    if any(names(found.imported, pattern) for pattern in confined)
                    and not any(names(found.imported, pattern) for pattern in exempt)
                )
        return ContractCheck(kept=not illegal, metadata={"illegal": sorted(set(illegal))})

    def render_broken_contract(self, check: ContractCheck) -> None:
        allowed = cast(list[str], self.allowed_importers)
        output.print_error(f"Only {', '.join(allowed) or 'no module'} may import these:", bold=False)
        output.new_line()
        for found in check.metadata["illegal"]:
            output.print_error(f"- {found.importer} -> {found.imported} (l.{found.line})", bold=False)
        output.new_line()
