"""apimachinery's ObjectMeta encoding and HumanDuration, shared by the gateway and the sample server."""

from __future__ import annotations

import pytest

from aggregator.model.meta import human_duration, ordered_metadata


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (119, "119s"),
        (120, "2m"),
        (125, "2m5s"),
        (150, "2m30s"),
        (600, "10m"),
        (3 * 3600 - 1, "179m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 60, "3h1m"),
        (8 * 3600, "8h"),
        (47 * 3600, "47h"),
        (48 * 3600, "2d"),
        (49 * 3600, "2d1h"),
        (8 * 86400, "8d"),
        (10 * 86400, "10d"),
        (2 * 365 * 86400, "2y"),
        (2 * 365 * 86400 + 3 * 86400, "2y3d"),
        (800 * 86400, "2y70d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_human_duration(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text


def test_ordered_metadata_follows_go() -> None:
    meta = {
        "labels": {"b": "2", "a": "1"},
        "name": "x",
        "generation": 0,
        "deletionGracePeriodSeconds": 0,
        "annotations": {},
        "ownerReferences": [{"uid": "u", "kind": "K", "apiVersion": "v1", "name": "o"}],
        "uid": "1",
    }
    out = ordered_metadata(meta)
    assert list(out) == ["name", "uid", "deletionGracePeriodSeconds", "labels", "ownerReferences"]
    assert list(out["labels"]) == ["a", "b"]
    assert list(out["ownerReferences"][0]) == ["apiVersion", "kind", "name", "uid"]
