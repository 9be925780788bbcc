"""The import contracts of `[tool.importlinter]` in pyproject.toml hold, and each can fail.

Every contract is shown to catch a bad import: one copy of the package gets one injected import
per contract (more for a layers contract: one up across its layers, one between the siblings of
each `|` group), import-linter checks the copy once, and each contract must be reported broken
by its own injections and by no other's. The injections are read from the contracts themselves
(a new contract is covered the day it is written), except where a contract's own words cannot
name a module to import (`x.*`) or a freer import shows more: those are written out below.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.confined import Import, imports_of, names
from tests.support.importlint import ROOT, Lint, contracts, lint

# Two import-linter runs in processes of their own (the tree, the injected copy).
pytestmark = pytest.mark.long(15)

CONFIG = ROOT / "pyproject.toml"
PACKAGE = "aggregator"


@dataclass(frozen=True)
class Injection:
    contract: str
    # the module the lines are appended to, and the module import-linter names as imported
    module: str
    code: str
    imported: str

    @property
    def link(self) -> str:
        """How import-linter's report names the import: `a -> b (l.N)`."""
        return f"{self.module} -> {self.imported} (l."


# Written out: confinement by a pattern (`aiohttp.*`), and imports that only the `confined` reader
# sees (a string, a function body, `if TYPE_CHECKING:`).
WRITTEN = {
    "cffi-in-nghttp2": [
        Injection("cffi-in-nghttp2", "aggregator.web.http2.connection", "import cffi", "cffi")
    ],
    "aiohttp-internals": [
        Injection(
            "aiohttp-internals",
            "aggregator.proxy.handling",
            "import typing\n\nif typing.TYPE_CHECKING:\n    from aiohttp import web_protocol",
            "aiohttp.web_protocol",
        ),
        Injection(
            "aiohttp-internals",
            "aggregator.web.http2.stream",
            "from aiohttp.streams import StreamReader",
            "aiohttp.streams",
        ),
    ],
    "kubernetes-in-kube": [
        Injection(
            "kubernetes-in-kube",
            "aggregator.sources.reflector",
            'def _client() -> object:\n    import importlib\n\n    return importlib.import_module("kubernetes.client")',
            "kubernetes.client",
        )
    ],
    "no-h2": [Injection("no-h2", "aggregator.web.http2.connection", "from hpack import Encoder", "hpack")],
    "opentelemetry-in-tracing": [
        Injection(
            "opentelemetry-in-tracing",
            "aggregator.web.pipeline",
            "def _tracer() -> None:\n    from opentelemetry import trace",
            "opentelemetry.trace",
        )
    ],
    "prometheus-client": [
        Injection(
            "prometheus-client",
            "aggregator.proxy.endpoints",
            "from prometheus_client import Counter",
            "prometheus_client",
        ),
        # API Priority and Fairness declares its metrics in flowcontrol/metrics.py; its gate may not.
        Injection(
            "prometheus-client",
            "aggregator.flowcontrol.filter",
            "from prometheus_client import Gauge",
            "prometheus_client",
        ),
    ],
}


def _entries(layer: str) -> list[str]:
    return [entry.strip().strip("()") for entry in re.split(r"[|:]", layer)]


def derived(contract: dict[str, Any]) -> list[Injection]:
    """Imports the contract forbids, read from its own words."""
    ident, kind = contract["id"], contract["type"]
    if kind == "layers":
        container = (contract.get("containers") or [""])[0]

        def full(entry: str) -> str:
            return f"{container}.{entry}" if container else entry

        layers = [_entries(layer) for layer in contract["layers"]]
        low, high = full(layers[-1][0]), full(layers[0][0])
        found = [Injection(ident, low, f"import {high}", high)]
        for written, entries in zip(contract["layers"], layers, strict=True):
            if "|" in written:
                found.append(
                    Injection(ident, full(entries[0]), f"import {full(entries[1])}", full(entries[1]))
                )
        return found
    if kind == "independence":
        first, second = contract["modules"][:2]
        return [Injection(ident, first, f"import {second}", second)]
    if kind == "forbidden":
        source, forbidden = contract["source_modules"][0], contract["forbidden_modules"][0]
        return [Injection(ident, source, f"import {forbidden}", forbidden)]
    if kind == "confined" and not contract["modules"][0].endswith(".*"):
        return [Injection(ident, PACKAGE, f"import {contract['modules'][0]}", contract["modules"][0])]
    raise AssertionError(f"write an injection for the {kind} contract {ident} in WRITTEN")


