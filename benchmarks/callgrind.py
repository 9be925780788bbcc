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
