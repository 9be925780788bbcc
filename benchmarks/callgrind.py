"""Instructions counted by callgrind, for the benchmarks that count one piece of the request path
exactly (`tracing_instructions.py`, `apf_instructions.py`): the same script run as a child for N
and 2N iterations, so the difference of the two totals over N is one iteration's cost, start-up
and teardown cancelled out, the same on every run whatever else the machine does."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path


def instructions(script: str, *args: str) -> int:
    """Every instruction `python script args...` executes under callgrind."""
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, script, *args],
            check=True,
            capture_output=True,
        )
        match = re.search(r"^totals: (\d+)", out.read_text(errors="replace"), re.M)
        if match is None:
            raise RuntimeError(f"callgrind wrote no totals in {out}")
        return int(match.group(1))


def per_iteration(script: str, mode: str, iterations: int) -> float:
    """One iteration of `script --child mode --iterations N`: (total at 2N - total at N) / N."""
    n = iterations
    twice = instructions(script, "--child", mode, "--iterations", str(2 * n))
    once = instructions(script, "--child", mode, "--iterations", str(n))
    return (twice - once) / n


def per_mode(script: str, modes: tuple[str, ...], iterations: int) -> dict[str, float]:
    """`per_iteration` for each of a script's modes, in order, each printed as it is measured: the
    comparison a `--child MODE` benchmark makes (apf_instructions, tracing_instructions)."""
    width = max(len(mode) for mode in modes) + 1
    per: dict[str, float] = {}
    for mode in modes:
        per[mode] = per_iteration(script, mode, iterations)
        print(f"{mode:<{width}} {per[mode]:8.0f} instructions per request", flush=True)
    return per


def inclusive(dump: Path, functions: tuple[str, ...]) -> dict[str, int]:
    """Each function's inclusive instructions in a dump (`callgrind_annotate --inclusive=yes`): the
    largest of its entries (a recursive call's `name'2` and a C function's argument-clinic wrapper are
    entries within it)."""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(dump)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found = dict.fromkeys(functions, 0)
    for match in re.finditer(r"^\s*([\d,]+) \([^)]*\)\s+\S*:(\w+)\b", out, re.M):
        name = match.group(2)
        if name in found:
            found[name] = max(found[name], int(match.group(1).replace(",", "")))
    return found