def injections() -> dict[str, list[Injection]]:
    return {
        contract["id"]: WRITTEN.get(contract["id"]) or derived(contract) for contract in contracts(CONFIG)
    }


def source_file(tree: Path, module: str) -> Path:
    path = tree.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def inject(tree: Path, injected: Iterator[Injection]) -> None:
    """Append each injection's lines to its module in the copy at `tree`."""
    for injection in injected:
        path = source_file(tree, injection.module)
        path.write_text(
            f"{path.read_text().rstrip()}\n\n\n# injected ({injection.contract})\n{injection.code}\n"
        )


@pytest.fixture(scope="module")
def injected_lint(tmp_path_factory: pytest.TempPathFactory) -> Lint:
    """import-linter's verdict on a copy of the package with every injection at once."""
    tree = tmp_path_factory.mktemp("injected")
    shutil.copytree(ROOT / PACKAGE, tree / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(CONFIG, tree / CONFIG.name)
    inject(tree, (injection for found in injections().values() for injection in found))
    return lint(tree / CONFIG.name, tree)


def test_every_contract_holds() -> None:
    done = lint(CONFIG)
    assert done.returncode == 0, done.output
    assert set(done.kept) == {contract["id"] for contract in contracts(CONFIG)}, done.output


@pytest.mark.parametrize("contract", sorted(injections()))
def test_the_contract_catches_its_injected_import(injected_lint: Lint, contract: str) -> None:
    assert injected_lint.kept.get(contract) is False, injected_lint.output
    report = injected_lint.reports[contract]
    everyone = injections()
    for injection in everyone[contract]:
        assert injection.link in report, (injection, report)
    # Broken by its own injections only: no other contract's injection shows in its report.
    for other, found in everyone.items():
        for injection in found if other != contract else ():
            assert injection.link not in report, (injection, report)


def test_the_injected_copy_breaks_nothing_else(injected_lint: Lint) -> None:
    """Every contract was checked, and no broken contract lacks an injection (they all have one)."""
    assert set(injected_lint.kept) == set(injections()), injected_lint.output
    assert injected_lint.returncode == 1


# --- the `confined` reader, on its own -------------------------------------------------------------


def read(tmp_path: Path, code: str, module: str = "aggregator.web.sample") -> list[Import]:
    path = tmp_path / "sample.py"
    path.write_text(code)
    own = {"aggregator.web.sample": path, "aggregator.web.other": path, "aggregator.web": path}
    return sorted(imports_of(module, path, own))


def test_the_reader_sees_every_form_of_import(tmp_path: Path) -> None:
    code = (
        "import typing\n"
        "from . import other\n"
        "from .. import web\n"
        "from aiohttp import ClientSession, web\n"
        "if typing.TYPE_CHECKING:\n"
        "    from aiohttp.web_protocol import RequestHandler\n"
        "def f() -> None:\n"
        "    import cffi\n"
        '    _import("kubernetes.aio.config")\n'
        '    importlib.import_module("h2.connection")\n'
        '    __import__("hpack")\n'
        '    importlib.import_module(".relative", "x")\n'
        '    print("kubernetes.io/service-name")\n'
    )
    assert {(found.imported, found.line) for found in read(tmp_path, code)} == {
        ("typing", 1),
        ("aggregator.web.other", 2),
        ("aggregator.web", 3),
        ("aiohttp", 4),  # ClientSession: a name in aiohttp, not a module
        ("aiohttp.web", 4),
        ("aiohttp.web_protocol", 6),
        ("cffi", 8),
        ("kubernetes.aio.config", 9),
        ("h2.connection", 10),
        ("hpack", 11),
    }


@pytest.mark.parametrize(
    ("module", "pattern", "expected"),
    [
        ("aiohttp", "aiohttp.*", False),
        ("aiohttp.web_protocol", "aiohttp.*", True),
        ("aiohttp", "aiohttp", True),
        ("aiohttp.streams", "aiohttp", True),
        ("aiohttpx", "aiohttp", False),
        ("h2c", "h2", False),
    ],
)
def test_patterns(module: str, pattern: str, expected: bool) -> None:
    assert names(module, pattern) is expected
