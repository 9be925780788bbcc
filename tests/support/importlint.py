"""Run import-linter on a tree of the package and read which contracts it found broken, and why.

lint-imports runs in a process of its own (it configures logging, which other tests read), from
the folder that holds the `aggregator` to check: it puts its working directory first on the
import path, so a copy there is the one checked, and this repository on PYTHONPATH gives it the
`confined` contract type (tests/support/confined.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def contracts(config: Path) -> list[dict[str, Any]]:
    """The contracts `config` declares, as written."""
    found: list[dict[str, Any]] = tomllib.loads(config.read_text())["tool"]["importlinter"]["contracts"]
    return found


@dataclass(frozen=True)
class Lint:
    returncode: int
    output: str
    # contract id -> kept
    kept: dict[str, bool]
    # contract id -> what import-linter says of it (broken contracts only)
    reports: dict[str, str]


def lint(config: Path, where: Path = ROOT) -> Lint:
    """import-linter's verdict on every contract of `config`, for the `aggregator` in `where`."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        # One line per contract name, however long: the names are how the output is read.
        "COLUMNS": "1000",
        "NO_COLOR": "1",
    }
    command = [str(Path(sys.executable).parent / "lint-imports"), "--no-cache", "--no-logo", str(config)]
    done = subprocess.run(command, cwd=where, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    ids = {contract["name"]: contract["id"] for contract in contracts(config)}
    lines = output.splitlines()
    kept: dict[str, bool] = {}
    for line in lines:
        name, _, verdict = line.rpartition(" ")
        if name in ids and verdict in ("KEPT", "BROKEN"):
            kept[ids[name]] = verdict == "KEPT"
    reports: dict[str, str] = {}
    current: str | None = None
    for index, line in enumerate(lines):
        underline = lines[index + 1] if index + 1 < len(lines) else ""
        if line in ids and underline == "-" * len(line):
            current = ids[line]
            reports[current] = ""
        elif current is not None:
            reports[current] += line + "\n"
    return Lint(done.returncode, output, kept, reports)
