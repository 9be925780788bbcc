"""README.md and docs/: the README's first screen answers what, why, where and how; every link
resolves; the reference lists every flag `aggregator serve --help` prints.

The README's commands themselves run against a real demo in tests/e2e/test_newcomer.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
REFERENCE = REPO / "docs" / "reference.md"
# What a terminal or a browser shows before scrolling.
FIRST_SCREEN_LINES = 50


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {github_anchor(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_github_anchors_are_computed_as_github_does() -> None:
    assert github_anchor("Using every core: `--workers`") == "using-every-core---workers"
    assert github_anchor("6. Watch it: metrics, alerts and a dashboard") == (
        "6-watch-it-metrics-alerts-and-a-dashboard"
    )


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(path: Path) -> None:
    for link in links(path):
        if re.match(r"[a-z]+:", link):
            continue  # https:, mailto:
        target, _, fragment = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        assert file.exists(), f"{path.name}: {link} names a missing file"
        if fragment and file.suffix == ".md":
            assert fragment in anchors(file), f"{path.name}: {link} names a missing heading"


def test_the_first_screen_says_what_why_where_and_how() -> None:
    screen = "\n".join(README.read_text().splitlines()[:FIRST_SCREEN_LINES])
    assert "aggregation gateway" in screen.split("## ")[0]  # what, before any heading
    assert "## Why run it beside kube-apiserver's aggregator" in screen
    assert "## Where it sits" in screen and "kubectl --server" in screen
    assert "aggregator keeps running" in screen
    assert "make demo" in screen and "make test" in screen


def test_the_readme_names_exactly_two_make_commands() -> None:
    commands = set(re.findall(r"\bmake ([a-z][\w.-]*)", README.read_text()))
    assert commands == {"demo", "test"}


def test_every_doc_is_reachable_from_the_readme() -> None:
    named = {Path(link.partition("#")[0]).name for link in links(README)}
    assert {doc.name for doc in DOCS} <= named


def serve_flags() -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "aggregator", "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    return set(re.findall(r"^\s+(?:-\w [A-Z_]+, )?(--[a-z0-9-]+)", out, re.M)) - {"--help"}


def test_the_reference_lists_every_serve_flag() -> None:
    flags = serve_flags()
    assert {"--access-log", "--request-timeout", "--workers"} <= flags  # the help was read
    documented = set(re.findall(r"`(--[a-z0-9-]+)", REFERENCE.read_text()))
    assert flags - documented == set(), "flags missing from docs/reference.md"
