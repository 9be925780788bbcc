"""Go's `net/url` unescaping (`wire/gourl.py`), which identity header keys and request paths go through."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aggregator.wire.gourl import path_unescape


def test_path_unescape_matches_go() -> None:
    assert path_unescape("example.com%2fteam") == "example.com/team"
    assert path_unescape("a+b") == "a+b"  # PathUnescape leaves '+' alone
    assert path_unescape("%E2%9C%93") == "✓"


@given(st.text(alphabet="abc%0123456789zZ", max_size=12))
def test_malformed_escapes_raise_and_good_ones_round_trip(text: str) -> None:
    import re

    malformed = re.search(r"%(?![0-9A-Fa-f]{2})", text) is not None
    try:
        path_unescape(text)
    except ValueError:
        assert malformed
    else:
        assert not malformed
