"""A worker of `--workers N` does not load what only the control process builds.

Every module a process imports stays resident for its life (its code, classes and the shared
libraries they map), and RSS counts it again in each worker. `assembly.build_gateway` imports
the availability checker and its probe, the status writers, discovery's fetcher and the kube
object source where a single or control process builds them (`_sources`, `_control`), so the
interpreter `python -m aggregator.runners.worker` starts never loads them. The other way round,
the control process (`aggregator serve` with --workers N > 1) never listens: it imports the
supervisor, not the single process's server, so neither aiohttp's server nor the HTTP/2 listener.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

from aggregator.runners.supervisor import WORKER_MODULE

# Built only by a single or control process (assembly._sources, _control, _control_checks,
# _status_sink), never by a worker, which follows the control's results through its Replica.
CONTROL_ONLY = (
    "aggregator.availability.checker",
    "aggregator.availability.probe",
    "aggregator.availability.ejections",
    "aggregator.availability.status",
    "aggregator.discovery.component",
    "aggregator.discovery.fetcher",
    "aggregator.sources.kube",
)


# What only a listening process needs (runners/server.py and what it imports).
SERVER_ONLY = (
    "aggregator.runners.server",
    "aggregator.web.http1.server",
    "aggregator.web.http2.listener",
    "aggregator.web.http2.nghttp2",
    "aiohttp.web",
)


def imported_by(*modules: str) -> set[str]:
    """The modules a fresh interpreter holds after importing `modules`, as a process's start does."""
    script = f"import json, sys, {', '.join(modules)}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    return set(json.loads(done.stdout))


def test_the_control_only_modules_exist() -> None:
    """A renamed module would make the test below pass for nothing."""
    for name in CONTROL_ONLY + SERVER_ONLY:
        assert importlib.util.find_spec(name) is not None, name


def test_a_worker_does_not_import_what_only_the_control_builds() -> None:
    loaded = imported_by(WORKER_MODULE)
    assert "aggregator.assembly" in loaded
    assert sorted(loaded.intersection(CONTROL_ONLY)) == []


def test_the_control_process_does_not_import_the_server() -> None:
    """`aggregator serve` imports the command line, which imports the supervisor (--workers N)."""
    loaded = imported_by("aggregator.commands.cli", "aggregator.runners.supervisor")
    assert "aggregator.assembly" in loaded
    assert sorted(loaded.intersection(SERVER_ONLY)) == []
