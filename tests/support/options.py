"""Gateway options for tests, named by their flags: `with_flags(options, request_timeout=0.5)` sets
what `--request-timeout` sets, with a value already converted (fractions where the flag takes an
integer are allowed). Each name is looked up in `aggregator serve`'s own parser, so the flag, its
options group and its field are named in one place only (`aggregator/config.py`)."""

from __future__ import annotations

import argparse
import functools
from typing import Any

from aggregator.config import KUBE_MODE_FLAGS, Options, add_serve_flags
from aggregator.util.flags import assign


@functools.cache
def _destinations() -> dict[str, str]:
    """`request_timeout` (the flag `--request-timeout`, as a keyword) -> `server.request_timeout`."""
    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    out: dict[str, str] = {}
    for action in parser._actions:
        for flag in action.option_strings:
            if flag.startswith("--"):
                out[flag[2:].replace("-", "_")] = action.dest
    out["verbosity"] = out["v"]
    return out


def with_flags(options: Options, **flags: Any) -> Options:
    """`options` with the given flags set (in place; returned for chaining). A kube-mode-only flag
    set here counts as given on the command line, as `options_from_args` records it."""
    destinations = _destinations()
    unknown = sorted(set(flags) - destinations.keys())
    if unknown:
        raise TypeError(f"no such flag of aggregator serve: {', '.join(unknown)}")
    values = {destinations[name]: value for name, value in flags.items()}
    assign(options, values)
    options.explicit_flags = options.explicit_flags | {dest for dest in values if dest in KUBE_MODE_FLAGS}
    return options


def flag_options(**flags: Any) -> Options:
    """Fresh options with the given flags set."""
    return with_flags(Options(), **flags)
