"""Per-APIService bounds and outlier thresholds, read from the APIService's annotations.

kube-aggregator has none of these (one transport for every APIService, kubernetes#73421 and
#83200 ask for them). They are annotations in the gateway's own domain (`aggregator.dev/`) so that
they work alike in kube mode and local mode, and an APIService without them is proxied exactly as
before. A value that does not parse is never fatal: the default is used, the problem is logged
and named in the APIService's Available condition message (`Bounds.problems`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aggregator.util.durations import parse_go_duration

PREFIX = "aggregator.dev/"
CONNECT_TIMEOUT = PREFIX + "connect-timeout"
RESPONSE_HEADER_TIMEOUT = PREFIX + "response-header-timeout"
REQUEST_TIMEOUT = PREFIX + "request-timeout"
LONG_RUNNING_PATHS = PREFIX + "long-running-paths"
MAX_CONCURRENT_REQUESTS = PREFIX + "max-concurrent-requests"
OUTLIER_CONSECUTIVE_ERRORS = PREFIX + "outlier-consecutive-errors"
OUTLIER_EJECTION_TIME = PREFIX + "outlier-ejection-time"
OUTLIER_MAX_EJECTION_TIME = PREFIX + "outlier-max-ejection-time"
# Not a bound of the proxy: how long the APIService may be unavailable before its group-version
# leaves discovery and OpenAPI (`availability/quarantine.py`). Read here with the others, so a bad
# value is named in the same problems.
DISCOVERY_QUARANTINE_AFTER = PREFIX + "discovery-quarantine-after"

DEFAULT_CONNECT_TIMEOUT = 5.0  # Go's dialer in upstream's proxy transport (and `backend.CONNECT_TIMEOUT`)
DEFAULT_CONSECUTIVE_ERRORS = 5
DEFAULT_EJECTION_TIME = 1.0
DEFAULT_MAX_EJECTION_TIME = 30.0

# Matches a request path: True when an extra long-running pattern covers it.
PathMatch = Callable[[str], bool]


@dataclass(frozen=True, slots=True)
class Bounds:
    """What bounds one APIService's proxied requests (None: no bound of that kind of its own)."""

    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    # From the request's start to the answer's head, every attempt included.
    response_header_timeout: float | None = None
    # Replaces --request-timeout for this APIService's requests that are not long-running.
    request_timeout: float | None = None
    long_running_paths: tuple[str, ...] = ()
    long_running: PathMatch | None = None
    max_concurrent_requests: int = 0  # 0: no limit
    consecutive_errors: int = DEFAULT_CONSECUTIVE_ERRORS  # 0: answers never eject
    ejection_time: float = DEFAULT_EJECTION_TIME
    max_ejection_time: float = DEFAULT_MAX_EJECTION_TIME
    # None: never left out of discovery, whatever its availability (the default, as upstream).
    discovery_quarantine_after: float | None = None
    # One line per annotation that was ignored, naming it and why.
    problems: tuple[str, ...] = ()


DEFAULT_BOUNDS = Bounds()


def _duration(text: str) -> float:
    try:
        seconds = parse_go_duration(text)
    except ValueError as err:
        raise ValueError(f"not a duration ({err})") from err
    if seconds <= 0:
        raise ValueError("must be above zero")
    return seconds


def _count(text: str) -> int:
    try:
        value = int(text.strip(), 10)
    except ValueError as err:
        raise ValueError("not an integer") from err
    if value < 0:
        raise ValueError("must not be negative")
    return value


def _patterns(text: str) -> tuple[str, ...]:
    patterns = tuple(p.strip() for p in text.split(",") if p.strip())
    if not patterns:
        raise ValueError("no pattern")
    for pattern in patterns:
        if not pattern.startswith("/"):
            raise ValueError(f"pattern {pattern!r} does not start with /")
    return patterns


def path_matcher(patterns: tuple[str, ...]) -> PathMatch:
    """One compiled regex for shell-style patterns (`*` also matches `/`) on the whole path."""
    match = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)).match
    return lambda path: match(path) is not None


# annotation -> (Bounds field, parser, the default as the problem message names it)
_READERS: dict[str, tuple[str, Callable[[str], object], str]] = {
    CONNECT_TIMEOUT: ("connect_timeout", _duration, f"{DEFAULT_CONNECT_TIMEOUT:g}s"),
    RESPONSE_HEADER_TIMEOUT: ("response_header_timeout", _duration, "none"),
    REQUEST_TIMEOUT: ("request_timeout", _duration, "--request-timeout"),
    LONG_RUNNING_PATHS: ("long_running_paths", _patterns, "none"),
    MAX_CONCURRENT_REQUESTS: ("max_concurrent_requests", _count, "no limit"),
    OUTLIER_CONSECUTIVE_ERRORS: ("consecutive_errors", _count, str(DEFAULT_CONSECUTIVE_ERRORS)),
    OUTLIER_EJECTION_TIME: ("ejection_time", _duration, f"{DEFAULT_EJECTION_TIME:g}s"),
    OUTLIER_MAX_EJECTION_TIME: ("max_ejection_time", _duration, f"{DEFAULT_MAX_EJECTION_TIME:g}s"),
    DISCOVERY_QUARANTINE_AFTER: ("discovery_quarantine_after", _duration, "no quarantine"),
}


def read_bounds(annotations: Iterable[tuple[str, str]]) -> Bounds:
    """The bounds the annotations set; an unknown or bad one is ignored and named in `problems`."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key, text in annotations:
        if not key.startswith(PREFIX):
            continue
        reader = _READERS.get(key)
        if reader is None:
            problems.append(f"annotation {key} is not one the gateway knows; ignored")
            continue
        attribute, parse, default = reader
        try:
            values[attribute] = parse(text)
        except ValueError as err:
            problems.append(f'annotation {key}="{text}" ignored: {err}; using the default ({default})')
    if not values and not problems:
        return DEFAULT_BOUNDS
    ejection = values.get("ejection_time", DEFAULT_EJECTION_TIME)
    if values.get("max_ejection_time", DEFAULT_MAX_EJECTION_TIME) < ejection:
        problems.append(
            f"annotation {OUTLIER_MAX_EJECTION_TIME} is below the ejection time; using {ejection:g}s"
        )
        values["max_ejection_time"] = ejection
    patterns = values.get("long_running_paths")
    if patterns:
        values["long_running"] = path_matcher(patterns)
    return Bounds(**values, problems=tuple(problems))
