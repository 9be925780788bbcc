"""`missing_attributes` names exactly what a class lacks, so an upgrade's failure says what moved."""

from __future__ import annotations

from aggregator.util.internals import missing_attributes


class Pinned:
    present = 1

    def _private(self) -> None: ...


def test_names_only_the_missing_attributes() -> None:
    wanted = [(Pinned, "present"), (Pinned, "_private"), (Pinned, "_moved"), (Pinned, "gone")]
    assert missing_attributes(wanted) == [
        f"{__name__}.Pinned._moved",
        f"{__name__}.Pinned.gone",
    ]


def test_nothing_missing_is_an_empty_list() -> None:
    assert missing_attributes([(Pinned, "present")]) == []
