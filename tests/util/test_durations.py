"""Go's time.ParseDuration, as a request's `?timeout=` is read (cases from Go's time_test.go)."""

from __future__ import annotations

import pytest

from aggregator.util.durations import parse_go_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("5s", 5.0),
        ("30s", 30.0),
        ("1478s", 1478.0),
        ("-5s", -5.0),
        ("+5s", 5.0),
        ("-0", 0.0),
        ("5.0s", 5.0),
        ("5.6s", 5.6),
        ("5.s", 5.0),
        (".5s", 0.5),
        ("1.004s", 1.004),
        ("100.00100s", 100.001),
        ("10ns", 10e-9),
        ("11us", 11e-6),
        ("12µs", 12e-6),
        ("12μs", 12e-6),
        ("13ms", 0.013),
        ("14s", 14.0),
        ("15m", 900.0),
        ("16h", 57600.0),
        ("3h30m", 12600.0),
        ("10.5s4m", 250.5),
        ("-2m3.4s", -123.4),
        ("1h2m3s4ms5us6ns", 3723.004005006),
        ("39h9m14.425s", 140954.425),
        ("9223372036854775807ns", 9223372036.854775807),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds, abs=1e-9)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", 'time: invalid duration ""'),
        ("3", 'time: missing unit in duration "3"'),
        ("-", 'time: invalid duration "-"'),
        ("s", 'time: invalid duration "s"'),
        (".", 'time: invalid duration "."'),
        ("-.", 'time: invalid duration "-."'),
        (".s", 'time: invalid duration ".s"'),
        ("+.s", 'time: invalid duration "+.s"'),
        ("x", 'time: invalid duration "x"'),
        ("1d", 'time: unknown unit "d" in duration "1d"'),
        # a non-ASCII rune is written byte by byte (U+0085 is C2 85 in UTF-8)
        ("\u0085", 'time: invalid duration "\\xc2\\x85"'),
        ('"x', 'time: invalid duration "\\"x"'),
        ("9223372036854775808ns", 'time: invalid duration "9223372036854775808ns"'),
        ("9223372036854775.808us", 'time: invalid duration "9223372036854775.808us"'),
    ],
)
def test_go_duration_errors_are_worded_as_go(text: str, error: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_go_duration(text)
    assert str(raised.value) == error
